"""Shared pieces of the benchmarks run by bench/run_all.py.

- `Watcher`: one watch on a collection; an `Expectation` registered before a
  write is resolved with the monotonic clock reading at which the first
  matching watch event arrived, so every latency is what a client of the API
  server sees.
- `BenchOperator`: the dev cluster's `OperatorProcess` (the one the tests
  run too: `ambient-operator run` as its own user, so the audit log tells its
  requests apart, with its metrics) plus its memory and a wait for quiet.
- Quantiles, audit-log counting, the istio-system fixtures every benchmark
  needs, and a description of the machine.

Waiting, the audit log and the AmbientMesh helpers are
`ambient_devcluster.harness`'s, shared with the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import (
    LocalCluster,
    apply_dirs,
    default_bin_dir,
    install_istiod_objects,
)
from ambient_devcluster.harness import (
    CRDS_DIR,
    REPO_ROOT,
    OperatorProcess,
    create_mesh,
    gateway_api_dir,
    is_write,
)

ROOT = REPO_ROOT
GATEWAY_API = gateway_api_dir("v1.6")
AGENTS_NS = "istio-system"
Event = tuple[str, dict[str, Any]]


# -- numbers -----------------------------------------------------------------------------


def quantile(values: Iterable[float], q: float) -> float:
    """Nearest-rank quantile (q in 0..1) of a non-empty sample."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of an empty sample")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    """n, p50, p95, p99, max and mean of a sample (same unit as the sample)."""
    return {
        "n": float(len(values)),
        "p50": quantile(values, 0.50),
        "p95": quantile(values, 0.95),
        "p99": quantile(values, 0.99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


# -- watching ----------------------------------------------------------------------------


class Expectation:
    """Resolved by a `Watcher` with the arrival time of the first matching event."""

    def __init__(self, predicate: Callable[[str, dict[str, Any]], bool]) -> None:
        self.predicate = predicate
        self.at: float | None = None
        self.obj: dict[str, Any] | None = None
        self._done = threading.Event()

    def resolve(self, at: float, obj: dict[str, Any]) -> None:
        """Record the event (called by the watcher thread)."""
        self.at, self.obj = at, obj
        self._done.set()

    def wait(self, timeout: float, what: str = "a watch event") -> float:
        """The monotonic time the event arrived; TimeoutError if it did not in time."""
        if not self._done.wait(timeout) or self.at is None:
            raise TimeoutError(f"no watch event for {what} within {timeout:.0f}s")
        return self.at


class Watcher:
    """A watch on one collection, kept open (resuming from its resourceVersion)."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.list_fn = list_fn
        self.args = args
        self.kwargs = kwargs
        self._pending: list[Expectation] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._rv = ""

    def start(self, timeout: float = 30.0) -> Watcher:
        """Start; returns once the first list is done and the watch is about to open."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("watch did not start")
        return self

    def stop(self) -> None:
        """Stop at the end of the current watch request (the thread is a daemon)."""
        self._stop.set()

    def expect(self, predicate: Callable[[str, dict[str, Any]], bool]) -> Expectation:
        """Register interest in the next event matching `predicate(type, object)`."""
        exp = Expectation(predicate)
        with self._lock:
            self._pending.append(exp)
        return exp

    def _list(self) -> None:
        resp = self.list_fn(*self.args, _preload_content=False, **self.kwargs)
        body = json.loads(resp.data)
        self._rv = body["metadata"]["resourceVersion"]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._rv:
                    self._list()
                self._ready.set()
                stream = watch.Watch().stream(
                    self.list_fn,
                    *self.args,
                    resource_version=self._rv,
                    timeout_seconds=240,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                    **self.kwargs,
                )
                for event in stream:
                    now = time.monotonic()
                    kind, obj = str(event.get("type")), event.get("object") or {}
                    if kind == "ERROR":
                        self._rv = ""  # expired: list again
                        break
                    self._rv = obj.get("metadata", {}).get("resourceVersion", self._rv)
                    if kind != "BOOKMARK":
                        self._dispatch(now, kind, obj)
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: list again
                    self._rv = ""
                time.sleep(0.2)
            except Exception:  # a dropped connection: resume where we were
                time.sleep(0.2)

    def _dispatch(self, now: float, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            keep = []
            for exp in self._pending:
                try:
                    matched = exp.predicate(kind, obj)
                except Exception:  # a predicate that cannot read the object: no match
                    matched = False
                if matched:
                    exp.resolve(now, obj)
                else:
                    keep.append(exp)
            self._pending = keep


def named(name: str, kind: str | None = None) -> Callable[[str, dict[str, Any]], bool]:
    """Predicate: an event (of `kind`, when given) about the object called `name`."""
    return lambda t, o: (kind is None or t == kind) and o["metadata"]["name"] == name


# -- the operator ------------------------------------------------------------------------


def proc_status_kib(pid: int, field: str) -> int:
    """A KiB field (VmHWM, VmRSS, ...) of /proc/`pid`/status (0 if unreadable)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (0 once it is gone)."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


@contextlib.contextmanager
def py_spy(pid: int, raw: Path, rate: int, gil: bool = False) -> Iterator[None]:
    """py-spy sampling `pid` from outside while the block runs, its raw stacks into `raw`.

    Nonblocking: the process is never paused, so the sampling costs it nothing
    but the reads; only busy samples are kept (a thread blocked on a socket is
    idle). With `gil`, only the thread holding the GIL is sampled: the process's
    Python work alone, since a thread waiting in a socket read or in epoll (which
    py-spy may still count as busy) has released it. py-spy comes from PyPI (the
    dev extra) and needs ptrace permission.
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise RuntimeError("py-spy not found: pip install py-spy")
    argv = [
        spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
        "--output", str(raw), "--nonblocking", "--threads", *(["--gil"] if gil else []),
    ]  # fmt: skip
    # A process just spawned has no interpreter to read yet: py-spy then exits at
    # once, and is started again until it stays.
    deadline = time.monotonic() + 10
    while True:
        recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            recorder.wait(0.5)
        except subprocess.TimeoutExpired:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"py-spy could not sample process {pid}")
    try:
        yield
    finally:
        # py-spy writes its file when interrupted.
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)


class BenchOperator(OperatorProcess):
    """The operator at log level warning, with its peak memory and a wait for quiet."""

    def __init__(
        self,
        cluster: LocalCluster,
        log_path: Path,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
    ):
        super().__init__(
            cluster,
            log_path.parent,
            list(extra_args),
            log_name=log_path.name,
            health_port=0,
            log_level="warning",
            env=env,
        )
        self.peak_rss_kib = 0

    def rss_kib(self) -> int:
        """VmHWM (peak resident set) of the running process, in KiB; also kept as a max."""
        if self.proc is not None:
            self.peak_rss_kib = max(self.peak_rss_kib, proc_status_kib(self.proc.pid, "VmHWM"))
        return self.peak_rss_kib

    def rss_now_kib(self) -> int:
        """VmRSS (current resident set) of the running process, in KiB (0 if not running)."""
        return 0 if self.proc is None else proc_status_kib(self.proc.pid, "VmRSS")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Read its peak memory, then stop it (SIGKILL after `timeout` s)."""
        if self.proc is not None:
            self.rss_kib()
        super().stop(sig, timeout)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels` (0 if unreachable)."""
        try:
            return super().metric(name, **labels)
        except OSError:
            return 0.0

    def passes(self) -> tuple[float, float]:
        """(reconcile passes started, finished) of the data-plane controller."""
        samples = self.metrics()
        started = samples.get('ambient_operator_reconcile_total{controller="dataplane"}', 0.0)
        done = samples.get(
            'ambient_operator_reconcile_duration_seconds_count{controller="dataplane"}', 0.0
        )
        return started, done

    def wait_quiet(self, quiet: float = 2.1, timeout: float = 120.0) -> None:
        """Until no reconcile pass has started or ended for `quiet` seconds.

        The operator spaces passes out under sustained churn (a pass within 2 s
        of the previous one waits 0.5 s, then 1, 2, up to 5 s), so a change is
        "isolated" only after 2 quiet seconds.
        """
        deadline = time.monotonic() + timeout
        last = self.passes()
        changed = time.monotonic()
        while True:
            time.sleep(0.1)
            now_passes = self.passes()
            now = time.monotonic()
            if now_passes != last:
                last, changed = now_passes, now
            elif now - changed >= quiet and last[0] == last[1]:
                return
            if now > deadline:
                raise TimeoutError(f"operator never quiet for {quiet}s within {timeout}s")


# -- the audit log -----------------------------------------------------------------------


def by_verb(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Request counts by audit verb (get, list, watch, create, patch, ...)."""
    return dict(sorted(Counter(str(e.get("verb")) for e in events).items()))


def writes(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """'verb resource name' of each write request."""
    out = []
    for e in events:
        if is_write(e):
            ref = e.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            out.append(f"{e['verb']} {ref.get('resource')}{sub} {ref.get('name', '')}".strip())
    return out


# -- the cluster ---------------------------------------------------------------------------


def install_basics(api: client.ApiClient, mesh_spec: Mapping[str, Any] | None = None) -> None:
    """Our CRDs, Gateway API v1.6, istiod's chart objects, kube-dns, and the AmbientMesh."""
    apply_dirs(api, [CRDS_DIR, GATEWAY_API], timeout=120)
    # What the operator reads of istiod, as upstream's chart renders it.
    install_istiod_objects(api, default_bin_dir(), AGENTS_NS)
    create_mesh(api, mesh_spec or {})


def kube_version(api: client.ApiClient) -> str:
    """The API server's gitVersion."""
    info = client.VersionApi(api).get_code()
    return str(info.git_version)


# -- the machine ---------------------------------------------------------------------------


def _pinned(folder: str, module: str) -> str:
    """The version of a control-plane program, from the go.mod it is built from."""
    with contextlib.suppress(OSError):
        for line in (ROOT / "hack" / "cluster" / folder / "go.mod").read_text().splitlines():
            words = line.replace("require", "").split()
            if len(words) == 2 and words[0] == module:
                return words[1]
    return "unknown"


def machine(kubernetes: str = "") -> dict[str, str]:
    """What the numbers were measured on."""
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    return {
        "nproc": str(cpus),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "cpu": cpu_model or platform.processor() or "unknown",
        "kernel": platform.release(),
        "python": platform.python_version(),
        # Built from the Go module without version stamps, the API server calls
        # itself v0.0.0-master; the module version is the truth.
        "kubernetes": _pinned("kubernetes", "k8s.io/kubernetes")
        + (f" (the API server says {kubernetes})" if kubernetes.startswith("v1") else ""),
        "etcd": _pinned("etcd", "go.etcd.io/etcd/server/v3"),
        "kwok": _pinned("kwok", "sigs.k8s.io/kwok"),
        "load average at start": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
