"""The images our Windows images sit on: pulled by digest, or stand-ins made here.

Microsoft publishes the HostProcess base and nanoserver only on
mcr.microsoft.com. On a connected machine a base is an input given by digest
(override one with `AMBIENT_BASE_<NAME>=<ref>@sha256:...`) and pulled with the
registry client. Where mcr.microsoft.com is out of reach (these machines, CI),
`AMBIENT_IMAGE_BASES=stand-in` makes stand-ins instead:

- `hostprocess`: built here as the equivalent of Microsoft's image (one layer:
  five registry-hive stubs under `Files/Windows/System32/config/`, which Windows
  Server 2025 validates when it unpacks a layer, and a notice). It is a stand-in
  all the same until it has run on a Windows node, and says so.
- `nanoserver-<tag>`: a layer holding only a notice, with the platform fields
  (os, architecture, os.version) of that build's nanoserver. It cannot run; it
  lets the assembly (index, platforms, configs) be built and checked.

Every stand-in says what it is in its annotations, and so does each image
built on one; `push` refuses to send those anywhere but a registry on loopback.
"""

from __future__ import annotations

import base64
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ambient_images import oci
from ambient_images.registry import Reference, pull_image

ENV_MODE = "AMBIENT_IMAGE_BASES"
STAND_IN = "stand-in"
# Set on a stand-in and on every image built on one.
STAND_IN_ANNOTATION = "io.ambientoperator.image.stand-in"


@dataclass(frozen=True)
class BaseSpec:
    """A base image: its pinned reference and the platform its stand-in copies."""

    name: str
    reference: str  # repository@sha256:...
    os_version: str | None  # the build's, for nanoserver; HostProcess images carry none
    about: str


BASES: dict[str, BaseSpec] = {
    "hostprocess": BaseSpec(
        "hostprocess",
        "mcr.microsoft.com/oss/kubernetes/windows-host-process-containers-base-image"
        "@sha256:b4c9637e032f667c52d1eccfa31ad8c63f1b035e8639f3f48a510536bf34032b",
        None,
        "windows-host-process-containers-base-image v1.0.0 (CC0)",
    ),
    "nanoserver-ltsc2022": BaseSpec(
        "nanoserver-ltsc2022",
        "mcr.microsoft.com/windows/nanoserver"
        "@sha256:580b7fa4040be7b47d79c25fb73e3d6da2e68f32b95d9d4dfb70bde33564fc4a",
        "10.0.20348",
        "nanoserver ltsc2022 (Windows Server 2022)",
    ),
    "nanoserver-ltsc2025": BaseSpec(
        "nanoserver-ltsc2025",
        "mcr.microsoft.com/windows/nanoserver"
        "@sha256:252ba371c2f50ae797d81ae9d87405b55119714817fead9f406218b556e3ddeb",
        "10.0.26100",
        "nanoserver ltsc2025 (Windows Server 2025)",
    ),
}


def stand_ins() -> bool:
    """Whether this build makes stand-ins instead of pulling the bases."""
    mode = os.environ.get(ENV_MODE, "pull")
    if mode not in ("pull", STAND_IN):
        raise ValueError(f"{ENV_MODE}={mode!r}: expected 'pull' or '{STAND_IN}'")
    return mode == STAND_IN


def _hive(name: str, epoch: int) -> bytes:
    """A minimal registry hive (regf): a header block and one bin holding an empty root key.

    Layout per the documented regf format: a 4 KiB base block ("regf", sequence
    numbers, version 1.5, root cell offset, the bins' size, the hive's name, and
    an XOR checksum of its first 508 bytes), then a 4 KiB "hbin" with a root key
    ("nk", flagged as the hive's root, no subkeys or values) pointing at one
    security cell ("sk") that refers to itself, and the rest a free cell.
    """
    filetime = (epoch + 11644473600) * 10_000_000  # Windows FILETIME of the epoch
    none = 0xFFFFFFFF
    key_name = name.encode()
    # A self-relative descriptor: owner and group Administrators, no DACL (oci.WINDOWS_SD).
    descriptor = base64.b64decode(oci.WINDOWS_SD)
    nk_offset, sk_offset = 0x20, 0x20 + 0x60  # cell offsets relative to the first bin
    nk = (
        struct.pack(
            "<2sHQ" + "I" * 15 + "HH",
            b"nk",
            0x2C,  # KEY_HIVE_ENTRY | KEY_NO_DELETE | KEY_COMP_NAME
            filetime,
            0,  # access bits
            none,  # parent
            0,  # subkeys
            0,  # volatile subkeys
            none,  # subkey list
            none,  # volatile subkey list
            0,  # values
            none,  # value list
            sk_offset,
            none,  # class name
            0,  # largest subkey name
            0,  # largest subkey class name
            0,  # largest value name
            0,  # largest value data
            0,  # work var
            len(key_name),
            0,  # class name length
        )
        + key_name
    )
    sk = struct.pack("<2sHIIII", b"sk", 0, sk_offset, sk_offset, 1, len(descriptor)) + descriptor

    def cell(data: bytes, size: int) -> bytes:
        return struct.pack("<i", -size) + data + b"\x00" * (size - 4 - len(data))

    cells = cell(nk, sk_offset - nk_offset) + cell(sk, 0x60)
    free = 0x1000 - 0x20 - len(cells)
    bin_header = struct.pack("<4sIIQQI", b"hbin", 0, 0x1000, 0, filetime, 0)
    hbin = bin_header + cells + struct.pack("<i", free) + b"\x00" * (free - 4)
    base = bytearray(0x1000)
    struct.pack_into(
        "<4sIIQIIIIIII", base, 0, b"regf", 1, 1, filetime, 1, 5, 0, 1, nk_offset, 0x1000, 1
    )
    file_name = name.encode("utf-16-le")[:64]
    base[0x30 : 0x30 + len(file_name)] = file_name
    checksum = 0
    for (word,) in struct.iter_unpack("<I", bytes(base[:0x1FC])):
        checksum ^= word
    checksum = {0: 1, none: none - 1}.get(checksum, checksum)
    struct.pack_into("<I", base, 0x1FC, checksum)
    return bytes(base) + hbin


_HOSTPROCESS_NOTICE = (
    "ambient-operator's equivalent of Microsoft's HostProcess container base image,\n"
    "made by hack/images without network access: registry-hive stubs for\n"
    "Windows/System32/config (DEFAULT, SAM, SECURITY, SOFTWARE, SYSTEM) and this notice.\n"
    "It is a stand-in until it has been run on a Windows node; build with the pinned\n"
    "base (AMBIENT_IMAGE_BASES=pull) for images you ship.\n"
)


def _stand_in(spec: BaseSpec, dest: Path, epoch: int) -> Path:
    layout = oci.Layout(dest)
    layer = oci.LayerBuilder(windows=True)
    if spec.name == "hostprocess":
        for hive in ("DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM"):
            layer.file(f"Windows/System32/config/{hive}", _hive(hive, epoch))
        layer.file("License.txt", _HOSTPROCESS_NOTICE.encode())
        config = oci.ImageConfig(os="windows", cmd=["c:\\windows\\system32\\cmd.exe"])
    else:
        notice = (
            f"A stand-in for {spec.about} ({spec.reference}), made by ambient-operator's\n"
            "hack/images where mcr.microsoft.com cannot be reached. It holds no Windows\n"
            "files and cannot run; it carries the platform fields of that build.\n"
        )
        layer.file("stand-in.txt", notice.encode())
        config = oci.ImageConfig(
            os="windows",
            os_version=f"{spec.os_version}.0",
            cmd=["c:\\windows\\system32\\cmd.exe"],
            user="ContainerUser",
        )
    blob, diff_id = layer.build(epoch)
    manifest = oci.write_image(
        layout,
        config,
        [(blob, diff_id, f"stand-in for {spec.about}")],
        epoch=epoch,
        annotations={
            STAND_IN_ANNOTATION: f"stand-in for {spec.reference}",
            "org.opencontainers.image.description": f"stand-in for {spec.about}",
        },
    )
    layout.finish([manifest])
    return dest


def resolve(name: str, store: Path, epoch: int) -> tuple[Path, str, bool]:
    """(OCI layout of the base, its name for annotations, whether it is a stand-in)."""
    spec = BASES[name]
    override = os.environ.get(f"AMBIENT_BASE_{name.upper().replace('-', '_')}")
    reference = override or spec.reference
    if stand_ins():
        dest = store / "bases" / f"stand-in-{name}-{epoch}"
        if not (dest / "index.json").is_file():
            _stand_in(spec, dest, epoch)
        return dest, f"stand-in for {reference}", True
    ref = Reference.parse(reference)
    dest = store / "bases" / (ref.digest or "").replace(":", "-")
    if not (dest / "index.json").is_file():
        pull_image(ref, dest, platform={"os": "windows", "architecture": "amd64"})
    return dest, reference, False
