"""The programs inside the images, compiled from verified sources, each cached per pin.

A build's output folder is named after a digest of everything it is made from:
the pinned trees, the toolchain's version, the flags and this recipe's own
revision. A change of any of them gives a new folder and a rebuild; the same
inputs reuse the folder. Every build is reproducible: paths are remapped to
fixed names (`--remap-path-prefix`, `-trimpath`, `-ffile-prefix-map`), PE
timestamps are left out, and the version stamps come from the pins, not from
a clock or a git checkout.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ambient_images.sources import Pin, fetch

# Bumped when a recipe below changes in a way its inputs do not show.
RECIPE_REVISION = "2"

# Debian packages the builds need (the toolchains themselves are on the machine).
APT_PACKAGES = ("mingw-w64", "protobuf-compiler", "cmake", "nasm", "mmdebstrap")
# The lock apt's callers take turns on (hack/build-binaries.sh's apt_need takes it too).
APT_LOCK = Path("/run/lock/ambient-operator-apt.lock")


def log(message: str) -> None:
    """Progress for the person running `make images`, on stderr."""
    print(f"images: {message}", file=sys.stderr, flush=True)


def ensure_packages(packages: Sequence[str] = APT_PACKAGES) -> None:
    """Install the Debian packages a build needs, once; a no-op when all are there."""
    missing = [
        p
        for p in packages
        if subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True, check=False
        ).stdout.strip()
        != "install ok installed"
    ]
    if not missing:
        return
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # `make test` runs hack/build-binaries.sh beside this build, and it may
    # install packages too: both take turns on this lock rather than failing on dpkg's.
    with APT_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def tool_version(*argv: str) -> str:
    """A toolchain's own version line, part of every cache key it builds for."""
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def key(*parts: str) -> str:
    """A short digest of a build's inputs."""
    return hashlib.sha256("\0".join((RECIPE_REVISION, *parts)).encode()).hexdigest()[:16]


def run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
    """Run a build step, its output going to the terminal; a failure names the step."""
    log(f"$ {' '.join(argv)}  (in {cwd})")
    done = subprocess.run(list(argv), cwd=cwd, env=dict(env), check=False)
    if done.returncode:
        raise RuntimeError(f"build step failed ({done.returncode}): {' '.join(argv)} in {cwd}")


class Outputs:
    """A cached build's output folder: complete once marked, replaced whole when rebuilt."""

    def __init__(self, store: Path, name: str, digest: str) -> None:
        self.dir = store / "build" / f"{name}-{digest}"
        self._tmp = self.dir.with_name(self.dir.name + ".tmp")

    def ready(self) -> bool:
        """Whether this exact build already ran to the end."""
        return (self.dir / ".complete").is_file()

    def begin(self) -> Path:
        """A fresh folder to build into."""
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp.mkdir(parents=True)
        return self._tmp

    def commit(self) -> Path:
        """Mark the build complete and put it in place."""
        (self._tmp / ".complete").write_text("")
        shutil.rmtree(self.dir, ignore_errors=True)
        self._tmp.rename(self.dir)
        return self.dir


def _git_shim(store: Path) -> Path:
    """A `git` that answers Istio's build-info script from the pin, not from a checkout.

    ztunnel's build.rs runs common/scripts/report_build_info.sh, which asks git
    for the revision, the tree's state and a describe tag. An archive has no git
    metadata, so without this the binary says `unknown`; the answers come from
    AMBIENT_BUILD_REVISION and AMBIENT_BUILD_VERSION, set from the pin.
    """
    folder = store / "shims"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "git"
    script = (
        "#!/bin/sh\n"
        "# Answers report_build_info.sh for a pinned archive (ambient_images.builds).\n"
        'case "$1" in\n'
        '  rev-parse) echo "$AMBIENT_BUILD_REVISION" ;;\n'
        "  status) ;;\n"
        "  diff-index) exit 0 ;;\n"
        '  describe) echo "$AMBIENT_BUILD_VERSION" ;;\n'
        "  *) echo \"git shim: '$1' is not answered\" >&2; exit 1 ;;\n"
        "esac\n"
    )
    if not shim.is_file() or shim.read_text() != script:
        shim.write_text(script)
        shim.chmod(0o755)
    return folder


def cargo_ztunnel(
    store: Path,
    *,
    name: str,
    pin: Pin,
    deps: Mapping[str, tuple[str, Pin]],
    target: str,
    version: str,
) -> Path:
    """ztunnel built with cargo for `target` from a pinned tree; returns the binary's path.

    Cargo.lock's git dependencies (hcn-rs, boring-rustls-provider) are patched
    to their verified trees, since cargo would fetch them from GitHub; every
    other crate comes from crates.io as Cargo.lock pins it. `deps` maps the
    dependency's git URL, as Cargo.toml writes it, to (crate name, pin).
    """
    exe = "ztunnel.exe" if "windows" in target else "ztunnel"
    rustc = tool_version("rustc", "--version")
    out = Outputs(
        store,
        name,
        key(
            pin.tree_sha256, *(deps[u][1].tree_sha256 for u in sorted(deps)), target, version, rustc
        ),
    )
    if out.ready():
        return out.dir / exe
    src = fetch(pin, store)
    patches = []
    for url, (crate, dep) in sorted(deps.items()):
        tree = fetch(dep, store)
        crate_dir = tree / crate if (tree / crate / "Cargo.toml").is_file() else tree
        patches += ["--config", f'patch."{url}".{crate}.path="{crate_dir}"']
    # Cargo rewrites Cargo.lock for the patched entries: build in a copy of the tree
    # (hard links; only Cargo.lock is replaced) so the verified tree stays as pinned.
    work = store / "work" / f"{name}-{pin.commit[:12]}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work, copy_function=os.link)
    lock = work / "Cargo.lock"
    lock.unlink()
    shutil.copyfile(src / "Cargo.lock", lock)
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    sources_root = store / "sources"
    target_dir = store / "cargo-target" / "ztunnel"
    # The target folder too: ztunnel includes the Rust its build script generates
    # there (OUT_DIR), and those files' paths reach the binary.
    mapped = {
        work: "/ztunnel",
        sources_root: "/sources",
        cargo_home: "/cargo",
        target_dir: "/target",
    }
    remap = [f"--remap-path-prefix={path}={name}" for path, name in mapped.items()]
    c_map = " ".join(f"-ffile-prefix-map={path}={name}" for path, name in mapped.items())
    triple = target.upper().replace("-", "_")
    env = {
        **os.environ,
        "PATH": f"{_git_shim(store)}:{os.environ['PATH']}",
        "AMBIENT_BUILD_REVISION": pin.commit,
        "AMBIENT_BUILD_VERSION": version,
        "VERSION": version,
        "SOURCE_DATE_EPOCH": "0",
        # One target folder for every ztunnel build, kept across pins: the host's
        # build scripts and proc macros are compiled once for both targets, and
        # a pin change rebuilds only what changed. The output folder is what is keyed.
        "CARGO_TARGET_DIR": str(target_dir),
    }
    if "windows" in target:
        flags = [*remap, "-C", "link-arg=-Wl,--no-insert-timestamp"]
        env[f"CARGO_TARGET_{triple}_LINKER"] = "x86_64-w64-mingw32-gcc"
        env[f"CFLAGS_{target.replace('-', '_')}"] = c_map
        env[f"CXXFLAGS_{target.replace('-', '_')}"] = c_map
    else:
        # Upstream's .cargo/config.toml sets these for Linux; RUSTFLAGS and CFLAGS
        # from the environment replace its values, so they are repeated here.
        flags = [*remap, "-C", "force-frame-pointers"]
        frame = "-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"
        env["CFLAGS"] = f"{frame} {c_map}"
        env["CXXFLAGS"] = f"{frame} {c_map}"
    env["CARGO_ENCODED_RUSTFLAGS"] = "\x1f".join(flags)
    build_dir = out.begin()
    run(["cargo", "build", "--release", "--target", target, *patches], cwd=work, env=env)
    shutil.copy2(target_dir / target / "release" / exe, build_dir / exe)
    shutil.rmtree(work, ignore_errors=True)
    return out.commit() / exe


def go_programs(
    store: Path,
    *,
    name: str,
    module_dir: Path,
    packages: Sequence[str],
    goos: str,
    inputs: Sequence[str],
    ldflags: str = "",
    replace: Mapping[str, Path] | None = None,
) -> Path:
    """Go packages built for `goos`/amd64 from a module folder; returns the output folder.

    `inputs` names what the module folder holds (tree digests, go.mod and go.sum
    digests) for the cache key. With `replace`, the build runs in a copy whose
    go.mod replaces those modules with verified trees.
    """
    gover = tool_version("go", "env", "GOVERSION")
    # The trees' folder names (source digests), not their paths: the same in any store.
    trees = sorted(f"{module}={tree.name}" for module, tree in (replace or {}).items())
    out = Outputs(store, name, key(*inputs, *packages, goos, ldflags, gover, *trees))
    if out.ready():
        return out.dir
    work = module_dir
    if replace:
        work = store / "work" / name
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(module_dir, work, copy_function=os.link)
        for f in ("go.mod", "go.sum"):
            (work / f).unlink()
            shutil.copyfile(module_dir / f, work / f)
    env = {
        **os.environ,
        "GOOS": goos,
        "GOARCH": "amd64",
        "CGO_ENABLED": "0",
        # The replaced modules may need go.sum lines the pinned go.sum lacks.
        "GOFLAGS": "-mod=mod" if replace else os.environ.get("GOFLAGS", ""),
    }
    for module, tree in sorted((replace or {}).items()):
        # Relative, as Go's build info keeps a replacement's path as go.mod writes
        # it (-trimpath leaves it): the binary then names no folder of this store.
        relative = os.path.relpath(tree, work)
        if not relative.startswith("../"):
            relative = f"./{relative}"
        run(["go", "mod", "edit", f"-replace={module}={relative}"], cwd=work, env=env)
    build_dir = out.begin()
    run(
        [
            "go",
            "build",
            "-trimpath",
            "-buildvcs=false",
            f"-ldflags=-s -w -buildid= {ldflags}".strip(),
            "-o",
            f"{build_dir}/",
            *packages,
        ],
        cwd=work,
        env=env,
    )
    if replace:
        shutil.rmtree(work, ignore_errors=True)
    return out.commit()
