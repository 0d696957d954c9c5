"""Linux root file systems from Debian's packages, made with mmdebstrap, without Docker.

A root file system is named by its suite, architecture and package list, and
kept once made: later builds with the same list reuse it, so their images are
the same to the byte. The exact package versions it holds are recorded beside
it (`packages.txt`) and in the image's annotations, because the Debian mirror
moves on between point releases and a fresh machine may get newer ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ambient_images.builds import Outputs, key, log
from ambient_images.oci import LayerBuilder

SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Documentation, manuals and translations: nothing in an image reads them.
_DPKG_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)


@dataclass(frozen=True)
class RootFs:
    """A made root file system: its folder and the packages it holds."""

    path: Path
    packages: str  # `name version` lines

    def package_count(self) -> int:
        """How many packages it holds."""
        return len(self.packages.splitlines())

    def layer(self, epoch: int) -> tuple[bytes, str]:
        """The root file system as one layer (gzipped tar, diff ID), made once per epoch.

        It is most of an image's bytes and all of its assembly time, and the
        same for every build from this root and epoch.
        """
        blob, diff = (
            self.path.parent / f"layer-{epoch}.tar.gz",
            self.path.parent / f"layer-{epoch}.diffid",
        )
        if not diff.is_file():
            builder = LayerBuilder()
            builder.tree(self.path)
            data, diff_id = builder.build(epoch)
            blob.write_bytes(data)
            diff.write_text(diff_id)
        return blob.read_bytes(), diff.read_text()


def debian(
    store: Path, name: str, packages: Sequence[str], *, arch: str = "amd64", epoch: int
) -> RootFs:
    """A Debian root file system (variant essential, plus `packages`), made once per list."""
    out = Outputs(store, f"rootfs-{name}-{arch}", key(SUITE, arch, *sorted(packages), *MIRRORS))
    if not out.ready():
        build = out.begin()
        root = build / "root"
        argv = [
            "mmdebstrap",
            "--variant=essential",
            f"--architectures={arch}",
            f"--include={','.join(sorted(packages))}",
            "--format=directory",
            *(f"--dpkgopt={opt}" for opt in _DPKG_EXCLUDES),
            SUITE,
            str(root),
            *MIRRORS,
        ]
        log(f"making the {name} root file system ({arch}) with mmdebstrap")
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
        done = subprocess.run(argv, env=env, check=False, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-4000:]}")
        listing = subprocess.run(
            ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f=${Package} ${Version}\n"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (build / "packages.txt").write_text(listing)
        # Caches and logs of the package tools: nothing at run time reads them,
        # and they differ from one making to the next.
        # /dev too: in a folder, mmdebstrap makes device nodes, which the runtime
        # provides in a container and an image must not hold.
        for junk in ("dev", "var/cache/apt", "var/lib/apt/lists", "var/log", "var/cache/debconf"):
            target = root / junk
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
        out.commit()
    return RootFs(out.dir / "root", (out.dir / "packages.txt").read_text())
