"""One recipe per image: what it is built from, what it holds, how it runs.

Each recipe writes an OCI image layout; `python -m ambient_images` (make
images) runs the ones asked for, in `RECIPES`' order.
The Windows agents copy what Istio's Windows experiment's Dockerfiles set
(istio/istio e245938e `pilot/docker/Dockerfile.ztunnel-windows` and
`cni/deployments/kubernetes/Dockerfile.install-cni-windows`): the file
places and the entrypoints, on the HostProcess base, with no working folder.
The Linux agents copy the pinned istio.io/istio's `Dockerfile.ztunnel` and
`Dockerfile.install-cni` on a Debian base with the same network tools.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ambient_images import bases, builds, oci, rootfs
from ambient_images.sources import Pin, fetch, file_sha256, read_lock
from ambient_operator.api import bundled
from ambient_operator.api import constants as c

REPO = Path(__file__).resolve().parents[3]
PROGRAMS = REPO / "hack" / "images" / "programs"
ISTIO_CNI_MODULE = REPO / "hack" / "cluster" / "istio-cni"
# The Linux agents' Istio release: that of the pinned istio.io/istio (api/constants).
LINUX_AGENT_TAG = c.ISTIO_VERSION
SAMPLE_APP_TAG = "0.1.0"
PAUSE_TAG = "3.10-ambient"


@dataclass
class Context:
    """What every recipe shares: the cache, the pins, the time stamp, the version."""

    store: Path
    epoch: int
    pins: dict[str, Pin]
    operator_version: str
    revision: str  # this repository's commit

    def annotations(
        self, *, source: str, revision: str, version: str, licenses: str, title: str
    ) -> dict[str, str]:
        """The OCI annotations every image carries."""
        return {
            "org.opencontainers.image.created": oci.rfc3339(self.epoch),
            "org.opencontainers.image.source": source,
            "org.opencontainers.image.revision": revision,
            "org.opencontainers.image.version": version,
            "org.opencontainers.image.licenses": licenses,
            "org.opencontainers.image.title": title,
            "io.ambientoperator.version": self.operator_version,
        }

    def own_source(self) -> str:
        """This repository's address, for the annotations of the images made from it."""
        if os.environ.get("AMBIENT_IMAGE_SOURCE"):
            return os.environ["AMBIENT_IMAGE_SOURCE"]
        done = subprocess.run(
            ["git", "-C", str(REPO), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip() or "ambient-operator (no git remote; set AMBIENT_IMAGE_SOURCE)"


@dataclass(frozen=True)
class Built:
    """A written layout: the image's name, tag and top descriptor."""

    name: str
    tag: str
    descriptor: oci.Descriptor
    stand_in: bool


def _layout(out: Path, name: str) -> oci.Layout:
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    return oci.Layout(dest)


def _finish(layout: oci.Layout, name: str, tag: str, top: oci.Descriptor, stand_in: bool) -> Built:
    named = top.with_(annotations={**(top.annotations or {}), oci.REF_NAME: tag})
    layout.finish([named])
    return Built(name, tag, top, stand_in)


def source_epoch(tree: Path) -> int:
    """The commit time of a pinned tree (git archive stamps every entry with it).

    Images of upstream sources take it as their SOURCE_DATE_EPOCH, so their
    digests do not move with this repository's commits.
    """
    return int(min(p.stat().st_mtime for p in tree.iterdir() if p.name != ".verified"))


def _windows_on_hostprocess(
    ctx: Context,
    out: Path,
    name: str,
    files: dict[str, Path],
    entrypoint: list[str],
    pin: Pin,
) -> Built:
    layout = _layout(out, name)
    base_dir, base_name, stand_in = bases.resolve("hostprocess", ctx.store, ctx.epoch)
    base = oci.load_base(layout, base_dir, base_name)
    layer = oci.LayerBuilder(windows=True)
    for dest, src in sorted(files.items()):
        layer.file(dest, src, 0o755)
    blob, diff_id = layer.build(ctx.epoch)
    annotations = ctx.annotations(
        source=f"https://github.com/{pin.repo}",
        revision=pin.commit,
        version=bundled.WINDOWS_AGENT_TAG,
        licenses="Apache-2.0",
        title=name,
    )
    annotations["io.ambientoperator.windows-experiment.istio"] = (
        f"github.com/{ctx.pins['istio-windows'].repo}@{ctx.pins['istio-windows'].commit}"
    )
    annotations["io.ambientoperator.windows-experiment.ztunnel"] = (
        f"github.com/{ctx.pins['ztunnel-windows'].repo}@{ctx.pins['ztunnel-windows'].commit}"
    )
    if stand_in:
        annotations[bases.STAND_IN_ANNOTATION] = f"built on a {base_name}"
    config = oci.ImageConfig(os="windows", entrypoint=entrypoint)
    added = ", ".join(sorted(files))
    top = oci.write_image(
        layout,
        config,
        [(blob, diff_id, f"COPY {added}")],
        epoch=ctx.epoch,
        annotations=annotations,
        base=base,
    )
    return _finish(layout, name, bundled.WINDOWS_AGENT_TAG, top, stand_in)


def _ztunnel_git_deps(ctx: Context, *, windows: bool) -> dict[str, tuple[str, Pin]]:
    """Cargo.lock's git dependencies of a ztunnel, by URL as Cargo.toml writes it.

    boring-rustls-provider is in both (optional, tls-boring, but cargo resolves
    it); the Windows branch adds hcn-rs.
    """
    deps = {
        "https://github.com/janrueth/boring-rustls-provider": (
            "boring-rustls-provider",
            ctx.pins["boring-rustls-provider"],
        ),
    }
    if windows:
        deps["https://github.com/keithmattix/hcn-rs.git"] = ("hcn", ctx.pins["hcn-rs"])
    return deps


def ztunnel_windows(ctx: Context, out: Path) -> Built:
    """ztunnel.exe of the experiment's ztunnel, cross-compiled with mingw-w64."""
    pin = ctx.pins["ztunnel-windows"]
    ctx = replace(ctx, epoch=source_epoch(fetch(pin, ctx.store)))
    exe = builds.cargo_ztunnel(
        ctx.store,
        name="ztunnel-windows",
        pin=pin,
        deps=_ztunnel_git_deps(ctx, windows=True),
        target="x86_64-pc-windows-gnu",
        version=bundled.WINDOWS_AGENT_TAG,
    )
    # Dockerfile.ztunnel-windows: COPY .../ztunnel.exe /ztunnel.exe, ENTRYPOINT ["ztunnel.exe"].
    return _windows_on_hostprocess(
        ctx, out, bundled.ZTUNNEL_WINDOWS, {"ztunnel.exe": exe}, ["ztunnel.exe"], pin
    )


def _istio_ldflags(version: str, revision: str) -> str:
    prefix = "-X istio.io/istio/pkg/version."
    return " ".join(
        (
            f"{prefix}buildVersion={version}",
            f"{prefix}buildGitRevision={revision}",
            f"{prefix}buildStatus=Clean",
            f"{prefix}buildTag={version}",
        )
    )


def install_cni_windows(ctx: Context, out: Path) -> Built:
    """install-cni.exe and istio-cni.exe of the experiment's istio, GOOS=windows."""
    pin = ctx.pins["istio-windows"]
    hcsshim = ctx.pins["hcsshim"]
    tree = fetch(pin, ctx.store)
    ctx = replace(ctx, epoch=source_epoch(tree))
    folder = builds.go_programs(
        ctx.store,
        name="install-cni-windows",
        module_dir=tree,
        packages=["./cni/cmd/install-cni", "./cni/cmd/istio-cni"],
        goos="windows",
        inputs=[pin.tree_sha256, hcsshim.tree_sha256],
        ldflags=_istio_ldflags(bundled.WINDOWS_AGENT_TAG, pin.commit),
        replace={"github.com/Microsoft/hcsshim": fetch(hcsshim, ctx.store)},
    )
    # Dockerfile.install-cni-windows: /install-cni.exe, /opt/cni/bin/istio-cni.exe,
    # ENTRYPOINT ["/install-cni.exe"].
    return _windows_on_hostprocess(
        ctx,
        out,
        bundled.INSTALL_CNI_WINDOWS,
        {
            "install-cni.exe": folder / "install-cni.exe",
            "opt/cni/bin/istio-cni.exe": folder / "istio-cni.exe",
        },
        ["/install-cni.exe"],
        pin,
    )


def redirection_wait(ctx: Context, out: Path) -> Built:
    """The webhook's default init-container image: one nanoserver entry per supported build.

    The init container runs `cmd.exe` with the wait script (webhook/decide.py),
    using cmd, findstr and ping, all in nanoserver; the image adds nothing to
    each build's nanoserver but its annotations, so each entry is that build's
    base with our metadata, under one index.
    """
    layout = _layout(out, bundled.REDIRECTION_WAIT)
    entries = []
    any_stand_in = False
    for build in c.SUPPORTED_WINDOWS_BUILDS:
        base_key = f"nanoserver-{c.WINDOWS_BUILD_TAGS[build]}"
        base_dir, base_name, stand_in = bases.resolve(base_key, ctx.store, ctx.epoch)
        any_stand_in |= stand_in
        base = oci.load_base(layout, base_dir, base_name)
        os_version = base.config.get("os.version")
        if not isinstance(os_version, str) or not os_version.startswith(build + "."):
            raise RuntimeError(
                f"{base_name}: os.version {os_version!r} is not of build {build}; "
                f"refusing to list it as {c.WINDOWS_BUILD_NAMES[build]}"
            )
        annotations = ctx.annotations(
            source=ctx.own_source(),
            revision=ctx.revision,
            version=ctx.operator_version,
            licenses="Apache-2.0",
            title=bundled.REDIRECTION_WAIT,
        )
        if stand_in:
            annotations[bases.STAND_IN_ANNOTATION] = f"built on a {base_name}"
        config = oci.ImageConfig(os="windows", os_version=os_version)
        manifest = oci.write_image(
            layout, config, [], epoch=ctx.epoch, annotations=annotations, base=base
        )
        entries.append(manifest.with_(platform=config.platform()))
    index_annotations = ctx.annotations(
        source=ctx.own_source(),
        revision=ctx.revision,
        version=ctx.operator_version,
        licenses="Apache-2.0",
        title=bundled.REDIRECTION_WAIT,
    )
    if any_stand_in:
        index_annotations[bases.STAND_IN_ANNOTATION] = "built on stand-in nanoserver bases"
    top = oci.write_index(layout, entries, annotations=index_annotations)
    return _finish(layout, bundled.REDIRECTION_WAIT, ctx.operator_version, top, any_stand_in)


# Where pip installs, and where Debian's python3 looks (its site.py).
_SITE = "usr/local/lib/python3.11/dist-packages"
_WHEEL_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
_LAUNCHER = (
    "#!/usr/bin/python3\n"
    "# ambient-operator's console script (pyproject's [project.scripts]), written by hack/images.\n"
    "import sys\n"
    "from ambient_operator.cli.main import main\n"
    "sys.exit(main())\n"
)


def _pip(*argv: str) -> None:
    builds.run(
        ["python3", "-m", "pip", "--disable-pip-version-check", *argv], cwd=REPO, env=os.environ
    )


def operator(ctx: Context, out: Path) -> Built:
    """The operator: Debian's python3 and exactly the wheels of requirements.lock, run as 65532.

    This is the operator image's one recipe (the Dockerfile it replaces needed
    Docker). Wheels are those pip picks for CPython 3.11 on manylinux x86_64
    from the lock, installed without their console scripts; the operator's own
    wheel is built from this tree. No pip, setuptools or wheel is installed.
    """
    lock = REPO / "requirements.lock"
    root = rootfs.debian(ctx.store, "python", ["python3"], epoch=ctx.epoch)
    wheels_key = builds.key(file_sha256(lock), *_WHEEL_PLATFORMS)
    wheels = ctx.store / "wheels" / wheels_key
    if not (wheels / ".complete").is_file():
        shutil.rmtree(wheels, ignore_errors=True)
        platforms = [f"--platform={p}" for p in _WHEEL_PLATFORMS]
        _pip(
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            *platforms,
            "--python-version=3.11",
            "--implementation=cp",
            "--abi=cp311",
            f"--dest={wheels}",
            f"--requirement={lock}",
        )
        (wheels / ".complete").write_text("")
    with tempfile.TemporaryDirectory(prefix="ambient-images-") as tmp:
        own = Path(tmp) / "own"
        _pip("wheel", "--quiet", "--no-deps", f"--wheel-dir={own}", str(REPO))
        target = Path(tmp) / "site"
        platforms = [f"--platform={p}" for p in _WHEEL_PLATFORMS]
        common = [
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--only-binary=:all:",
            *platforms,
            "--python-version=3.11",
            "--implementation=cp",
            "--abi=cp311",
            f"--target={target}",
        ]
        _pip(*common, f"--find-links={wheels}", f"--requirement={lock}")
        # By name from a folder, not by path: a path would be recorded in the
        # dist-info (direct_url.json), and the image would differ per build.
        _pip(*common, f"--find-links={own}", f"ambient-operator=={ctx.operator_version}")
        shutil.rmtree(target / "bin", ignore_errors=True)
        layout = _layout(out, bundled.OPERATOR)
        app = oci.LayerBuilder()
        app.tree(target, _SITE)
        app.file("usr/local/bin/ambient-operator", _LAUNCHER.encode(), 0o755)
        for name, line in (
            ("passwd", "operator:x:65532:65532:ambient-operator:/nonexistent:/usr/sbin/nologin\n"),
            ("group", "operator:x:65532:\n"),
        ):
            app.file(f"etc/{name}", (root.path / "etc" / name).read_bytes() + line.encode())
        layers = [
            (
                *root.layer(ctx.epoch),
                f"debian {rootfs.SUITE} essential + python3 (mmdebstrap)",
            ),
            (
                *app.build(ctx.epoch),
                "requirements.lock's wheels and ambient-operator's, user 65532",
            ),
        ]
    annotations = ctx.annotations(
        source=ctx.own_source(),
        revision=ctx.revision,
        version=ctx.operator_version,
        licenses="Apache-2.0",
        title=bundled.OPERATOR,
    )
    annotations["io.ambientoperator.debian-packages"] = str(root.package_count())
    config = oci.ImageConfig(
        os="linux",
        entrypoint=["ambient-operator"],
        cmd=["run"],
        user="65532:65532",
        working_dir="/",
        env=(
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
        ),
        labels={"org.opencontainers.image.version": ctx.operator_version},
    )
    top = oci.write_image(layout, config, layers, epoch=ctx.epoch, annotations=annotations)
    return _finish(layout, bundled.OPERATOR, ctx.operator_version, top, False)


_NET_PACKAGES = ["ca-certificates", "iproute2", "iptables", "nftables"]


def _linux_agent(
    ctx: Context,
    out: Path,
    name: str,
    files: dict[str, Path],
    config: oci.ImageConfig,
    *,
    source: str,
    revision: str,
) -> Built:
    root = rootfs.debian(ctx.store, "net", _NET_PACKAGES, epoch=ctx.epoch)
    layout = _layout(out, name)
    app = oci.LayerBuilder()
    for dest, src in sorted(files.items()):
        app.file(dest, src, 0o755)
    layers = [
        (
            *root.layer(ctx.epoch),
            f"debian {rootfs.SUITE} essential + {' '.join(_NET_PACKAGES)}",
        ),
        (*app.build(ctx.epoch), f"COPY {', '.join(sorted(files))}"),
    ]
    annotations = ctx.annotations(
        source=source, revision=revision, version=LINUX_AGENT_TAG, licenses="Apache-2.0", title=name
    )
    top = oci.write_image(layout, config, layers, epoch=ctx.epoch, annotations=annotations)
    return _finish(layout, name, LINUX_AGENT_TAG, top, False)


def ztunnel_linux(ctx: Context, out: Path) -> Built:
    """ztunnel for Linux at the commit Istio 1.31's istio.deps names."""
    pin = ctx.pins["ztunnel"]
    ctx = replace(ctx, epoch=source_epoch(fetch(pin, ctx.store)))
    exe = builds.cargo_ztunnel(
        ctx.store,
        name="ztunnel",
        pin=pin,
        deps=_ztunnel_git_deps(ctx, windows=False),
        target="x86_64-unknown-linux-gnu",
        version=LINUX_AGENT_TAG,
    )
    config = oci.ImageConfig(
        os="linux",
        entrypoint=["/usr/local/bin/ztunnel"],
        working_dir="/",
        env=(f"ISTIO_META_ISTIO_VERSION={LINUX_AGENT_TAG}",),
    )
    return _linux_agent(
        ctx,
        out,
        "ztunnel",
        {"usr/local/bin/ztunnel": exe},
        config,
        source=f"https://github.com/{pin.repo}",
        revision=pin.commit,
    )


def _istio_module_version() -> tuple[str, int]:
    """The pinned istio.io/istio's commit (first 12) and commit time, from its pseudo-version."""
    version = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Version}}", "istio.io/istio"],
        cwd=ISTIO_CNI_MODULE,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # v0.0.0-<yyyymmddhhmmss>-<commit's first 12>
    _, stamp, revision = version.rsplit("-", 2)
    when = datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=UTC)
    return revision, int(when.timestamp())


def install_cni_linux(ctx: Context, out: Path) -> Built:
    """install-cni and the istio-cni plugin from the pinned istio.io/istio module."""
    revision, epoch = _istio_module_version()
    ctx = replace(ctx, epoch=epoch)
    folder = builds.go_programs(
        ctx.store,
        name="install-cni",
        module_dir=ISTIO_CNI_MODULE,
        packages=["istio.io/istio/cni/cmd/install-cni", "istio.io/istio/cni/cmd/istio-cni"],
        goos="linux",
        inputs=[file_sha256(ISTIO_CNI_MODULE / "go.mod"), file_sha256(ISTIO_CNI_MODULE / "go.sum")],
        ldflags=_istio_ldflags(LINUX_AGENT_TAG, revision),
    )
    # Dockerfile.install-cni: the plugin in /opt/cni/bin, install-cni in /usr/local/bin,
    # no ENTRYPOINT (the DaemonSet names the command), WORKDIR /opt/cni/bin.
    config = oci.ImageConfig(
        os="linux",
        cmd=["/usr/local/bin/install-cni"],
        working_dir="/opt/cni/bin",
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cni/bin",),
    )
    return _linux_agent(
        ctx,
        out,
        "install-cni",
        {
            "usr/local/bin/install-cni": folder / "install-cni",
            "opt/cni/bin/istio-cni": folder / "istio-cni",
        },
        config,
        source="https://github.com/istio/istio",
        revision=revision,
    )


def _static_image(
    ctx: Context, out: Path, name: str, tag: str, exe: Path, path: str, config: oci.ImageConfig
) -> Built:
    layout = _layout(out, name)
    layer = oci.LayerBuilder()
    layer.file(path, exe, 0o755)
    annotations = ctx.annotations(
        source=ctx.own_source(),
        revision=ctx.revision,
        version=tag,
        licenses="Apache-2.0",
        title=name,
    )
    top = oci.write_image(
        layout,
        config,
        [(*layer.build(ctx.epoch), f"COPY {path}")],
        epoch=ctx.epoch,
        annotations=annotations,
    )
    return _finish(layout, name, tag, top, False)


def sample_app(ctx: Context, out: Path) -> Built:
    """The tests' and the demo's HTTP server and client (hack/images/programs/sample-app)."""
    module = PROGRAMS / "sample-app"
    folder = builds.go_programs(
        ctx.store,
        name="sample-app",
        module_dir=module,
        packages=["."],
        goos="linux",
        inputs=[file_sha256(module / "main.go"), file_sha256(module / "go.mod")],
    )
    config = oci.ImageConfig(
        os="linux", entrypoint=["/sample-app"], cmd=["serve"], user="65532:65532"
    )
    return _static_image(
        ctx, out, "sample-app", SAMPLE_APP_TAG, folder / "sample-app", "sample-app", config
    )


def pause(ctx: Context, out: Path) -> Built:
    """The pod sandbox image of the real node (hack/images/programs/pause), static."""
    source = PROGRAMS / "pause" / "pause.c"
    gcc = builds.tool_version("gcc", "--version").splitlines()[0]
    built = builds.Outputs(ctx.store, "pause", builds.key(file_sha256(source), gcc))
    if not built.ready():
        folder = built.begin()
        builds.run(
            [
                "gcc",
                "-static",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-ffile-prefix-map={PROGRAMS}=/programs",
                "-o",
                str(folder / "pause"),
                str(source),
            ],
            cwd=PROGRAMS,
            env=os.environ,
        )
        builds.run(["strip", str(folder / "pause")], cwd=PROGRAMS, env=os.environ)
        built.commit()
    config = oci.ImageConfig(os="linux", entrypoint=["/pause"], user="65535:65535")
    return _static_image(ctx, out, "pause", PAUSE_TAG, built.dir / "pause", "pause", config)


# Name -> recipe, in build order (quick ones first, so a failure shows early).
RECIPES: dict[str, Callable[[Context, Path], Built]] = {
    "pause": pause,
    "sample-app": sample_app,
    bundled.REDIRECTION_WAIT: redirection_wait,
    bundled.OPERATOR: operator,
    bundled.INSTALL_CNI_WINDOWS: install_cni_windows,
    "install-cni": install_cni_linux,
    bundled.ZTUNNEL_WINDOWS: ztunnel_windows,
    "ztunnel": ztunnel_linux,
}


def context(store: Path) -> Context:
    """The shared context of a build: pins, SOURCE_DATE_EPOCH, versions."""
    revision = (
        subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or "unknown"
    )
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or _commit_time())
    return Context(store, epoch, read_lock(), c.operator_version() or "0.0.0", revision)


def _commit_time() -> int:
    """The time of this repository's last commit: the default SOURCE_DATE_EPOCH."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(done.stdout.strip() or 0)


def describe(built: Built) -> str:
    """A line for the summary: name, tag, digest."""
    note = " (on stand-in bases)" if built.stand_in else ""
    return f"{built.name}:{built.tag} {built.descriptor.digest}{note}"


def read_record(out: Path) -> dict[str, dict[str, object]]:
    """What `record` wrote: name -> tag, digest, media type, whether on stand-ins."""
    path = out / "images.json"
    data: dict[str, dict[str, object]] = json.loads(path.read_text()) if path.is_file() else {}
    return data


def record(out: Path, built: list[Built]) -> None:
    """`images.json` beside the layouts: what was built, for push and for the tests."""
    rows = {
        b.name: {
            "tag": b.tag,
            "digest": b.descriptor.digest,
            "mediaType": b.descriptor.media_type,
            "standIn": b.stand_in,
        }
        for b in built
    }
    previous = (
        json.loads((out / "images.json").read_text()) if (out / "images.json").is_file() else {}
    )
    (out / "images.json").write_text(
        json.dumps({**previous, **rows}, indent=2, sort_keys=True) + "\n"
    )
