"""OCI image layouts written byte for byte the same from the same inputs.

Layers are tar files with sorted entries, owner 0:0, no user or group names,
and every time set to SOURCE_DATE_EPOCH; gzip carries no name and no time.
JSON documents are written with sorted keys and no spaces. So an image's digest
depends only on what goes into it (OCI image-layout and image-spec v1.1).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import stat
import struct
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYOUT_VERSION = "1.0.0"
# The annotation that names a manifest inside a layout's index.json.
REF_NAME = "org.opencontainers.image.ref.name"

JSONObject = dict[str, Any]


def canonical_json(obj: object) -> bytes:
    """JSON with sorted keys and no insignificant space: the bytes a digest is taken of."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_digest(data: bytes) -> str:
    """`sha256:<hex>` of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rfc3339(epoch: int) -> str:
    """A SOURCE_DATE_EPOCH as the `created` time of configs and annotations."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Descriptor:
    """An OCI descriptor: what a blob is, its digest and size, and optional platform."""

    media_type: str
    digest: str
    size: int
    platform: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None

    def to_json(self) -> JSONObject:
        """The descriptor as the image spec writes it."""
        out: JSONObject = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform:
            out["platform"] = dict(self.platform)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    def with_(
        self,
        *,
        platform: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Descriptor:
        """The same blob described with a platform or annotations."""
        return Descriptor(
            self.media_type,
            self.digest,
            self.size,
            platform if platform is not None else self.platform,
            annotations if annotations is not None else self.annotations,
        )


class Layout:
    """An OCI image layout folder: `oci-layout`, `blobs/sha256/`, and `index.json` at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        (root / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": LAYOUT_VERSION}))

    def put(self, data: bytes, media_type: str) -> Descriptor:
        """Store a blob (once) and describe it."""
        digest = sha256_digest(data)
        path = self.blobs / digest.removeprefix("sha256:")
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.rename(path)
        return Descriptor(media_type, digest, len(data))

    def put_json(self, obj: object, media_type: str) -> Descriptor:
        """Store a JSON document in canonical form."""
        return self.put(canonical_json(obj), media_type)

    def read(self, digest: str) -> bytes:
        """A stored blob's bytes."""
        return (self.blobs / digest.removeprefix("sha256:")).read_bytes()

    def read_json(self, digest: str) -> JSONObject:
        """A stored JSON blob."""
        data: JSONObject = json.loads(self.read(digest))
        return data

    def finish(self, manifests: Sequence[Descriptor]) -> Descriptor:
        """Write index.json naming the layout's images; returns its descriptor (for the record)."""
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [m.to_json() for m in manifests],
        }
        data = canonical_json(index)
        (self.root / "index.json").write_bytes(data)
        return Descriptor(MEDIA_INDEX, sha256_digest(data), len(data))


# A self-relative security descriptor, owner and group BUILTIN\Administrators
# (S-1-5-32-544), with no DACL: every Windows layer entry carries it, as layers
# made on Windows carry the one of each file. Laid out per MS-DTYP 2.4.6.
def _windows_security_descriptor() -> str:
    administrators = struct.pack("<BB6sII", 1, 2, b"\x00\x00\x00\x00\x00\x05", 32, 544)
    header = struct.pack("<BBHIIII", 1, 0, 0x8004, 20, 20 + len(administrators), 0, 0)
    return base64.b64encode(header + administrators + administrators).decode()


WINDOWS_SD = _windows_security_descriptor()
# FILE_ATTRIBUTE_DIRECTORY and FILE_ATTRIBUTE_ARCHIVE.
_WIN_DIR_ATTR, _WIN_FILE_ATTR = "16", "32"


@dataclass
class _Entry:
    kind: str  # "dir", "file", "symlink"
    mode: int
    data: bytes | Path | None = None
    target: str = ""


@dataclass
class LayerBuilder:
    """A layer's files, written as a reproducible tar.

    For Windows (`windows=True`) paths go under `Files/` beside an empty
    `Hives/`, and each entry carries the `MSWINDOWS.fileattr` and
    `MSWINDOWS.rawsd` pax records that Windows' layer import reads; symlinks
    are refused, as Windows layers made here would need reparse points.
    """

    windows: bool = False
    entries: dict[str, _Entry] = field(default_factory=dict)

    def _path(self, path: str) -> str:
        clean = str(PurePosixPath("/", path)).lstrip("/")
        if not clean or ".." in PurePosixPath(clean).parts:
            raise ValueError(f"bad path in a layer: {path!r}")
        return f"Files/{clean}" if self.windows else clean

    def _parents(self, path: str) -> None:
        for parent in reversed(PurePosixPath(path).parents):
            name = str(parent)
            if name != "." and name not in self.entries:
                self.entries[name] = _Entry("dir", 0o755)

    def dir(self, path: str, mode: int = 0o755) -> None:
        """A folder."""
        name = self._path(path)
        self._parents(name)
        self.entries[name] = _Entry("dir", mode)

    def file(self, path: str, data: bytes | Path, mode: int = 0o644) -> None:
        """A regular file, from bytes or read from a path when the layer is written."""
        name = self._path(path)
        self._parents(name)
        self.entries[name] = _Entry("file", mode, data)

    def symlink(self, path: str, target: str) -> None:
        """A symbolic link (Linux layers only)."""
        if self.windows:
            raise ValueError(f"symlink {path} in a Windows layer")
        name = self._path(path)
        self._parents(name)
        self.entries[name] = _Entry("symlink", 0o777, target=target)

    def tree(self, src: Path, dest: str = "") -> None:
        """Everything below `src`, at `dest`: folders, files (mode kept) and symlinks.

        Owners and times are not kept. Device nodes, sockets and pipes are
        refused: a root file system from a package tool may hold them, and an
        image must not.
        """
        for root, dirs, files in os.walk(src):
            dirs.sort()
            here = Path(root)
            for name in [*dirs, *sorted(files)]:
                path = here / name
                rel = str(PurePosixPath(dest, path.relative_to(src).as_posix()))
                info = path.lstat()
                perm = stat.S_IMODE(info.st_mode)
                if stat.S_ISLNK(info.st_mode):
                    self.symlink(rel, os.readlink(path))
                elif stat.S_ISDIR(info.st_mode):
                    self.dir(rel, perm)
                elif stat.S_ISREG(info.st_mode):
                    self.file(rel, path, perm)
                else:
                    raise ValueError(f"{path}: not a file, folder or symlink")
            # os.walk does not descend into symlinked folders; nothing to do.

    def build(self, epoch: int) -> tuple[bytes, str]:
        """The gzipped layer and its diff ID (sha256 of the uncompressed tar)."""
        raw = io.BytesIO()
        entries = dict(self.entries)
        if self.windows:
            entries.setdefault("Files", _Entry("dir", 0o755))
            entries.setdefault("Hives", _Entry("dir", 0o755))
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(entries):
                entry = entries[name]
                info = tarfile.TarInfo(name)
                info.mtime = epoch
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = entry.mode
                payload: bytes | None = None
                if entry.kind == "dir":
                    info.type = tarfile.DIRTYPE
                elif entry.kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = entry.target
                else:
                    payload = (
                        entry.data.read_bytes() if isinstance(entry.data, Path) else entry.data
                    )
                    assert payload is not None
                    info.size = len(payload)
                if self.windows:
                    attr = _WIN_DIR_ATTR if entry.kind == "dir" else _WIN_FILE_ATTR
                    info.pax_headers = {"MSWINDOWS.fileattr": attr, "MSWINDOWS.rawsd": WINDOWS_SD}
                tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
        data = raw.getvalue()
        return gzip.compress(data, compresslevel=6, mtime=0), sha256_digest(data)


@dataclass(frozen=True)
class Base:
    """An image to build on: its layers (already in the layout), diff IDs and config."""

    name: str  # reference with digest, or a stand-in's name
    manifest_digest: str
    layers: tuple[Descriptor, ...]
    config: JSONObject

    @property
    def diff_ids(self) -> list[str]:
        """The base's uncompressed layer digests, in order."""
        ids: list[str] = self.config["rootfs"]["diff_ids"]
        return ids


def load_base(layout: Layout, source: Path, name: str) -> Base:
    """Copy the single image of an OCI layout at `source` into `layout` as a base."""
    src = Layout.__new__(Layout)
    src.root, src.blobs = source, source / "blobs" / "sha256"
    index = json.loads((source / "index.json").read_bytes())
    (entry,) = index["manifests"]
    manifest = src.read_json(entry["digest"])
    config = src.read_json(manifest["config"]["digest"])
    layers = []
    for layer in manifest["layers"]:
        layers.append(layout.put(src.read(layer["digest"]), layer["mediaType"]))
    return Base(name, entry["digest"], tuple(layers), config)


@dataclass(frozen=True)
class ImageConfig:
    """What an image runs and where: the parts of the OCI config a recipe decides."""

    os: str
    architecture: str = "amd64"
    os_version: str | None = None
    entrypoint: Sequence[str] | None = None
    cmd: Sequence[str] | None = None
    user: str | None = None
    working_dir: str | None = None
    env: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def platform(self) -> dict[str, str]:
        """The platform object of an index entry."""
        out = {"os": self.os, "architecture": self.architecture}
        if self.os_version:
            out["os.version"] = self.os_version
        return out


def write_image(
    layout: Layout,
    config: ImageConfig,
    layers: Sequence[tuple[bytes, str, str]],
    *,
    epoch: int,
    annotations: Mapping[str, str],
    base: Base | None = None,
) -> Descriptor:
    """Store an image (config, layers, manifest) and return its manifest's descriptor.

    `layers` are (gzipped tar, diff ID, history line) on top of the base's. The
    base's config settings are kept unless the recipe sets them.
    """
    inherited: JSONObject = dict(base.config.get("config") or {}) if base else {}
    runtime: JSONObject = {k: v for k, v in inherited.items() if v not in (None, "", [], {})}
    if config.entrypoint is not None:
        runtime["Entrypoint"] = list(config.entrypoint)
        runtime.pop("Cmd", None)
    if config.cmd is not None:
        runtime["Cmd"] = list(config.cmd)
    if config.user is not None:
        runtime["User"] = config.user
    if config.working_dir is not None:
        runtime["WorkingDir"] = config.working_dir
    if config.env:
        runtime["Env"] = [*runtime.get("Env", []), *config.env]
    if config.labels:
        runtime["Labels"] = {**runtime.get("Labels", {}), **config.labels}
    created = rfc3339(epoch)
    history = list(base.config.get("history", [])) if base else []
    descriptors = list(base.layers) if base else []
    diff_ids = list(base.diff_ids) if base else []
    for blob, diff_id, line in layers:
        descriptors.append(layout.put(blob, MEDIA_LAYER))
        diff_ids.append(diff_id)
        history.append({"created": created, "created_by": line})
    document: JSONObject = {
        "created": created,
        "architecture": config.architecture,
        "os": config.os,
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    if config.os_version:
        document["os.version"] = config.os_version
    config_blob = layout.put_json(document, MEDIA_CONFIG)
    all_annotations = dict(annotations)
    if base is not None:
        all_annotations["org.opencontainers.image.base.name"] = base.name
        all_annotations["org.opencontainers.image.base.digest"] = base.manifest_digest
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_blob.to_json(),
        "layers": [d.to_json() for d in descriptors],
        "annotations": all_annotations,
    }
    return layout.put_json(manifest, MEDIA_MANIFEST)


def write_index(
    layout: Layout, entries: Sequence[Descriptor], *, annotations: Mapping[str, str]
) -> Descriptor:
    """Store an image index (a multi-platform image) over manifests with platforms."""
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [e.to_json() for e in entries],
        "annotations": dict(annotations),
    }
    return layout.put_json(index, MEDIA_INDEX)
