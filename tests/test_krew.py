"""The krew manifest of `kubectl ambient` and its release archive (issue 34, item 2).

hack/gen_krew.py builds the archive (the launcher, plugins/krew/kubectl-ambient.in
with the version filled in) and writes plugins/krew/ambient.yaml from it.
Here: the committed manifest is the one a fresh build gives, its sha256 is
the archive's (hashed here), upstream's validate-krew-manifest accepts it,
the real krew (built from sigs.k8s.io/krew by hack/build-binaries.sh)
installs the plugin from the archive on each platform it names and refuses
an archive of another sha256, the real kubectl runs the installed plugin,
and the launcher's first use installs a package into a virtualenv of its own
(offline, from a wheel made here).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from conftest import BIN_DIR, REPO_ROOT, run_kubectl

MANIFEST = REPO_ROOT / "plugins" / "krew" / "ambient.yaml"
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
PLATFORMS = [("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")]


def _gen_krew() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_krew", REPO_ROOT / "hack" / "gen_krew.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive as `hack/gen_krew.py --check` builds it (and the manifest is current)."""
    missing = [
        b for b in ("krew", "validate-krew-manifest", "kubectl") if not (BIN_DIR / b).exists()
    ]
    if missing:
        pytest.fail(f"{missing} missing in {BIN_DIR}; run hack/build-binaries.sh")
    out = tmp_path_factory.mktemp("krew-archive")
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "gen_krew.py"), "--check", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, f"plugins/krew/ambient.yaml is stale: {done.stderr}"
    return out / f"kubectl-ambient-v{VERSION}.zip"


def test_the_manifest_names_the_archive_it_was_made_from(built: Path) -> None:
    plugin = yaml.safe_load(MANIFEST.read_text())
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert (plugin["kind"], plugin["metadata"]["name"]) == ("Plugin", "ambient")
    assert plugin["spec"]["version"] == f"v{VERSION}"
    (platform,) = plugin["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(built.read_bytes()).hexdigest()
    assert platform["uri"].endswith(f"/v{VERSION}/kubectl-ambient-v{VERSION}.zip")
    assert platform["bin"] == "kubectl-ambient"
    # The archive: the launcher alone, executable, the version filled in; and the same
    # bytes when built again.
    with zipfile.ZipFile(built) as zf:
        (info,) = zf.infolist()
        launcher = zf.read(info).decode()
    assert info.filename == "kubectl-ambient"
    assert (info.external_attr >> 16) & 0o777 == 0o755
    template = (REPO_ROOT / "plugins" / "krew" / "kubectl-ambient.in").read_text()
    assert launcher == template.replace("@VERSION@", VERSION)
    gen = _gen_krew()
    assert gen.archive(VERSION) == built.read_bytes()


def test_upstream_validates_the_manifest() -> None:
    done = subprocess.run(
        [str(BIN_DIR / "validate-krew-manifest"), "-manifest", str(MANIFEST), "-skip-install"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "structural validation OK" in done.stderr
    assert "no overlapping spec.platform[].selector" in done.stderr


def krew_install(
    root: Path, archive: Path, os_name: str, arch: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN_DIR / "krew"), "install", f"--manifest={MANIFEST}", f"--archive={archive}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "KREW_ROOT": str(root), "KREW_OS": os_name, "KREW_ARCH": arch},
    )


@pytest.mark.parametrize(("os_name", "arch"), PLATFORMS)
def test_krew_installs_the_plugin_from_the_archive(
    built: Path, tmp_path: Path, os_name: str, arch: str
) -> None:
    done = krew_install(tmp_path, built, os_name, arch)
    assert done.returncode == 0, done.stderr
    assert "Installed plugin: ambient" in done.stderr
    installed = tmp_path / "bin" / "kubectl-ambient"
    assert os.access(installed, os.X_OK)
    assert installed.resolve() == tmp_path / "store" / "ambient" / f"v{VERSION}" / "kubectl-ambient"


def test_krew_refuses_another_archive_and_another_platform(built: Path, tmp_path: Path) -> None:
    tampered = tmp_path / built.name
    tampered.write_bytes(built.read_bytes() + b"\n")
    done = krew_install(tmp_path / "root", tampered, "linux", "amd64")
    assert done.returncode != 0
    assert "checksum does not match" in done.stderr, done.stderr
    done = krew_install(tmp_path / "root", built, "windows", "amd64")
    assert done.returncode != 0
    assert 'plugin "ambient" does not offer installation for this platform' in done.stderr


def test_kubectl_runs_the_installed_plugin(built: Path, tmp_path: Path) -> None:
    """The krew-installed launcher, found by the real kubectl, runs the package's plugin.

    Its virtualenv is made beforehand (its bin/kubectl-ambient is this one's),
    so the launcher goes straight to it: nothing is installed.
    """
    assert krew_install(tmp_path / "krew", built, "linux", "amd64").returncode == 0
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "kubectl-ambient").symlink_to(Path(sys.executable).parent / "kubectl-ambient")
    args = ["waypoint", "generate", "-n", "shop", "--kubeconfig", str(tmp_path / "none.yaml")]
    done = run_kubectl(
        ["ambient", *args], tmp_path / "krew" / "bin", {"KUBECTL_AMBIENT_HOME": str(home)}
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # The same as the package's own command prints (literal in test_waypoint_cli.py).
    direct = subprocess.run(
        [str(Path(sys.executable).parent / "ambient-operator"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout == direct.stdout
    assert done.stdout.startswith("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def fake_wheel(folder: Path) -> Path:
    """A wheel whose `kubectl-ambient` prints its arguments: stands in for the package."""
    info = "kubectl_ambient_fake-1.0.dist-info"
    files = {
        "kubectl_ambient_fake.py": b"import sys\n\n\ndef main():\n"
        b"    print('fake', *sys.argv[1:])\n",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: kubectl-ambient-fake\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{info}/entry_points.txt": b"[console_scripts]\n"
        b"kubectl-ambient = kubectl_ambient_fake:main\n",
    }
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / "kubectl_ambient_fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_the_launchers_first_use_installs_into_its_own_virtualenv(
    built: Path, tmp_path: Path
) -> None:
    assert krew_install(tmp_path / "krew", built, "linux", "amd64").returncode == 0
    launcher = tmp_path / "krew" / "bin" / "kubectl-ambient"
    home = tmp_path / "home"
    env = {
        **os.environ,
        "KUBECTL_AMBIENT_HOME": str(home),
        "KUBECTL_AMBIENT_PYTHON": sys.executable,
        "KUBECTL_AMBIENT_PACKAGE": str(fake_wheel(tmp_path)),
        # Offline: the wheel has no dependencies to fetch.
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(launcher), "status", "-o", "json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env=env,
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert first.stdout == "fake status -o json\n"
    assert first.stderr.startswith(
        f"kubectl-ambient: first use: installing {env['KUBECTL_AMBIENT_PACKAGE']} into {home}\n"
    ), first.stderr
    assert (home / "pyvenv.cfg").is_file()
    second = run()
    assert (second.returncode, second.stdout, second.stderr) == (0, "fake status -o json\n", "")


def test_the_launcher_says_which_python_it_lacks(built: Path, tmp_path: Path) -> None:
    assert krew_install(tmp_path / "krew", built, "linux", "amd64").returncode == 0
    done = subprocess.run(
        [str(tmp_path / "krew" / "bin" / "kubectl-ambient"), "status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={
            **os.environ,
            "KUBECTL_AMBIENT_HOME": str(tmp_path / "home"),
            "KUBECTL_AMBIENT_PYTHON": "false",
        },
    )
    assert done.returncode == 1
    assert done.stderr == (
        "kubectl-ambient: needs Python 3.11 or later as false (set KUBECTL_AMBIENT_PYTHON)\n"
    )
    assert not (tmp_path / "home").exists()
