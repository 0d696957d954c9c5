"""The bundled images `make images` writes (issue 41), read without our build code.

Each layout under `.cache/images/<name>/` is read here with plain JSON, tar
and gzip, and checked against literal expectations taken from Istio's
Windows experiment's Dockerfiles, the pinned commits, the Windows build
numbers and requirements.lock. Windows executables are checked by their PE
headers, Linux ones by their ELF headers. Two builds must give the same
digests; a push to a real registry on loopback (distribution, built from its
module) is read back by crane, a client we did not write; a source changed
by one byte is refused by name.

`make test` builds the images first (with stand-in Windows bases: this
machine cannot reach mcr.microsoft.com), so a missing layout is a failure
with the command to run, never a skip.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
import tarfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.versions import parse_version, skew_problem
from ambient_operator.render.values import redirection_wait_image
from conftest import BIN_DIR, REPO_ROOT, images_built, wait_for

OUT = REPO_ROOT / ".cache" / "images"
NAMES = (
    "ambient-operator",
    "install-cni",
    "install-cni-windows",
    "pause",
    "redirection-wait",
    "sample-app",
    "ztunnel",
    "ztunnel-windows",
)
ZTUNNEL_WINDOWS_COMMIT = "c4094652e6ef5924132ae006622abbfc3c8ec324"
ISTIO_WINDOWS_COMMIT = "e245938ea6097d077c0eacd2f466c79935615909"
ZTUNNEL_LINUX_COMMIT = "e94018b3005032317a46c4f169007bf6fee7a710"
WINDOWS_AGENT_TAG = "1.30-exp.e245938e.c4094652"
OPERATOR_VERSION = "0.1.0"  # pyproject.toml
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(autouse=True, scope="module")
def _images_built() -> None:
    """Every test here reads the layouts or builds from the same caches."""
    images_built()


def _layout_dir(name: str) -> Path:
    path = OUT / name
    assert (path / "index.json").is_file(), (
        f"{path} holds no OCI layout: run `make images` (make test does it first)"
    )
    return path


def blob(name: str, digest: str) -> bytes:
    """A blob of a layout, checked against its digest."""
    algorithm, _, hexdigest = digest.partition(":")
    assert algorithm == "sha256"
    data = (_layout_dir(name) / "blobs" / "sha256" / hexdigest).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"{name}: blob {digest} is corrupt"
    return data


def doc(name: str, digest: str) -> dict[str, Any]:
    """A JSON blob of a layout."""
    data: dict[str, Any] = json.loads(blob(name, digest))
    return data


def top(name: str) -> dict[str, Any]:
    """The single descriptor of a layout's index.json."""
    index = json.loads((_layout_dir(name) / "index.json").read_bytes())
    assert index["schemaVersion"] == 2
    (entry,) = index["manifests"]
    entry_: dict[str, Any] = entry
    return entry_


def image(name: str, manifest_digest: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, config) of a single-platform image, or of one entry of an index."""
    manifest = doc(name, manifest_digest or top(name)["digest"])
    assert manifest["mediaType"] == MANIFEST
    return manifest, doc(name, manifest["config"]["digest"])


def files(name: str, manifest: dict[str, Any]) -> dict[str, tuple[int, bytes]]:
    """Every regular file of an image's layers (later layers win): path -> (mode, content)."""
    out: dict[str, tuple[int, bytes]] = {}
    config = doc(name, manifest["config"]["digest"])
    for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        raw = gzip.decompress(blob(name, layer["digest"]))
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == diff_id, f"{name}: diff_id"
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for member in tar:
                assert member.uid == 0 and member.gid == 0, f"{name}: {member.name} owner"
                if member.isfile():
                    stream = tar.extractfile(member)
                    assert stream is not None
                    out[member.name] = (member.mode, stream.read())
    return out


def is_pe32plus_x86_64(data: bytes) -> bool:
    """PE/COFF: 'MZ', 'PE\\0\\0' at e_lfanew, Machine 0x8664, optional header magic 0x20b."""
    if data[:2] != b"MZ":
        return False
    (offset,) = struct.unpack_from("<I", data, 0x3C)
    if data[offset : offset + 4] != b"PE\x00\x00":
        return False
    (machine,) = struct.unpack_from("<H", data, offset + 4)
    (magic,) = struct.unpack_from("<H", data, offset + 24)
    return machine == 0x8664 and magic == 0x20B


def is_elf_x86_64(data: bytes) -> bool:
    """ELF, 64-bit, little-endian, e_machine EM_X86_64 (62)."""
    return data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1 and data[18:20] == b"\x3e\x00"


def test_every_image_is_an_oci_layout() -> None:
    assert sorted(p.name for p in OUT.iterdir() if p.is_dir()) == sorted(NAMES)
    for name in NAMES:
        layout = _layout_dir(name)
        assert json.loads((layout / "oci-layout").read_bytes()) == {"imageLayoutVersion": "1.0.0"}
        checked = 0
        for path in (layout / "blobs" / "sha256").iterdir():
            assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name, path
            checked += 1
        assert checked >= 3, f"{name}: a config, a manifest and a layer at least"
        assert "org.opencontainers.image.ref.name" in top(name)["annotations"]


# name -> (os, tag, Entrypoint, Cmd, User, WorkingDir, executables and their kind)
EXPECTED: dict[str, tuple[str, str, Any, Any, Any, Any, dict[str, str]]] = {
    "ztunnel-windows": (
        "windows",
        WINDOWS_AGENT_TAG,
        ["ztunnel.exe"],
        None,
        None,
        None,
        {"Files/ztunnel.exe": "pe"},
    ),
    "install-cni-windows": (
        "windows",
        WINDOWS_AGENT_TAG,
        ["/install-cni.exe"],
        None,
        None,
        None,
        {"Files/install-cni.exe": "pe", "Files/opt/cni/bin/istio-cni.exe": "pe"},
    ),
    "ambient-operator": (
        "linux",
        OPERATOR_VERSION,
        ["ambient-operator"],
        ["run"],
        "65532:65532",
        "/",
        {"usr/bin/python3.11": "elf"},
    ),
    "ztunnel": (
        "linux",
        "1.31.0",
        ["/usr/local/bin/ztunnel"],
        None,
        None,
        "/",
        {"usr/local/bin/ztunnel": "elf", "usr/sbin/xtables-nft-multi": "elf"},
    ),
    "install-cni": (
        "linux",
        "1.31.0",
        None,
        ["/usr/local/bin/install-cni"],
        None,
        "/opt/cni/bin",
        {
            "usr/local/bin/install-cni": "elf",
            "opt/cni/bin/istio-cni": "elf",
            "usr/sbin/xtables-nft-multi": "elf",
            "usr/sbin/nft": "elf",
        },
    ),
    "sample-app": (
        "linux",
        "0.1.0",
        ["/sample-app"],
        ["serve"],
        "65532:65532",
        None,
        {"sample-app": "elf"},
    ),
    "pause": ("linux", "3.10-ambient", ["/pause"], None, "65535:65535", None, {"pause": "elf"}),
}


def _machine_folders() -> list[str]:
    """The folders a build here reads from or writes into, by how the tools find them."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    store = os.environ.get("AMBIENT_BIN_CACHE") or f"{cache}/ambient-operator"
    cargo = os.environ.get("CARGO_HOME") or str(Path.home() / ".cargo")
    return [store, cargo, str(REPO_ROOT)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_executables_name_no_folder_of_the_machine_that_built_them(name: str) -> None:
    # Two machines (or two build stores) give the same digests only if no path of
    # theirs reaches a program: ztunnel's generated protobuf code and the Windows
    # install-cni's replaced modules did, before their paths were remapped.
    found = files(name, image(name)[0])
    folders = _machine_folders()
    for path in EXPECTED[name][6]:
        data = found[path][1]
        named = [f for f in folders if f.encode() in data]
        assert not named, f"{name}: {path} names {named}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_platform_entrypoint_user_and_executables(name: str) -> None:
    os_, tag, entrypoint, cmd, user, workdir, executables = EXPECTED[name]
    entry = top(name)
    assert entry["mediaType"] == MANIFEST
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == tag
    manifest, config = image(name)
    assert (config["os"], config["architecture"]) == (os_, "amd64")
    # HostProcess images run on every build: no os.version (the base's README asks
    # for no platform pinning); Linux images have none either.
    assert "os.version" not in config
    runtime = config["config"]
    assert runtime.get("Entrypoint") == entrypoint
    assert runtime.get("Cmd") == cmd
    assert runtime.get("User") == user
    assert runtime.get("WorkingDir") == workdir
    found = files(name, manifest)
    for path, kind in executables.items():
        assert path in found, f"{name}: {path} missing"
        mode, data = found[path]
        assert mode & 0o111, f"{name}: {path} is not executable"
        check = is_pe32plus_x86_64 if kind == "pe" else is_elf_x86_64
        assert check(data), f"{name}: {path} is not {kind} x86-64"
    if os_ == "windows":
        # Every executable of a Windows layer, not only the expected ones.
        exes = [p for p in found if p.lower().endswith(".exe")]
        assert sorted(exes) == sorted(executables)
        assert all(p.startswith(("Files/", "Hives/")) for p in found)


def test_redirection_wait_has_one_entry_per_supported_windows_build() -> None:
    entry = top("redirection-wait")
    assert entry["mediaType"] == INDEX
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == OPERATOR_VERSION
    index = doc("redirection-wait", entry["digest"])
    platforms = []
    for child in index["manifests"]:
        platform = child["platform"]
        _, config = image("redirection-wait", child["digest"])
        assert config["os.version"] == platform["os.version"]
        assert (config["os"], config["architecture"]) == ("windows", "amd64")
        # cmd.exe runs the wait script (webhook/decide.py); nanoserver's default.
        assert config["config"]["Cmd"] == ["c:\\windows\\system32\\cmd.exe"]
        platforms.append((platform["os"], platform["architecture"], platform["os.version"]))
    builds = sorted((o, a, v.rsplit(".", 1)[0]) for o, a, v in platforms)
    # Windows Server 2022 and 2025: the builds the operator supports.
    assert builds == [("windows", "amd64", "10.0.20348"), ("windows", "amd64", "10.0.26100")]


def _git_head() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.parametrize(
    ("name", "source", "revision", "version"),
    [
        (
            "ztunnel-windows",
            "https://github.com/istio/ztunnel",
            ZTUNNEL_WINDOWS_COMMIT,
            WINDOWS_AGENT_TAG,
        ),
        (
            "install-cni-windows",
            "https://github.com/istio/istio",
            ISTIO_WINDOWS_COMMIT,
            WINDOWS_AGENT_TAG,
        ),
        ("ztunnel", "https://github.com/istio/ztunnel", ZTUNNEL_LINUX_COMMIT, "1.31.0"),
        ("install-cni", "https://github.com/istio/istio", "eed52ebb66ad", "1.31.0"),
        ("ambient-operator", None, "HEAD", OPERATOR_VERSION),
        ("redirection-wait", None, "HEAD", OPERATOR_VERSION),
    ],
)
def test_annotations(name: str, source: str | None, revision: str, version: str) -> None:
    entry = top(name)
    document = doc(name, entry["digest"])
    annotations = document["annotations"]
    expected_revision = _git_head() if revision == "HEAD" else revision
    assert annotations["org.opencontainers.image.revision"] == expected_revision
    assert annotations["org.opencontainers.image.version"] == version
    assert annotations["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert annotations["io.ambientoperator.version"] == OPERATOR_VERSION
    if source is not None:
        assert annotations["org.opencontainers.image.source"] == source
    else:
        assert annotations["org.opencontainers.image.source"]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("-", "_").replace(".", "_")] = version
    return pins


def test_operator_image_holds_exactly_the_locked_wheels_and_no_pip() -> None:
    manifest, _ = image("ambient-operator")
    found = files("ambient-operator", manifest)
    site = "usr/local/lib/python3.11/dist-packages/"
    versions = {}
    for path, (_, data) in found.items():
        if path.startswith(site) and path.endswith(".dist-info/METADATA"):
            fields = dict(
                line.split(": ", 1) for line in data.decode().splitlines()[:3] if ": " in line
            )
            versions[fields["Name"].lower().replace("-", "_").replace(".", "_")] = fields["Version"]
    assert versions == {**_lock(), "ambient_operator": OPERATOR_VERSION}
    # No installer at run time, anywhere in the image.
    assert not [p for p in found if "/pip/" in p or p.endswith("/pip") or "/setuptools/" in p]
    assert found["usr/local/bin/ambient-operator"][0] & 0o111
    assert b"operator:x:65532:65532:" in found["etc/passwd"][1]


def _make_images(out: Path, only: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ambient_images", "--only", only, "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record: dict[str, Any] = json.loads((out / "images.json").read_text())
    return record


def _bases_env() -> dict[str, str]:
    record = json.loads((OUT / "images.json").read_text())
    return {"AMBIENT_IMAGE_BASES": "stand-in" if record["redirection-wait"]["standIn"] else "pull"}


def test_two_builds_give_the_same_digests(tmp_path: Path) -> None:
    first = json.loads((OUT / "images.json").read_text())
    # From nothing: caches of its own (ours and Go's), so pause, sample-app and
    # the stand-in bases are compiled and made again, and every layer is written again.
    again = _make_images(
        tmp_path / "out",
        "pause,sample-app,redirection-wait",
        AMBIENT_BIN_CACHE=str(tmp_path / "cache"),
        GOCACHE=str(tmp_path / "go-build"),
        **_bases_env(),
    )
    # The operator from the shared cache (its Debian root and wheels): the
    # assembly, pip's install of the wheels included, again.
    again |= _make_images(tmp_path / "out2", "ambient-operator", **_bases_env())
    names = ["ambient-operator", "pause", "redirection-wait", "sample-app"]
    assert {n: again[n]["digest"] for n in names} == {n: first[n]["digest"] for n in names}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve_registry(tmp_path: Path, auth: str = "") -> Iterator[str]:
    """distribution's registry on loopback, storing in tmp_path; yields host:port."""
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {tmp_path / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n" + auth
    )
    log = (tmp_path / "registry.log").open("w")
    process = subprocess.Popen(
        [str(BIN_DIR / "registry"), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                assert process.poll() is None, (tmp_path / "registry.log").read_text()
                return False

        wait_for(up, timeout=30, message="registry listening")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """An open registry on loopback."""
    yield from _serve_registry(tmp_path)


def test_push_uses_the_docker_configs_credentials(tmp_path: Path) -> None:
    """A registry that asks for a password (htpasswd, bcrypt): the push takes it from the
    Docker config's `auths`, as crane does; without it the push fails and says why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # bcrypt through libxcrypt; deprecated, still in 3.11

    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"ci:{crypt.crypt('s3cret', crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
    auth = f"auth: {{htpasswd: {{realm: ambient, path: {htpasswd}}}}}\n"
    serving = _serve_registry(tmp_path, auth)
    host = next(serving)
    try:
        record = json.loads((OUT / "images.json").read_text())
        push = [
            sys.executable,
            "-m",
            "ambient_images",
            "push",
            "--only",
            "pause",
            "--registry",
            f"{host}/private",
        ]
        empty = tmp_path / "no-config"
        empty.mkdir()
        refused = subprocess.run(
            push,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            env={**os.environ, "DOCKER_CONFIG": str(empty)},
        )
        assert refused.returncode != 0
        assert f"{host} asks for a password and the Docker config has none" in refused.stderr
        config = tmp_path / "docker"
        config.mkdir()
        token = base64.b64encode(b"ci:s3cret").decode()
        (config / "config.json").write_text(json.dumps({"auths": {host: {"auth": token}}}))
        env = {**os.environ, "DOCKER_CONFIG": str(config)}
        done = subprocess.run(
            push, capture_output=True, text=True, check=False, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        read = subprocess.run(
            [str(BIN_DIR / "crane"), "digest", f"{host}/private/pause:{record['pause']['tag']}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            env=env,
        )
        assert read.returncode == 0, read.stderr
        assert read.stdout.strip() == record["pause"]["digest"]
    finally:
        serving.close()


def _crane(*args: str) -> str:
    done = subprocess.run(
        [str(BIN_DIR / "crane"), *args], capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _page_commands() -> list[str]:
    """The shell lines of docs/images.md's ```sh blocks, in order."""
    text = (REPO_ROOT / "docs" / "images.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_images_page_builds_pushes_and_reads_back_with_crane(registry: str) -> None:
    """Every command of docs/images.md, as the page writes it, against a registry on loopback."""
    commands = _page_commands()
    assert commands == [
        "make images",
        "make images REGISTRY=registry.example.com/ambient",
        f"crane digest registry.example.com/ambient/ztunnel-windows:{WINDOWS_AGENT_TAG}",
        f"crane manifest registry.example.com/ambient/redirection-wait:{OPERATOR_VERSION}",
    ]
    outputs = []
    for command in commands:
        argv = shlex.split(command.replace("registry.example.com", registry))
        if argv[0] == "make":
            argv = ["make", "-C", str(REPO_ROOT), *argv[1:]]
        else:
            argv[0] = str(BIN_DIR / argv[0])
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, **_bases_env()},
            check=False,
            timeout=1800,
        )
        assert done.returncode == 0, f"{command}: {done.stderr[-3000:]}"
        outputs.append(done.stdout.strip())
    record = json.loads((OUT / "images.json").read_text())
    assert outputs[2] == record["ztunnel-windows"]["digest"] == top("ztunnel-windows")["digest"]
    index = json.loads(outputs[3])
    assert sorted(m["platform"]["os.version"].rsplit(".", 1)[0] for m in index["manifests"]) == [
        "10.0.20348",
        "10.0.26100",
    ]
    ours = doc("redirection-wait", top("redirection-wait")["digest"])
    assert [m["digest"] for m in index["manifests"]] == [m["digest"] for m in ours["manifests"]]
    # Every image, as crane reads it back, is the layout's.
    prefix = f"{registry}/ambient"
    assert sorted(_crane("catalog", registry).split()) == sorted(f"ambient/{n}" for n in NAMES)
    for name in NAMES:
        ref = f"{prefix}/{name}:{record[name]['tag']}"
        assert _crane("digest", ref) == record[name]["digest"] == top(name)["digest"], name
    config = json.loads(_crane("config", f"{prefix}/ambient-operator:{OPERATOR_VERSION}"))
    assert config["config"]["User"] == "65532:65532"


def test_images_on_stand_in_bases_are_pushed_to_loopback_only() -> None:
    record = json.loads((OUT / "images.json").read_text())
    if not record["ztunnel-windows"]["standIn"]:
        pytest.fail("this check needs the images built on stand-ins (make test builds them so)")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambient_images",
            "push",
            "--only",
            "ztunnel-windows",
            "--registry",
            "registry.example.com/ambient",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 4
    assert "not pushing ztunnel-windows: it is built on stand-in bases" in done.stderr


def _tampered_copy(archive: Path, dest: Path) -> None:
    """The archive with one byte of its first regular file's content changed."""
    changed = False
    with tarfile.open(archive, "r:gz") as src, tarfile.open(dest, "w:gz") as out:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if data and not changed:
                data = bytes([data[0] ^ 1]) + data[1:]
                changed = True
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    assert changed


def _build_install_cni_windows(
    tmp_path: Path, env: dict[str, str], cache: Path
) -> subprocess.CompletedProcess[str]:
    """`make images ONLY=install-cni-windows` into tmp_path/out with a cache of its own."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ambient_images",
            "--only",
            "install-cni-windows",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env={**env, "AMBIENT_BIN_CACHE": str(cache)},
        check=False,
        timeout=600,
    )


def test_a_source_changed_by_one_byte_is_refused(tmp_path: Path) -> None:
    shared = Path(os.environ.get("AMBIENT_SOURCES") or REPO_ROOT.parent / "shared" / "sources")
    sources = tmp_path / "sources"
    sources.mkdir()
    for archive in shared.glob("*.tar.gz"):
        if archive.name.startswith("keithmattix-hcsshim-"):
            _tampered_copy(archive, sources / archive.name)
        else:
            (sources / archive.name).symlink_to(archive)
    done = _build_install_cni_windows(
        tmp_path, {**os.environ, "AMBIENT_SOURCES": str(sources)}, tmp_path / "cache"
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert (
        "refused: source hcsshim (github.com/keithmattix/hcsshim@"
        "d0d85c7482690e32e007b55c5b62f0beb221cdcd): archive" in done.stderr
    )
    assert not (tmp_path / "out" / "install-cni-windows" / "index.json").exists()


def test_a_downloaded_source_is_checked_by_its_content(tmp_path: Path) -> None:
    """Without AMBIENT_SOURCES a source comes from GitHub, whose tarball bytes may change;
    its tree digest is what is checked. A download already in the cache whose content
    differs by one byte is refused, without a network request."""
    shared = Path(os.environ.get("AMBIENT_SOURCES") or REPO_ROOT.parent / "shared" / "sources")
    name = "keithmattix-hcsshim-d0d85c7482690e32e007b55c5b62f0beb221cdcd.tar.gz"
    cache = tmp_path / "cache"
    downloads = cache / "images" / "downloads"
    downloads.mkdir(parents=True)
    _tampered_copy(shared / name, downloads / name)
    # istio's archive verifies; hcsshim's tampered download does not.
    (
        downloads
        / name.replace(
            "keithmattix-hcsshim-d0d85c7482690e32e007b55c5b62f0beb221cdcd",
            f"istio-istio-{ISTIO_WINDOWS_COMMIT}",
        )
    ).symlink_to(shared / f"istio-istio-{ISTIO_WINDOWS_COMMIT}.tar.gz")
    env = {k: v for k, v in os.environ.items() if k != "AMBIENT_SOURCES"}
    done = _build_install_cni_windows(tmp_path, env, cache)
    assert done.returncode == 3, done.stderr[-2000:]
    assert (
        "refused: source hcsshim (github.com/keithmattix/hcsshim@"
        "d0d85c7482690e32e007b55c5b62f0beb221cdcd): its content (tree digest" in done.stderr
    )
    assert (
        "differs from the pin (86167822426a471d09bc6d84d6ac8e269c9c291deefba6561d33ccb89d7e2e92)"
        in done.stderr
    )


def test_the_windows_pair_is_read_as_the_1_30_line_by_the_skew_check() -> None:
    """docs/images.md: istiod 1.30 and 1.31 are within the rule for the pair, 1.32 is not."""
    pair = parse_version(WINDOWS_AGENT_TAG)
    assert pair is not None
    assert skew_problem(parse_version("1.30.3"), pair) is None
    assert skew_problem(parse_version("1.31.0"), pair) is None
    problem = skew_problem(parse_version("1.32.0"), pair)
    assert problem is not None
    assert problem.startswith("istiod 1.32.0 is 2 minors ahead of the agents'")


def test_the_webhooks_default_names_the_redirection_wait_index_make_images_pushes() -> None:
    """With a registry, the webhook's multi-build image is exactly `<registry>/<name>:<tag>`
    of the index in the layout, which `make images REGISTRY=<registry>` pushes."""
    spec = AmbientMeshSpec.model_validate({"images": {"registry": "registry.example.com/ambient"}})
    tag = top("redirection-wait")["annotations"]["org.opencontainers.image.ref.name"]
    assert redirection_wait_image(spec) == f"registry.example.com/ambient/redirection-wait:{tag}"
    assert tag == OPERATOR_VERSION
