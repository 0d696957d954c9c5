"""``python -m ambient_devcluster up|down|status``.

``up`` starts a detached daemon that owns a :class:`LocalCluster` (its
components die with it) and, with ``--real-node``, a :class:`RealNode` beside
it, then creates the fake nodes and applies CRDs, and prints
``export KUBECONFIG=...`` as the last line on stdout. ``down`` stops the
daemon, waits until every component process is gone, and sweeps what a real
node left behind when its daemon could not stop it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from .launcher import (
    ClusterError,
    LocalCluster,
    api_client_for,
    repo_root,
    wait_processes_gone,
)
from .manifests import ManifestError, apply_dirs
from .nodes import create_nodes
from .process import find_processes, pid_alive, tail
from .realnode import RealNode, RealNodeError, sweep_previous

PID_FILE = "daemon.pid"
STATE_FILE = "state.json"
DAEMON_LOG = "daemon.log"
CLUSTER_SUBDIR = "cluster"


def _err(message: str) -> None:
    print(f"devcluster: {message}", file=sys.stderr, flush=True)


def _daemon_pid(state_dir: Path) -> int | None:
    """Pid of a live daemon for ``state_dir``, ignoring stale or reused pids."""
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    if "ambient_devcluster" not in cmdline or str(state_dir) not in cmdline:
        return None
    return pid


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _default_crd_dirs() -> list[Path]:
    root = repo_root()
    candidates = [root / "crds", root / ".cache" / "gateway-api" / "v1.6"]
    return [d for d in candidates if d.is_dir()]


# ----------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the cluster in the foreground until SIGTERM/SIGINT (the daemon body)."""
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(state_dir / PID_FILE, f"{os.getpid()}\n")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    # Installed before LocalCluster so it keeps ours instead of adding its own.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    cluster = LocalCluster(
        state_dir / CLUSTER_SUBDIR, bin_dir=args.bin_dir, start_timeout=args.timeout
    )
    try:
        with cluster, contextlib.ExitStack() as stack:
            node = stack.enter_context(RealNode(cluster)) if args.real_node else None
            state = cluster.describe()
            if node is not None:
                state["real_node"] = node.describe()
            _write_atomic(state_dir / STATE_FILE, json.dumps(state, indent=2))
            while not stop.wait(1.0):
                # A component that dies on its own takes the cluster down with
                # it: a half-working cluster is worse than a clear failure.
                dead = cluster.exited_components()
                if node is not None:
                    dead |= {f"node {k}": v for k, v in node.exited_components().items()}
                if dead:
                    _err(f"component(s) exited: {dead}")
                    return 1
    except (ClusterError, RealNodeError) as exc:
        _err(str(exc))
        return 1
    finally:
        with contextlib.suppress(FileNotFoundError):
            (state_dir / STATE_FILE).unlink()
        with contextlib.suppress(FileNotFoundError):
            (state_dir / PID_FILE).unlink()
    return 0


# -------------------------------------------------------------------- up


def _start_daemon(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in (STATE_FILE, PID_FILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    argv = [
        sys.executable,
        "-m",
        "ambient_devcluster",
        "serve",
        "--state-dir",
        str(state_dir),
        "--timeout",
        str(args.timeout),
    ]
    if args.bin_dir is not None:
        argv += ["--bin-dir", str(args.bin_dir)]
    if args.real_node:
        argv.append("--real-node")
    with (state_dir / DAEMON_LOG).open("ab") as log:
        # A new session detaches the daemon from this terminal and from
        # `make`, so it survives them; it is *not* tied to our lifetime.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    # A real node may first wait for another one on this machine to stop.
    deadline = time.monotonic() + args.timeout + (930 if args.real_node else 30)
    while _read_state(state_dir) is None:
        if proc.poll() is not None:
            raise ClusterError(
                f"cluster daemon exited with status {proc.returncode}; "
                f"last lines of {state_dir / DAEMON_LOG}:\n{tail(state_dir / DAEMON_LOG)}"
            )
        if time.monotonic() > deadline:
            _stop_daemon(state_dir, timeout=30)
            raise ClusterError(
                f"cluster daemon not ready in time; last lines of {state_dir / DAEMON_LOG}:\n"
                f"{tail(state_dir / DAEMON_LOG)}"
            )
        time.sleep(0.1)
    return proc.pid


def cmd_up(args: argparse.Namespace) -> int:
    """Start (or reuse) the daemon, create nodes, apply CRDs, print KUBECONFIG."""
    state_dir: Path = args.state_dir
    began = time.monotonic()
    fresh = _daemon_pid(state_dir) is None
    try:
        if fresh:
            _start_daemon(args)
        state = _read_state(state_dir)
        if state is None:
            raise ClusterError(f"no {STATE_FILE} in {state_dir} although the daemon runs")
        kubeconfig = Path(state["kubeconfig"])
        if fresh:
            _err(f"control plane ready in {state.get('startup_seconds', 0):.1f}s")
            if "real_node" in state:
                _err(f"real node {state['real_node']['name']} Ready")
        else:
            _err(f"reusing running cluster at {state['server']}")
        with api_client_for(kubeconfig) as api:
            if args.nodes is not None:
                names = create_nodes(api, Path(args.nodes), timeout=args.timeout)
                _err(f"nodes Ready: {', '.join(names)}")
            crd_dirs = [] if args.no_crds else (args.crds or _default_crd_dirs())
            if crd_dirs:
                applied = apply_dirs(api, crd_dirs, timeout=args.timeout)
                _err(f"applied {len(applied)} objects from {', '.join(map(str, crd_dirs))}")
    except BaseException as exc:
        if fresh:
            _stop_daemon(state_dir, timeout=30)
        if isinstance(exc, ClusterError | ManifestError | TimeoutError | ApiException | OSError):
            _err(str(exc))
            return 1
        raise
    _err(f"up in {time.monotonic() - began:.1f}s; state in {state_dir}")
    print(f"export KUBECONFIG={kubeconfig}", flush=True)
    return 0


# ------------------------------------------------------------------ down


def _stop_daemon(state_dir: Path, timeout: float) -> bool:
    """SIGTERM the daemon and wait for it and every component to be gone."""
    workdir = str(state_dir / CLUSTER_SUBDIR)
    pid = _daemon_pid(state_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if wait_processes_gone([pid], timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_processes_gone([pid], 5)
    # Components die with the daemon (PR_SET_PDEATHSIG); confirm it.
    leftovers = [p.pid for p in find_processes(cmdline_contains=workdir)]
    if wait_processes_gone(leftovers, timeout):
        for p in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if wait_processes_gone(leftovers, 5):
            return False
    # A daemon that died (or was killed) before its real node stopped leaves
    # the node's containers, mounts and bridge: the node's own state file says
    # where, and only when it names this state dir are they ours to sweep.
    try:
        left = sweep_previous(owner=state_dir)
    except RealNodeError as exc:
        _err(str(exc))
        return False
    if left:
        _err(f"the real node left behind: {'; '.join(left)}")
        return False
    for name in (STATE_FILE, PID_FILE):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    return True


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the daemon for ``--state-dir`` and wait until all processes are gone."""
    if not _stop_daemon(args.state_dir, args.timeout):
        _err("some processes survived SIGKILL")
        return 1
    _err("stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print the state file of a running cluster (exit 1 when none runs)."""
    if _daemon_pid(args.state_dir) is None:
        _err("not running")
        return 1
    print(json.dumps(_read_state(args.state_dir), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    parser = argparse.ArgumentParser(prog="python -m ambient_devcluster")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", type=lambda s: Path(s).resolve(), required=True)
        p.add_argument("--timeout", type=float, default=120.0, help="seconds per phase")

    up = sub.add_parser("up", help="start a cluster in the background")
    common(up)
    up.add_argument("--nodes", type=Path, help="node inventory YAML to create as kwok nodes")
    up.add_argument(
        "--crds",
        type=Path,
        action="append",
        help="folder of manifests to apply (repeatable; default: crds/ and Gateway API v1.6)",
    )
    up.add_argument("--no-crds", action="store_true", help="apply no manifests")
    up.add_argument("--bin-dir", type=Path, default=None)
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run a real Linux node (containerd, kubelet, kube-proxy, CoreDNS; needs root)",
    )
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the cluster of --state-dir")
    common(down)
    down.set_defaults(func=cmd_down)

    status = sub.add_parser("status", help="show the running cluster's state")
    common(status)
    status.set_defaults(func=cmd_status)

    serve = sub.add_parser("serve", help=argparse.SUPPRESS)
    common(serve)
    serve.add_argument("--bin-dir", type=Path, default=None)
    serve.add_argument("--real-node", action="store_true")
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
