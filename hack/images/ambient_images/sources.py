"""Sources no registry serves, pinned by commit and verified by content before any build.

Each pin in `hack/images/sources.lock` names a GitHub repository, a commit, the
sha256 of the `git archive` of that commit (the form `../shared/sources/` keeps)
and the sha256 of its *tree*: every file's path, executable bit and content,
and every symlink's target. The tree digest is what a build trusts. It is the
same for the archive in `AMBIENT_SOURCES` and for GitHub's own tarball of the
commit, whose bytes GitHub does not promise to keep stable. A source whose tree
differs from its pin by one byte is refused by name, and nothing is built from it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "sources.lock"
# Where a build takes the archives from instead of GitHub (.ci/run sets it).
ENV_SOURCES = "AMBIENT_SOURCES"


class SourceRefusedError(Exception):
    """A source is missing or differs from its pin; the message names it."""


@dataclass(frozen=True)
class Pin:
    """One pinned source: where it lives upstream and what its content must be."""

    name: str
    repo: str  # owner/name on GitHub
    commit: str
    archive_sha256: str
    tree_sha256: str
    # Paths (globs, relative to the tree's root) the archive leaves out, so the
    # tree digest skips them wherever the tree comes from.
    excluded: tuple[str, ...] = ()

    @property
    def archive_name(self) -> str:
        """The archive's file name: `<owner>-<repo>-<commit>.tar.gz`, as the MANIFEST names it."""
        return f"{self.repo.replace('/', '-')}-{self.commit}.tar.gz"

    @property
    def url(self) -> str:
        """GitHub's tarball of the commit, for a connected machine."""
        return f"https://codeload.github.com/{self.repo}/tar.gz/{self.commit}"

    def describe(self) -> str:
        """The pin as a person reads it: `name (github.com/owner/repo@commit)`."""
        return f"{self.name} (github.com/{self.repo}@{self.commit})"


def read_lock(path: Path = LOCK) -> dict[str, Pin]:
    """The pins, by name. Lines: name repo commit archive-sha256 tree-sha256 [excluded,...]."""
    pins: dict[str, Pin] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) not in (5, 6):
            raise ValueError(f"{path}:{number}: expected 5 or 6 fields, got {len(fields)}")
        excluded = tuple(fields[5].split(",")) if len(fields) == 6 else ()
        pin = Pin(fields[0], fields[1], fields[2], fields[3], fields[4], excluded)
        if pin.name in pins:
            raise ValueError(f"{path}:{number}: {pin.name} is pinned twice")
        pins[pin.name] = pin
    return pins


def _strip_root(name: str) -> str:
    """A member's path below the archive's single top folder (`<owner>-<repo>-<commit>/`)."""
    return name.split("/", 1)[1] if "/" in name else ""


def tree_digest(archive: Path, excluded: tuple[str, ...] = ()) -> str:
    """sha256 over the sorted files and symlinks of a source archive, below its top folder.

    A line per entry: `F <path> <x|-> <sha256 of content>` or `L <path> <target>`.
    Folders carry nothing a build reads, and pax headers differ between archivers.
    """
    lines: list[str] = []
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            path = _strip_root(member.name)
            if not path or any(fnmatch.fnmatchcase(path, g) for g in excluded):
                continue
            if member.issym():
                lines.append(f"L {path} {member.linkname}")
            elif member.isfile():
                stream = tar.extractfile(member)
                assert stream is not None
                content = hashlib.sha256(stream.read()).hexdigest()
                lines.append(f"F {path} {'x' if member.mode & 0o111 else '-'} {content}")
    lines.sort()
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _archive(pin: Pin, downloads: Path) -> Path:
    """The archive of a pin: from AMBIENT_SOURCES when set, else downloaded from GitHub once."""
    local = os.environ.get(ENV_SOURCES)
    if local:
        path = Path(local) / pin.archive_name
        if not path.is_file():
            raise SourceRefusedError(
                f"source {pin.describe()}: {path} does not exist ({ENV_SOURCES}={local}); "
                "unset it to fetch from GitHub"
            )
        got = file_sha256(path)
        if got != pin.archive_sha256:
            raise SourceRefusedError(
                f"source {pin.describe()}: archive {path} has sha256 {got}, the pin says "
                f"{pin.archive_sha256}; refusing to build from it"
            )
        return path
    path = downloads / pin.archive_name
    if not path.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        try:
            with urllib.request.urlopen(pin.url, timeout=120) as response, part.open("wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as err:
            raise SourceRefusedError(
                f"source {pin.describe()}: cannot fetch {pin.url}: {err}; on a machine without "
                f"GitHub, set {ENV_SOURCES} to a folder holding {pin.archive_name}"
            ) from err
        part.rename(path)
    return path


def fetch(pin: Pin, store: Path) -> Path:
    """The verified, unpacked tree of a pin under `store`; refuses a tree that is not the pin's.

    The unpacked tree is kept once verified (marked `.verified`), so later builds
    of the same pin neither unpack nor hash again.
    """
    dest = store / "sources" / f"{pin.repo.replace('/', '-')}-{pin.commit}"
    if (dest / ".verified").is_file():
        return dest
    archive = _archive(pin, store / "downloads")
    got = tree_digest(archive, pin.excluded)
    if got != pin.tree_sha256:
        raise SourceRefusedError(
            f"source {pin.describe()}: its content (tree digest {got}) differs from the pin "
            f"({pin.tree_sha256}); refusing to build from {archive}"
        )
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(archive, "r:*") as tar:
        members = []
        for member in tar:
            path = _strip_root(member.name)
            if not path:
                continue
            member.name = path
            members.append(member)
        tar.extractall(tmp, members=members, filter="tar")
    (tmp / ".verified").write_text(pin.tree_sha256 + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
