"""How the operator's cost grows with the cluster, beside istiod and a floor, in one run.

    .venv/bin/python bench/growth.py [--sizes S,M,L] [--doc docs/performance.md] [--out DIR]
                                     [--races] [--from-results FILE] [--raw DIR]
    make bench-growth

For each size, a private local control plane (etcd, kube-apiserver and
kwok; kube-controller-manager and kube-scheduler are stopped once up, so
no DaemonSet or Deployment grows pods and what is measured is the
operator, not the simulated cluster's controllers) is populated the way
bench/scale.py does it (its node OS/build mix, every other namespace
enrolled, one waypoint Gateway per enrolled namespace up to the size's
count, bare pods bound to the kwok nodes, which kwok runs; the Windows
ones carry the webhook's annotation, opted out, so none is a pod the
webhook missed: steady state, not pods from before the operator). kwok's
nodes send a status heartbeat every 2.5 to 7.5 minutes (5 on average), a
kubelet's pace with leases; leases themselves are not sent, as neither
istiod nor the operator watches them.

Then, one after the other while the others idle:

1. istiod: the real `pilot-discovery` from the pinned module, installed
   from Istio's charts with the ambient profile and run out of cluster
   against the same API server. Converged: its `/ready` answers 200
   (its informers synced and its first push computed).
2. the operator (`ambient-operator run`). Converged: AmbientMesh
   Reconciled=True for its generation, its status counting every node,
   every enrolled namespace and every enrolled pod, every DaemonSet and
   every waypoint Deployment applied, and every Gateway Accepted=True.
3. the floor (bench/floor_client.py): a client that lists and watches
   exactly what the operator listed (taken from the audit log) and keeps
   every object, and does nothing else. Converged: every list done and
   every watch open.

For each: wall time and CPU-seconds from its spawn to converged, its API
requests meanwhile by verb (the audit log; watches are logged when they
end, so open ones are not counted), peak resident set (VmHWM). For the
operator also its second writes: writes to an object it created in the same
convergence, status aside (issue 44: each object written once).

Then all three run together through:

- churn, `churn_s`: 20 pod creates and 20 deletes a second across the
  enrolled namespaces (kwok runs and confirms each, as a kubelet would),
  a node added every 5 s and removed 2.5 s later, and a namespace label
  flip a second (`istio.io/dataplane-mode` set to an invalid value, then
  back 2.5 s later). CPU-seconds of each process over the phase, per
  churn request; reaction to each node and label change: the operator's
  (the AmbientMesh status counting the node; the Warning Event naming the
  label) and the floor's (its watch event), from the request's start.
  istiod writes nothing for these in a cluster without proxies, so its
  reaction cannot be seen from outside; its CPU can.
- idle, `idle_s`: nothing but the heartbeats; CPU of each process, then
  each one's resident set (VmRSS) as the settled figure.

At the sizes in `TRACED`, the operator is then restarted under
tracemalloc (one frame per allocation, sizes only, no snapshot), converged
again, and fed a tenth more of each kind of object (pods, nodes,
namespaces, Gateways), one kind at a time: the traced bytes it keeps
afterwards, less before, divided by the objects added, is its memory per
object of that kind.

Writes results.json and one PNG chart per figure against cluster size into
`--out`, and the section "Growth with the cluster" of `--doc` (replacing
only that section, between its markers; bench/run_all.py keeps it when it
rewrites the rest). Charts named by the document, and results.json (the
chart's default memory is checked against it), are copied next to it
into docs/growth/. `--races` adds bench/istiod_race.py's idle and busy
races to the section; `--from-results` rewrites everything from a
results.json without measuring (with `--races`, measuring the races only).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "growth"
DOC = ROOT / "docs" / "performance.md"
CHART_DIR = "growth"  # beside the document
BEGIN = "<!-- growth:begin (bench/growth.py writes this section) -->"
END = "<!-- growth:end -->"
SIDES = ("operator", "istiod", "floor")
ISTIOD_USER = "growth-istiod"
FLOOR_USER = "growth-floor"
MIB = 1024.0
# How long after the churn phase an answer still counts.
ANSWER_S = 30.0


@dataclass(frozen=True)
class Size:
    """One cluster size."""

    name: str
    nodes: int
    pods: int
    namespaces: int
    waypoints: int


SIZES = {
    "S": Size("S", 100, 1_000, 100, 20),
    "M": Size("M", 1_000, 10_000, 1_000, 200),
    "L": Size("L", 5_000, 50_000, 5_000, 1_000),
}
# Memory per object is traced at these sizes.
TRACED = ("M", "L")


@dataclass(frozen=True)
class Phases:
    """How long and how hard each phase runs."""

    churn_s: float = 60.0
    idle_s: float = 120.0
    pods_per_s: float = 20.0
    node_every_s: float = 5.0
    flip_every_s: float = 1.0
    # How long a flipped label stays invalid: a pass that comes after it is
    # back has nothing to say, and the flip goes unanswered (counted as missed).
    flip_hold_s: float = 2.5
    # kwok's (least, most) ms between a node's heartbeats: 5 minutes on average.
    heartbeat_ms: tuple[int, int] = (150_000, 450_000)
    traced: tuple[str, ...] = TRACED
    # Sizes where py-spy samples the operator while it converges, under churn
    # and while it idles, for what bounds those figures (nonblocking: never paused).
    profiled: tuple[str, ...] = ("L",)
    spy_rate: int = 100
    # Patience for one side's convergence.
    timeout_s: float = 900.0


# -- processes -----------------------------------------------------------------------------


class FloorProcess:
    """bench/floor_client.py as a process of its own."""

    def __init__(self, kubeconfig: Path, log: Path, collections: list[str]) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.collections = collections
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        """Spawn it; `started_at` is the monotonic time of the spawn."""
        argv = [
            sys.executable,
            str(ROOT / "bench" / "floor_client.py"),
            "--kubeconfig",
            str(self.kubeconfig),
            "--log",
            str(self.log),
            *self.collections,
        ]
        from ambient_devcluster.process import die_with_parent_preexec

        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stderr=(self.log.with_suffix(".err")).open("wb"),
            # Gone with this process however it ends, like the cluster's components.
            preexec_fn=die_with_parent_preexec(os.getpid()),  # noqa: PLW1509 - as the devcluster does
        )

    @property
    def pid(self) -> int:
        """The process id (the process must have been started)."""
        assert self.proc is not None
        return self.proc.pid

    def lines(self) -> list[str]:
        """What it has logged so far."""
        return self.log.read_text().splitlines() if self.log.exists() else []

    def synced_at(self) -> float | None:
        """The monotonic time it said every list was done and every watch open."""
        if self.proc is not None and self.proc.poll() is not None:
            err = self.log.with_suffix(".err").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the floor client exited: {err}")
        for line in self.lines():
            if line.startswith("synced "):
                return float(line.split()[1])
        return None

    def events(self) -> list[tuple[float, str, str, str]]:
        """(time, type, kind, namespace/name) of each watch event it logged."""
        out = []
        for line in self.lines():
            if line.startswith("event "):
                _, at, kind_of_event, kind, key = line.split(" ", 4)
                out.append((float(at), kind_of_event, kind, key))
        return out

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- convergence -----------------------------------------------------------------------------


def enrolled_pods(size: Size, extra: int = 0) -> int:
    """Pods in enrolled namespaces: pod j lives in namespace j mod n, even ones are enrolled."""
    return sum(1 for j in range(size.pods) if (j % size.namespaces) % 2 == 0) + extra


def enrolled_names(size: Size) -> list[str]:
    """The enrolled namespaces' names: every other one, from the first (bench/scale.py)."""
    from scale import _namespace_name

    return [_namespace_name(i) for i in range(0, size.namespaces, 2)]


def enrolled_namespaces(size: Size) -> int:
    """How many namespaces ask for ambient."""
    return len(enrolled_names(size))


@dataclass
class Expected:
    """What the operator's status and objects must show once it has caught up."""

    nodes: int
    namespaces: int
    pods: int
    daemonsets: set[str]
    gateways: int


def operator_converged(api: Any, want: Expected) -> bool:
    """One poll: whether the operator has written everything `want` describes."""
    from kubernetes import client

    from ambient_devcluster.harness import current, get_mesh
    from ambient_operator.api import constants as c

    mesh = get_mesh(api)
    status = mesh.get("status") or {}
    if not current(mesh, "Reconciled"):
        return False
    if (status.get("nodes") or {}).get("total") != want.nodes:
        return False
    enrollment = status.get("enrollment") or {}
    if enrollment.get("namespaces") != want.namespaces:
        return False
    pods = sum(
        sum((enrollment.get(os_pods) or {}).get(s, 0) for s in ("enabled", "pending", "missing"))
        for os_pods in ("linuxPods", "windowsPods")
    )
    if pods != want.pods:
        return False
    managed = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
    apps = client.AppsV1Api(api)
    daemonsets = apps.list_namespaced_daemon_set(
        "istio-system", label_selector=managed, _preload_content=False
    )
    names = {d["metadata"]["name"] for d in json.loads(daemonsets.data)["items"]}
    if not names >= want.daemonsets:
        return False
    deployments = apps.list_deployment_for_all_namespaces(
        label_selector=f"{c.LABEL_GATEWAY_NAME},{managed}", _preload_content=False
    )
    if len(json.loads(deployments.data)["items"]) < want.gateways:
        return False
    gateways = client.CustomObjectsApi(api).list_cluster_custom_object(
        "gateway.networking.k8s.io", "v1", "gateways"
    )["items"]
    return len(gateways) >= want.gateways and all(current(gw, "Accepted") for gw in gateways)


# -- churn -----------------------------------------------------------------------------------


class Ticker:
    """Runs `fn(k)` at start + k * every, for k = 0, 1, ..., until `stop`; in a pool."""

    def __init__(self, every: float, fn: Callable[[int], None], pool: ThreadPoolExecutor) -> None:
        self.every = every
        self.fn = fn
        self.pool = pool
        self.errors: list[str] = []

    def run(self, start: float, stop: float) -> None:
        """Until `stop` (monotonic); each call goes to the pool, so a slow one delays none."""
        futures = []
        for k in itertools.count():
            at = start + k * self.every
            if at >= stop:
                break
            wait = at - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # pacing the load this bench makes, not waiting for a result
            futures.append(self.pool.submit(self._guarded, k))
        for f in futures:
            f.result()

    def _guarded(self, k: int) -> None:
        try:
            self.fn(k)
        except Exception as exc:  # counted and reported; one failed request ends nothing
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])


def churn_node(name: str) -> dict[str, Any]:
    """A linux/amd64 kwok node of the scale bench's kind."""
    from ambient_devcluster import to_kwok_node
    from ambient_operator.api import constants as c

    return to_kwok_node(
        {
            "metadata": {
                "name": name,
                "labels": {
                    c.LABEL_OS: "linux",
                    c.LABEL_ARCH: "amd64",
                    c.LABEL_HOSTNAME: name,
                },
            },
            "status": {
                "nodeInfo": {
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "kernelVersion": "6.8.0-1021-azure",
                }
            },
        }
    )


def app_pod(name: str, node: str) -> dict[str, Any]:
    """A bare pod bound to `node`."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        },
    }


def churn(
    api: Any,
    size: Size,
    phases: Phases,
    base_nodes: int,
    linux_node: str,
    floor: FloorProcess,
) -> dict[str, Any]:
    """The churn phase: requests at a steady rate; the operator's and the floor's reactions."""
    from kubernetes import client

    from ambient_operator.api import constants as c
    from benchlib import Watcher
    from scale import _namespace_name

    core = client.CoreV1Api(api)
    enrolled = enrolled_names(size)
    # Namespaces whose labels flip: enrolled ones without a waypoint, so a flip
    # changes what is enrolled, not where traffic goes.
    with_waypoint = {
        _namespace_name(2 * i) for i in range(min(size.waypoints, size.namespaces // 2))
    }
    flippable = [ns for ns in enrolled if ns not in with_waypoint] or enrolled
    events = Watcher(
        core.list_event_for_all_namespaces, field_selector="reason=InvalidDataplaneMode"
    ).start()
    meshes = Watcher(
        client.CustomObjectsApi(api).list_cluster_custom_object,
        c.API_GROUP,
        c.API_VERSION,
        c.PLURAL,
    ).start()
    samples: dict[str, list[tuple[float, Any]]] = {"node": [], "namespace": []}
    node_lock = threading.Lock()
    nodes_now = [base_nodes]
    requests = {"pod create": 0, "pod delete": 0, "node add": 0, "node remove": 0, "label": 0}
    counting = threading.Lock()

    def made(what: str) -> None:
        # From the pool's threads: `+=` on a dict entry is no single step.
        with counting:
            requests[what] += 1

    def pods(k: int) -> None:
        ns = enrolled[k % len(enrolled)]
        core.create_namespaced_pod(
            ns, app_pod(f"churn-{k:06d}", linux_node), _preload_content=False
        )
        made("pod create")
        if k >= phases.pods_per_s:  # a second's worth live: delete the oldest
            old = k - int(phases.pods_per_s)
            core.delete_namespaced_pod(
                f"churn-{old:06d}", enrolled[old % len(enrolled)], _preload_content=False
            )
            made("pod delete")

    def expect_total(total: int) -> Any:
        return meshes.expect(
            lambda _t, o: ((o.get("status") or {}).get("nodes") or {}).get("total") == total
        )

    def nodes(k: int) -> None:
        name = f"churn-node-{k:04d}"
        with node_lock:
            nodes_now[0] += 1
            exp = expect_total(nodes_now[0])
            began = time.monotonic()
            core.create_node(churn_node(name), _preload_content=False)
        made("node add")
        samples["node"].append((began, (exp, f"/{name}", "ADDED")))
        time.sleep(phases.node_every_s / 2)  # the node lives half a period
        with node_lock:
            nodes_now[0] -= 1
            exp = expect_total(nodes_now[0])
            began = time.monotonic()
            core.delete_node(name, _preload_content=False)
        made("node remove")
        samples["node"].append((began, (exp, f"/{name}", "DELETED")))

    def flips(k: int) -> None:
        ns = flippable[k % len(flippable)]
        value = f"invalid-{k}"
        exp = events.expect(lambda _t, o, v=value: v in str(o.get("message", "")))
        began = time.monotonic()
        core.patch_namespace(
            ns, {"metadata": {"labels": {c.LABEL_DATAPLANE_MODE: value}}}, _preload_content=False
        )
        made("label")
        samples["namespace"].append((began, (exp, f"/{ns}", "MODIFIED")))
        time.sleep(phases.flip_hold_s)
        core.patch_namespace(
            ns,
            {"metadata": {"labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}},
            _preload_content=False,
        )
        made("label")

    started = time.monotonic()
    stop = started + phases.churn_s
    tickers = []
    with ThreadPoolExecutor(max_workers=16) as pool:
        threads = []
        for every, fn in (
            (1 / phases.pods_per_s, pods),
            (phases.node_every_s, nodes),
            (phases.flip_every_s, flips),
        ):
            ticker = Ticker(every, fn, pool)
            tickers.append(ticker)
            thread = threading.Thread(target=ticker.run, args=(started, stop))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
    ended = time.monotonic()
    # The churn pods still there go, so the idle phase has the populated cluster.
    total = int(phases.churn_s * phases.pods_per_s)
    for k in range(max(0, total - int(phases.pods_per_s)), total):
        with contextlib.suppress(client.ApiException):
            core.delete_namespaced_pod(
                f"churn-{k:06d}", enrolled[k % len(enrolled)], _preload_content=False
            )
    reactions: dict[str, dict[str, list[float]]] = {}
    floor_events = floor.events()
    missed: dict[str, int] = {}
    # One deadline for every answer: what has not come 30 s after the phase is missed.
    deadline = ended + ANSWER_S
    for kind, taken in samples.items():
        ours, floors = [], []
        for began, (exp, key, event_type) in taken:
            try:
                left = max(0.0, deadline - time.monotonic())
                ours.append(exp.wait(left, f"the operator's answer to {kind} {key}") - began)
            except TimeoutError:
                missed[f"operator {kind}"] = missed.get(f"operator {kind}", 0) + 1
            seen = [
                at
                for at, t, _kind, k in floor_events
                if k == key and t == event_type and at >= began
            ]
            if seen:
                floors.append(min(seen) - began)
            else:
                missed[f"floor {kind}"] = missed.get(f"floor {kind}", 0) + 1
        reactions[kind] = {"operator": ours, "floor": floors}
    events.stop()
    meshes.stop()
    return {
        "seconds": ended - started,
        "requests": requests,
        "events": sum(requests.values()),
        "reactions": reactions,
        "missed": missed,
        "errors": [e for t in tickers for e in t.errors][:20],
    }


# -- memory per object ------------------------------------------------------------------------


def passed(op: Any) -> bool:
    """Whether the operator's data plane has finished a pass (False until it serves metrics)."""
    try:
        return bool(op.passes()[1] >= 1)
    except OSError:
        return False


def traced_report(op: Any, path: Path) -> int:
    """The traced bytes the operator holds now (SIGUSR2; runtime/memory.py)."""
    from ambient_devcluster.harness import wait_for

    done = len(path.read_text().splitlines()) if path.exists() else 0
    op.proc.send_signal(signal.SIGUSR2)
    line: str = wait_for(
        lambda: (path.read_text().splitlines()[done:] or [None])[0] if path.exists() else None,
        120,
        "the operator's memory report",
    )
    return int(json.loads(line)["traced_bytes"])


def per_object(
    api: Any,
    cluster: Any,
    workdir: Path,
    size: Size,
    want: Expected,
    linux_node: str,
    timeout: float,
) -> dict[str, Any]:
    """Bytes the operator keeps per pod, node, namespace and Gateway (module docstring)."""
    from kubernetes import client

    from ambient_devcluster.harness import wait_for
    from ambient_operator.api import constants as c
    from ambient_operator.runtime.memory import REPORT_ENV, TOP_ENV
    from benchlib import BenchOperator, proc_status_kib
    from scale import GW_GROUP, GW_VERSION, _parallel, waypoint_gateway

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    reports = workdir / "memory.jsonl"
    env = {"PYTHONTRACEMALLOC": "1", REPORT_ENV: str(reports), TOP_ENV: "0"}
    op = BenchOperator(cluster, workdir / "operator-traced.log", env=env)
    op.start()
    began = time.monotonic()
    out: dict[str, Any] = {}
    try:
        # The status is the previous operator's until this one has made a pass.
        wait_for(
            lambda: passed(op) and operator_converged(api, want),
            timeout,
            "the traced operator's convergence",
        )
        out["converge_s"] = time.monotonic() - began
        op.wait_quiet(quiet=3.0, timeout=300)
        enrolled = enrolled_names(size)

        def add_pods(n: int) -> None:
            _parallel(
                (
                    lambda k=k: core.create_namespaced_pod(
                        enrolled[k % len(enrolled)],
                        app_pod(f"extra-{k:06d}", linux_node),
                        _preload_content=False,
                    )
                )
                for k in range(n)
            )
            want.pods += n

        def add_nodes(n: int) -> None:
            _parallel(
                (lambda k=k: core.create_node(churn_node(f"extra-node-{k:05d}"))) for k in range(n)
            )
            want.nodes += n

        def add_namespaces(n: int) -> None:
            _parallel(
                (
                    lambda k=k: core.create_namespace(
                        {
                            "metadata": {
                                "name": f"extra-{k:05d}",
                                "labels": {c.LABEL_DATAPLANE_MODE: "ambient"},
                            }
                        },
                        _preload_content=False,
                    )
                )
                for k in range(n)
            )
            want.namespaces += n

        def add_gateways(n: int) -> None:
            # Into the namespaces just added, which have no waypoint yet.
            body = waypoint_gateway()
            _parallel(
                (
                    lambda k=k: custom.create_namespaced_custom_object(
                        GW_GROUP, GW_VERSION, f"extra-{k:05d}", "gateways", body
                    )
                )
                for k in range(n)
            )
            want.gateways += n

        steps: list[tuple[str, int, Callable[[int], None]]] = [
            ("pod", max(10, size.pods // 10), add_pods),
            ("node", max(2, size.nodes // 10), add_nodes),
            ("namespace", max(2, size.namespaces // 10), add_namespaces),
            ("Gateway", max(2, size.waypoints // 10), add_gateways),
        ]
        for kind, n, add in steps:
            before = traced_report(op, reports)
            add(n)
            wait_for(lambda: operator_converged(api, want), timeout, f"{n} more {kind}s seen")
            op.wait_quiet(quiet=3.0, timeout=300)
            after = traced_report(op, reports)
            out[kind] = {
                "added": n,
                "before": before,
                "after": after,
                "bytes": (after - before) / n,
            }
        out["traced_bytes"] = traced_report(op, reports)
        assert op.proc is not None
        out["rss_kib"] = proc_status_kib(op.proc.pid, "VmRSS")
    finally:
        op.stop()
    return out


# -- one size ---------------------------------------------------------------------------------


# The phases py-spy may sample, as results name their profiles, and in words.
PROFILED_PHASES = (
    ("converge_profile", "while it converged"),
    ("churn_profile", "under churn"),
    ("idle_profile", "while it idled"),
)


@contextlib.contextmanager
def sampled(
    into: dict[str, Any],
    key: str,
    pid: int,
    raw: Path,
    rate: int,
    on: bool,
    seconds: Callable[[], float],
    gil: bool = False,
) -> Iterator[None]:
    """When `on`, py-spy samples `pid` into `raw` while the block runs; then `into[key]` is
    their summary over `seconds()` of wall time, the phase's as the block measured it.
    `gil` samples only the thread holding the GIL (benchlib.py_spy)."""
    from benchlib import py_spy

    if not on:
        yield
        return
    with py_spy(pid, raw, rate, gil):
        yield
    into[key] = spy_summary(raw.read_text(), rate, seconds(), gil=gil)


def spy_summary(
    raw: str, rate: int, seconds: float, top: int = 6, gil: bool = False
) -> dict[str, Any]:
    """py-spy's busy samples of one phase (pure): how busy, on what job, in which functions.

    `busy_s` is thread-seconds of sampled work (samples / rate) in `seconds` of
    wall time: Python's alone when `gil` (only the thread holding the GIL was
    sampled). Jobs are bench/profile_passes.py's (a pass, or the API requests
    handed to worker threads); `self` is the frame on top, over every sample.
    """
    from profile_passes import overall, summarize

    lines = raw.splitlines()
    every = overall(lines)
    total = every.samples
    jobs = {job: p.samples for job, p in summarize(lines).items() if p.samples}
    return {
        "rate": rate,
        "gil": gil,
        "seconds": seconds,
        "samples": total,
        "busy_s": total / rate,
        "jobs": {job: n / total for job, n in sorted(jobs.items(), key=lambda kv: -kv[1])}
        if total
        else {},
        "self": [(name, n / total) for name, n in every.own.most_common(top)] if total else [],
    }


def measure_size(
    size: Size,
    phases: Phases,
    workdir: Path,
    progress: Callable[[str], None],
    raw: Path | None = None,
) -> dict[str, Any]:
    """Every figure of one size, on a cluster of its own; py-spy's collapsed stacks are
    kept in `raw` (as <size>-<phase>.spy) when given, else only in `workdir`."""
    stacks = raw or workdir
    stacks.mkdir(parents=True, exist_ok=True)
    import render_scale
    from ambient_devcluster import (
        IstioControlPlane,
        LocalCluster,
        apply_dirs,
        apply_objects,
        cluster_dns_service,
        default_bin_dir,
    )
    from ambient_devcluster.harness import CRDS_DIR, OPERATOR_USER, AuditLog, create_mesh, wait_for
    from ambient_operator.api.v1alpha1 import AmbientMeshSpec
    from ambient_operator.cluster.facts import ClusterFacts
    from ambient_operator.render import render_dataplane
    from benchlib import GATEWAY_API, BenchOperator, by_verb, cpu_seconds, proc_status_kib
    from floor_client import collection
    from scale import Scale, _client, populate

    bin_dir = default_bin_dir()
    result: dict[str, Any] = {"size": asdict(size), "sides": {s: {} for s in SIDES}}
    began = time.monotonic()
    with LocalCluster(
        workdir / "cluster", bin_dir=bin_dir, verbose=False, node_heartbeat_ms=phases.heartbeat_ms
    ) as cluster:
        for component in ("kube-controller-manager", "kube-scheduler"):
            cluster.stop_component(component)
        api = _client(cluster.kubeconfig)
        audit = AuditLog(cluster.audit_log)
        apply_dirs(api, [CRDS_DIR, GATEWAY_API], timeout=120)
        apply_objects(api, [cluster_dns_service()])
        istiod = IstioControlPlane(
            cluster.user_kubeconfig(ISTIOD_USER, ["system:masters"]), workdir / "istiod", bin_dir
        )
        istiod.install()
        create_mesh(api, {})
        scale = Scale(size.nodes, size.namespaces, size.waypoints, size.pods)
        populated = populate(api, scale, progress, controller_manager=False, admitted=True)
        result["populate_s"] = populated["populate_s"]
        plans = render_dataplane(
            AmbientMeshSpec(), ClusterFacts.from_nodes(render_scale.inventory(size.nodes))
        ).daemonsets
        linux_node = next(n for p in plans if p.platform == "linux" for n in sorted(p.nodes))
        want = Expected(
            nodes=size.nodes,
            namespaces=enrolled_namespaces(size),
            pods=enrolled_pods(size),
            daemonsets={p.name for p in plans},
            gateways=populated["gateways"],
        )
        sides = result["sides"]

        # What the control plane spent while a side converged: its share of the
        # machine is what the side's own convergence could not use.
        control_plane = cluster.pids()

        def control_plane_cpu() -> dict[str, float]:
            return {name: cpu_seconds(pid) for name, pid in control_plane.items()}

        def spent_since(before: dict[str, float]) -> dict[str, float]:
            return {name: used - before[name] for name, used in control_plane_cpu().items()}

        profiled = size.name in phases.profiled

        # 1. istiod
        mark = audit.mark()
        before = control_plane_cpu()
        spawned = time.monotonic()
        istiod.start(timeout=phases.timeout_s)
        istiod_pid = int(istiod._process.pid or 0)
        sides["istiod"]["converge_s"] = time.monotonic() - spawned
        sides["istiod"]["converge_cpu_s"] = cpu_seconds(istiod_pid)
        sides["istiod"]["control_plane_cpu_s"] = spent_since(before)
        sides["istiod"]["requests"] = by_verb(audit.events(mark, audit.mark(), user=ISTIOD_USER))
        progress(f"growth {size.name}: istiod ready in {sides['istiod']['converge_s']:.1f}s")

        # 2. the operator
        op = BenchOperator(cluster, workdir / "operator.log")
        mark = audit.mark()
        before = control_plane_cpu()
        spawned_wall = time.time()
        op.start()
        assert op.proc is not None
        with sampled(
            sides["operator"],
            "converge_profile",
            op.proc.pid,
            stacks / f"{size.name}-converge.spy",
            phases.spy_rate,
            profiled,
            lambda: float(sides["operator"]["converge_s"]),
        ):
            wait_for(
                lambda: operator_converged(api, want),
                phases.timeout_s,
                "the operator's convergence",
            )
            sides["operator"]["converge_s"] = time.monotonic() - op.started_at
            sides["operator"]["converge_cpu_s"] = cpu_seconds(op.proc.pid)
        sides["operator"]["control_plane_cpu_s"] = spent_since(before)
        op_events = audit.events(mark, audit.mark(), user=OPERATOR_USER)
        sides["operator"]["requests"] = by_verb(op_events)
        sides["operator"]["rewrites"] = rewrites(op_events)
        sides["operator"]["timeline"] = timeline(op_events, spawned_wall)
        progress(
            f"growth {size.name}: operator converged in {sides['operator']['converge_s']:.1f}s"
        )
        op.wait_quiet(quiet=3.0, timeout=300)

        # 3. the floor, reading what the operator read
        collections = sorted(
            {collection(e["requestURI"]) for e in op_events if e.get("verb") == "list"}
        )
        result["floor_collections"] = collections
        floor = FloorProcess(
            cluster.user_kubeconfig(FLOOR_USER, ["system:masters"]),
            workdir / "floor.log",
            collections,
        )
        mark = audit.mark()
        before = control_plane_cpu()
        floor.start()
        synced = wait_for(floor.synced_at, phases.timeout_s, "the floor's lists and watches")
        sides["floor"]["converge_s"] = synced - floor.started_at
        sides["floor"]["converge_cpu_s"] = cpu_seconds(floor.pid)
        sides["floor"]["control_plane_cpu_s"] = spent_since(before)
        sides["floor"]["requests"] = by_verb(audit.events(mark, audit.mark(), user=FLOOR_USER))
        progress(f"growth {size.name}: floor synced in {sides['floor']['converge_s']:.1f}s")

        pids = {"operator": op.proc.pid, "istiod": istiod_pid, "floor": floor.pid}
        try:
            for side, pid in pids.items():
                sides[side]["rss_peak_kib"] = proc_status_kib(pid, "VmHWM")
            # 4. churn, all three running
            cpu = {side: cpu_seconds(pid) for side, pid in pids.items()}
            marks = audit.mark()
            with sampled(
                sides["operator"],
                "churn_profile",
                pids["operator"],
                stacks / f"{size.name}-churn.spy",
                phases.spy_rate,
                profiled,
                lambda: float(done["seconds"]),
            ):
                done = churn(api, size, phases, size.nodes, linux_node, floor)
            churn_events = {
                side: len(audit.events(marks, audit.mark(), user=user))
                for side, user in (
                    ("operator", OPERATOR_USER),
                    ("istiod", ISTIOD_USER),
                    ("floor", FLOOR_USER),
                )
            }
            for side, pid in pids.items():
                used = cpu_seconds(pid) - cpu[side]
                sides[side]["churn_cpu_s"] = used
                sides[side]["churn_cpu_per_event_ms"] = 1000 * used / max(1, done["events"])
                sides[side]["churn_requests"] = churn_events[side]
            result["churn"] = done
            progress(
                f"growth {size.name}: churn {done['events']} requests in {done['seconds']:.0f}s"
            )
            op.wait_quiet(quiet=3.0, timeout=300)

            # 5. idle
            cpu = {side: cpu_seconds(pid) for side, pid in pids.items()}
            idle_began = time.monotonic()
            with sampled(
                sides["operator"],
                "idle_profile",
                pids["operator"],
                stacks / f"{size.name}-idle.spy",
                phases.spy_rate,
                profiled,
                lambda: idle,
                # What the idle CPU goes to: only the thread doing Python work.
                gil=True,
            ):
                # The phase itself: nothing happens but heartbeats.
                threading.Event().wait(phases.idle_s)
                idle = time.monotonic() - idle_began
            for side, pid in pids.items():
                sides[side]["idle_cpu_pct"] = 100 * (cpu_seconds(pid) - cpu[side]) / idle
                sides[side]["rss_settled_kib"] = proc_status_kib(pid, "VmRSS")
                sides[side]["rss_peak_kib"] = max(
                    sides[side]["rss_peak_kib"], proc_status_kib(pid, "VmHWM")
                )
            result["idle_s"] = idle
            result["survived"] = {
                "operator": op.alive(),
                "istiod": istiod.running(),
                "floor": floor.proc is not None and floor.proc.poll() is None,
            }
        finally:
            op.stop()
            floor.stop()
        progress(f"growth {size.name}: idle measured")

        # 6. memory per object
        if size.name in phases.traced:
            istiod.stop()
            result["per_object"] = per_object(
                api, cluster, workdir, size, want, linux_node, phases.timeout_s
            )
            progress(f"growth {size.name}: memory per object traced")
        istiod.stop()
        api.close()
    result["seconds"] = time.monotonic() - began
    return result


def measure(
    sizes: Iterable[Size],
    phases: Phases,
    progress: Callable[[str], None] = print,
    raw: Path | None = None,
) -> dict[str, Any]:
    """Every size in turn, each on a cluster of its own; JSON-friendly."""
    from benchlib import machine

    results: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "phases": {k: v for k, v in asdict(phases).items()},
        "commit": _commit(),
        "sizes": {},
    }
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"growth-{size.name}-") as tmp:
            results["sizes"][size.name] = measure_size(size, phases, Path(tmp), progress, raw)
    results["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return results


def _commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, check=True
            )
            .stdout.decode()
            .strip()
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "operator"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        ).stdout.strip()
        return head + (" (with uncommitted changes to operator/)" if dirty else "")
    return ""


# -- figures (pure) ------------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float | None:
    """benchlib's nearest-rank quantile; None for an empty sample."""
    from benchlib import quantile as nearest_rank

    return nearest_rank(values, q) if values else None


@dataclass(frozen=True)
class Metric:
    """One figure measured per side and size."""

    key: str
    title: str
    unit: str
    read: Callable[[Mapping[str, Any], str], float | None] = field(repr=False)


def _side(name: str, scale: float = 1.0) -> Callable[[Mapping[str, Any], str], float | None]:
    def read(size: Mapping[str, Any], side: str) -> float | None:
        value = (size.get("sides") or {}).get(side, {}).get(name)
        return None if value is None else float(value) * scale

    return read


def _requests(size: Mapping[str, Any], side: str) -> float | None:
    verbs = (size.get("sides") or {}).get(side, {}).get("requests")
    return None if verbs is None else float(sum(verbs.values()))


def _reaction(kind: str, q: float) -> Callable[[Mapping[str, Any], str], float | None]:
    def read(size: Mapping[str, Any], side: str) -> float | None:
        values = ((size.get("churn") or {}).get("reactions") or {}).get(kind, {}).get(side)
        found = quantile(values or [], q)
        return None if found is None else found * 1000

    return read


METRICS = (
    Metric("rss_peak", "peak RSS (VmHWM)", "MiB", _side("rss_peak_kib", 1 / MIB)),
    Metric(
        "rss_settled",
        "settled RSS after the idle phase (VmRSS)",
        "MiB",
        _side("rss_settled_kib", 1 / MIB),
    ),
    Metric("converge_cpu", "CPU from start to converged", "s", _side("converge_cpu_s")),
    Metric("converge", "time from start to converged", "s", _side("converge_s")),
    Metric("requests", "API requests from start to converged", "requests", _requests),
    Metric("churn_cpu", "CPU per churn request", "ms", _side("churn_cpu_per_event_ms")),
    Metric("node_p50", "node added or removed → seen: p50", "ms", _reaction("node", 0.5)),
    Metric("node_p99", "node added or removed → seen: p99", "ms", _reaction("node", 0.99)),
    Metric("label_p50", "namespace label flipped → seen: p50", "ms", _reaction("namespace", 0.5)),
    Metric("label_p99", "namespace label flipped → seen: p99", "ms", _reaction("namespace", 0.99)),
    Metric("idle_cpu", "idle CPU (heartbeats only)", "% of a core", _side("idle_cpu_pct")),
)
METRIC_BY_KEY = {m.key: m for m in METRICS}
# The reactions timed under churn: their metrics' key prefix, and their targets' name.
REACTIONS = (("node", "node → seen"), ("label", "label → seen"))


def value(results: Mapping[str, Any], size: str, side: str, metric: Metric) -> float | None:
    """One figure, None when not measured."""
    measured = (results.get("sizes") or {}).get(size)
    return None if measured is None else metric.read(measured, side)


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "—"
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}" + (f" {unit}" if unit else "")


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


@dataclass(frozen=True)
class Target:
    """One of the issue's targets, judged from a run."""

    name: str
    value: str
    met: bool | None


def _within(name: str, ours: float | None, other: float | None, unit: str, factor: float) -> Target:
    """Target `name`: `ours` at most `factor` times `other`, both shown in `unit`."""
    return Target(
        name,
        f"{_fmt(ours, unit)} vs {_fmt(other, unit)} ({_ratio(ours, other)})",
        None if ours is None or other is None else ours <= factor * other,
    )


def deployment_rows(race: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, float]]]:
    """(series, ours/istiod ratios) of a race's Deployment milestone, the one both sides
    mean alike (Programmed means different things on the two sides)."""
    for name, row in (race.get("ratios") or {}).items():
        if name.endswith(" deployment"):
            yield name.removesuffix(" deployment"), row


WRITE_VERBS = ("create", "update", "patch", "delete")


def timeline(events: Iterable[Mapping[str, Any]], started: float) -> dict[str, float]:
    """When a side's lists ended and its writes began and ended, in s from `started` (pure).

    `started` is the side's spawn on the machine's wall clock, which the audit
    log's timestamps are on too.
    """
    from reaction_latency import _stamp

    lists, writes = [], []
    for e in events:
        if e.get("verb") == "list":
            lists.append(_stamp(str(e["stageTimestamp"])))
        elif e.get("verb") in WRITE_VERBS:
            writes.append(_stamp(str(e["requestReceivedTimestamp"])))
    out: dict[str, float] = {"writes": float(len(writes))}
    if lists:
        out["lists_done_s"] = max(lists) - started
    if writes:
        out["first_write_s"] = min(writes) - started
        out["last_write_s"] = max(writes) - started
    return out


def rewrites(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """Writes to an object the same events created, after its create (pure).

    Issue 44's "each object written once": a create followed by a patch of
    the same object in one convergence is a second write that folding it
    into the create would have saved. Status subresources are left out (a
    status follows the world and may move more than once); so is every object
    the events did not create (a Lease renewed, the AmbientMesh's finalizer).
    """
    created: set[tuple[str, str, str]] = set()
    out = []
    for e in events:
        ref = e.get("objectRef") or {}
        code = int((e.get("responseStatus") or {}).get("code") or 0)
        verb = str(e.get("verb"))
        if verb not in WRITE_VERBS or ref.get("subresource") or not 200 <= code < 300:
            continue
        ident = (str(ref.get("resource")), str(ref.get("namespace", "")), str(ref.get("name", "")))
        # The operator creates by a server-side apply that only a free name
        # takes (apply/writer.py): a patch answered 201 is a create.
        if verb == "create" or (verb == "patch" and code == 201):
            created.add(ident)
        elif ident in created:
            out.append(f"{verb} {ident[0]} {ident[1]}/{ident[2]}".replace(" /", " "))
    return out


def _at_most(name: str, ours: float | None, unit: str, limit: float) -> Target:
    """Target `name`: `ours` at most `limit`, both in `unit`."""
    return Target(
        name,
        f"{_fmt(ours, unit)} (target ≤ {_fmt(limit, unit)})",
        None if ours is None else ours <= limit,
    )


def targets(results: Mapping[str, Any]) -> list[Target]:
    """The targets of issues 33 and 44 against the run (pure)."""
    sizes = list(results.get("sizes") or {})

    def of(size: str, side: str, key: str) -> float | None:
        return value(results, size, side, METRIC_BY_KEY[key])

    out = [
        _within(
            f"{size}: operator peak RSS ≤ ½ istiod's",
            of(size, "operator", "rss_peak"),
            of(size, "istiod", "rss_peak"),
            "MiB",
            0.5,
        )
        for size in sizes
    ]
    out += [
        _within(
            f"{size}: operator CPU per churn request ≤ istiod's",
            of(size, "operator", "churn_cpu"),
            of(size, "istiod", "churn_cpu"),
            "ms",
            1.0,
        )
        for size in sizes
    ]
    if "S" in sizes and "L" in sizes:
        out.append(
            _within(
                "operator CPU per churn request, L within 2x of S",
                of("L", "operator", "churn_cpu"),
                of("S", "operator", "churn_cpu"),
                "ms",
                2.0,
            )
        )
    for mode, race in (results.get("races") or {}).items():
        for series, row in deployment_rows(race):
            p50, p99 = row.get("ours/istiod p50"), row.get("ours/istiod p99")
            out.append(
                Target(
                    f"{mode} race, {series} namespace: ours ≤ istiod's at p50 and p99",
                    "—" if p50 is None or p99 is None else f"{p50:.2f}x / {p99:.2f}x",
                    None if p50 is None or p99 is None else p50 <= 1 and p99 <= 1,
                )
            )
    if sizes:
        largest = sizes[-1]
        idle = of(largest, "operator", "idle_cpu")
        out.append(
            Target(
                f"{largest}: operator idle CPU < 1 % of a core",
                _fmt(idle, "%"),
                None if idle is None else idle < 1.0,
            )
        )
        out.append(
            _within(
                f"{largest}: operator convergence ≤ 2x the floor's list-and-watch",
                of(largest, "operator", "converge"),
                of(largest, "floor", "converge"),
                "s",
                2.0,
            )
        )
        out.append(
            _within(
                f"{largest}: operator convergence ≤ istiod's",
                of(largest, "operator", "converge"),
                of(largest, "istiod", "converge"),
                "s",
                1.0,
            )
        )
        per_gateway = (
            (results["sizes"][largest].get("per_object") or {}).get("Gateway") or {}
        ).get("bytes")
        out.append(
            _at_most(f"{largest}: operator memory per waypoint ≤ 40 KB", per_gateway, "B", 40_000)
        )
    # Issue 44: reactions under churn at every size, and each object written once.
    for size in sizes:
        for key, what in REACTIONS:
            out.append(
                _at_most(
                    f"{size}: {what} p50 ≤ 100 ms", of(size, "operator", f"{key}_p50"), "ms", 100
                )
            )
            out.append(
                _at_most(
                    f"{size}: {what} p99 ≤ 500 ms", of(size, "operator", f"{key}_p99"), "ms", 500
                )
            )
        again = ((results["sizes"][size].get("sides") or {}).get("operator") or {}).get("rewrites")
        out.append(
            Target(
                f"{size}: each object written once while converging",
                "—"
                if again is None
                else f"{len(again)} second writes"
                + (f" (e.g. {', '.join(again[:3])})" if again else ""),
                None if again is None else not again,
            )
        )
    return out


def charts(results: Mapping[str, Any], out: Path) -> list[Path]:
    """One PNG per figure: the figure against cluster size (nodes), one line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    sizes = results.get("sizes") or {}
    written = []
    for metric in METRICS:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for side in SIDES:
            points = [
                (float(size["size"]["nodes"]), metric.read(size, side)) for size in sizes.values()
            ]
            shown = [(x, y) for x, y in points if y is not None]
            if shown:
                ax.plot([x for x, _ in shown], [y for _, y in shown], marker="o", label=side)
        ax.set_xscale("log")
        ax.set_xlabel("nodes (pods: 10 per node, namespaces: 1, Gateways: 1 per 5)")
        ax.set_ylabel(metric.unit)
        ax.set_title(metric.title, fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"growth-{metric.key}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def section(results: Mapping[str, Any], chart_dir: str = CHART_DIR) -> str:
    """The document's growth section, markers included (pure)."""
    sizes = results.get("sizes") or {}
    names = list(sizes)
    notes = list(results.get("notes") or [])
    for name, size in sizes.items():
        op = size["sides"]["operator"]
        phases = [what for key, what in PROFILED_PHASES if op.get(key)]
        if phases:
            notes.append(
                f"At {name} py-spy sampled the operator {' and '.join(phases)}; its own CPU comes "
                "from the cores the sides and the control plane share."
            )
    lines = [
        BEGIN,
        "## Growth with the cluster (issues 33 and 44)",
        "",
        f"Measured {results.get('started', '?')} to {results.get('finished', '?')}"
        + (f" at commit {results['commit']}" if results.get("commit") else "")
        + " by `make bench-growth` (bench/growth.py, whose docstring says exactly what is "
        "done), on "
        + ", ".join(f"{k} {v}" for k, v in (results.get("machine") or {}).items())
        + ".",
        "",
        "| size | nodes | pods | namespaces | waypoints | populated in | measured in |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, size in sizes.items():
        s = size["size"]
        lines.append(
            f"| {name} | {s['nodes']:,} | {s['pods']:,} | {s['namespaces']:,} | "
            f"{s['waypoints']:,} | {_fmt(size.get('populate_s'), 's')} | "
            f"{_fmt(size.get('seconds'), 's')} |"
        )
    lines += [
        "",
        "Each size runs on a control plane of its own: etcd, kube-apiserver and kwok (heartbeats "
        "at a kubelet's pace); kube-controller-manager and kube-scheduler are stopped, so the "
        "operator's DaemonSets and Deployments grow no pods and what is timed is the operator, "
        "not the simulated cluster. **istiod** is the real `pilot-discovery` (ambient profile); "
        "the **floor** is a Python client that lists and watches exactly what the operator "
        "listed and keeps every object, and does nothing else. Each side converges alone; churn "
        "and idle run with all three.",
        "",
        *(["**Notes on this run.** " + " ".join(notes), ""] if notes else []),
        "### Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(
            f"| {t.name} | {t.value} | {'—' if t.met is None else 'yes' if t.met else '**no**'} |"
            for t in targets(results)
        ),
        "",
        "### Every figure",
        "",
        "| figure | " + " | ".join(f"{n} {side}" for n in names for side in SIDES) + " |",
        "|---|" + "---|" * (len(names) * len(SIDES)),
    ]
    for metric in METRICS:
        lines.append(
            f"| {metric.title} ({metric.unit}) | "
            + " | ".join(_fmt(metric.read(sizes[n], side)) for n in names for side in SIDES)
            + " |"
        )
    lines += [
        "",
        "Ratios of the operator's figure to the floor's and to istiod's, same run:",
        "",
        "| figure | " + " | ".join(f"{n} ÷ floor | {n} ÷ istiod" for n in names) + " |",
        "|---|" + "---|" * (2 * len(names)),
    ]
    for metric in METRICS:
        cells = []
        for n in names:
            ours = metric.read(sizes[n], "operator")
            cells += [
                _ratio(ours, metric.read(sizes[n], "floor")),
                _ratio(ours, metric.read(sizes[n], "istiod")),
            ]
        lines.append(f"| {metric.title} | " + " | ".join(cells) + " |")
    lines += ["", "Requests by verb from start to converged:", ""]
    for n in names:
        for side in SIDES:
            verbs = sizes[n]["sides"].get(side, {}).get("requests") or {}
            lines.append(
                f"- {n} {side}: " + (", ".join(f"{v} {k}" for k, v in verbs.items()) or "—")
            )
    lines += ["", "Churn requests made, and what was not seen in 30 s:", ""]
    for n in names:
        done = sizes[n].get("churn") or {}
        lines.append(
            f"- {n}: "
            + ", ".join(f"{v} {k}" for k, v in (done.get("requests") or {}).items())
            + f" in {_fmt(done.get('seconds'), 's')}"
            + (
                "; not seen: " + ", ".join(f"{k} {v}" for k, v in done["missed"].items())
                if done.get("missed")
                else ""
            )
            + ("; request errors: " + "; ".join(done["errors"]) if done.get("errors") else "")
        )
    lines += [
        "",
        *bounds_lines(results),
        *memory_lines(results),
        "",
        *sizing_lines(results),
        "",
        *race_lines(results),
    ]
    lines += ["", "### Charts", ""]
    for metric in METRICS:
        lines.append(f"![{metric.title}]({chart_dir}/growth-{metric.key}.png)")
    lines += ["", END]
    return "\n".join(lines)


KINDS = ("pod", "node", "namespace", "Gateway")


def memory_lines(results: Mapping[str, Any]) -> list[str]:
    """The memory-per-object table (pure)."""
    traced = {
        n: s["per_object"] for n, s in (results.get("sizes") or {}).items() if s.get("per_object")
    }
    if not traced:
        return []
    lines = [
        "### Memory per object",
        "",
        "Traced bytes the operator keeps per object added (tracemalloc, one frame; a tenth more "
        "of each kind, one kind at a time, after convergence):",
        "",
        "| kind | " + " | ".join(f"at {n} (added)" for n in traced) + " |",
        "|---|" + "---|" * len(traced),
    ]
    for kind in KINDS:
        lines.append(
            f"| {kind} | "
            + " | ".join(
                f"{_fmt(t[kind]['bytes'])} B ({t[kind]['added']:,})" if kind in t else "—"
                for t in traced.values()
            )
            + " |"
        )
    if any(t[k]["bytes"] < 0 for t in traced.values() for k in KINDS if k in t):
        lines += [
            "",
            "A negative figure is a tenth too small to stand out of the traced heap's own "
            "movement between two readings (caches replaced, buffers freed) at that size: the "
            "sizing below uses the largest traced size's figures.",
        ]
    return lines


# What the operator keeps grows with these counts of a size.
COUNTS = {"pod": "pods", "node": "nodes", "namespace": "namespaces", "Gateway": "waypoints"}
# The chart's request covers a settled operator at this size, its limit the peak at this one,
LIMIT_HEADROOM = 1.25  # with this much room above the peak measured.
REQUEST_AT, LIMIT_AT = "M", "L"


@dataclass(frozen=True)
class Sizing:
    """Resident memory as a function of what the cluster holds, from one run.

    settled(counts) = base + overhead x sum(bytes[kind] x count[kind]): the
    bytes per object are tracemalloc's; base and overhead (resident bytes per
    traced byte: the allocator's arenas, fragmentation) come from the settled
    RSS at the smallest and largest sizes.
    """

    per_object: dict[str, float]
    base_mib: float
    overhead: float
    peak_ratio: float

    def traced_mib(self, size: Mapping[str, int]) -> float:
        """Traced MiB of a size's objects."""
        return sum(self.per_object[k] * size[COUNTS[k]] for k in KINDS) / MIB / MIB

    def settled_mib(self, size: Mapping[str, int]) -> float:
        """Estimated settled RSS for a cluster of these counts."""
        return self.base_mib + self.overhead * self.traced_mib(size)


def sizing(results: Mapping[str, Any]) -> Sizing | None:
    """The memory model of a run (pure); None without S, L and a traced size."""
    sizes = results.get("sizes") or {}
    traced = [s["per_object"] for s in sizes.values() if s.get("per_object")]
    if "S" not in sizes or "L" not in sizes or not traced:
        return None
    last = traced[-1]  # the largest traced size: the most objects added, the least noise
    per_object = {k: max(0.0, float(last[k]["bytes"])) for k in KINDS if k in last}
    if set(per_object) != set(KINDS):
        return None
    small, large = sizes["S"], sizes["L"]

    def rss(size: Mapping[str, Any], name: str) -> float:
        return float(size["sides"]["operator"][name]) / MIB

    probe = Sizing(per_object, 0.0, 1.0, 1.0)
    spread = probe.traced_mib(large["size"]) - probe.traced_mib(small["size"])
    settled_s, settled_l = rss(small, "rss_settled_kib"), rss(large, "rss_settled_kib")
    overhead = (settled_l - settled_s) / spread if spread > 0 else 1.0
    base = settled_s - overhead * probe.traced_mib(small["size"])
    return Sizing(per_object, base, overhead, rss(large, "rss_peak_kib") / settled_l)


def _profile_text(profile: Mapping[str, Any]) -> str:
    """One sentence of a py-spy summary (spy_summary's)."""
    jobs = ", ".join(f"{job} {share:.0%}" for job, share in (profile.get("jobs") or {}).items())
    frames = ", ".join(f"`{name}` {share:.0%}" for name, share in profile.get("self") or [])
    if profile.get("gil"):
        took = (
            f"py-spy ({profile['rate']} samples a second, nonblocking, only the thread holding "
            f"the GIL) took {profile['samples']:,} samples in {profile['seconds']:.1f} s: "
            f"{profile['busy_s']:.2f} s of Python work"
        )
    else:
        took = (
            f"py-spy ({profile['rate']} samples a second, nonblocking) took "
            f"{profile['samples']:,} samples of active threads in {profile['seconds']:.1f} s "
            "(it counts a thread waiting in an SSL read or in epoll as active)"
        )
    return (
        took
        + (f"; by job: {jobs}" if jobs else "")
        + (f"; on top of the stack: {frames}" if frames else "")
        + "."
    )


def bounds_lines(results: Mapping[str, Any]) -> list[str]:
    """What bounds each missed target, from the same run's figures and profiles (pure)."""
    missed = {t.name for t in targets(results) if t.met is False}
    sizes = results.get("sizes") or {}
    if not missed or not sizes:
        return []
    largest = list(sizes)[-1]
    sides = sizes[largest]["sides"]
    op = sides["operator"]
    out = ["### What bounds the missed targets", ""]

    def with_profile(text: str, profile: str) -> list[str]:
        return [text, "", *([_profile_text(op[profile]), ""] if op.get(profile) else [])]

    if any(name.startswith(f"{largest}: operator convergence") for name in missed):
        converge = float(op["converge_s"])
        own = float(op["converge_cpu_s"])
        text = (
            f"**Convergence at {largest}.** From its start the operator took {converge:.1f} s "
            f"to write everything and report it, and used {own:.1f} s of CPU in that time "
            f"({own / converge:.0%} of one core)."
        )
        spent = op.get("control_plane_cpu_s") or {}
        if spent:
            machine = int((results.get("machine") or {}).get("nproc") or 2)
            busy = (sum(spent.values()) + own) / (machine * converge)
            used = ", ".join(f"{name} {cpu:.1f} s" for name, cpu in sorted(spent.items()))
            verbs = ", ".join(f"{n:,} {verb}" for verb, n in sorted(op["requests"].items()))
            others = "; ".join(
                f"{side} {sum(sides[side]['control_plane_cpu_s'].values()):.1f} s"
                for side in ("istiod", "floor")
                if sides[side].get("control_plane_cpu_s")
            )
            text += (
                f" In the same window the control plane used {used}: with the operator's own, "
                f"{busy:.0%} of the machine's {machine} cores. Its requests ({verbs}) are what "
                "the control plane served; while the others converged it spent "
                f"{others or 'nothing measured'}."
            )
            floor_s = (sum(spent.values()) + own) / machine
            if busy >= 0.9:
                text += (
                    f" The machine was saturated: that work needs {floor_s:.1f} s of its "
                    f"{machine} cores however the operator orders it, and its bulk is the API "
                    "server's cost of the writes, which istiod and the floor do not make."
                )
            else:
                text += (
                    f" That work alone needs {floor_s:.1f} s of {machine} cores; for the other "
                    f"{converge - floor_s:.1f} s the machine was not saturated and the operator "
                    "waited on its requests (the samples below)."
                )
        times = op.get("timeline") or {}
        if "lists_done_s" in times and "last_write_s" in times:
            span = times["last_write_s"] - times["first_write_s"]
            text += (
                f" Its lists were done {times['lists_done_s']:.1f} s after its start; its "
                f"{times['writes']:,.0f} writes ran from {times['first_write_s']:.1f} s to "
                f"{times['last_write_s']:.1f} s"
                + (f", {times['writes'] / span:,.0f} a second." if span > 0 else ".")
            )
        out += with_profile(text, "converge_profile")
    if f"{largest}: operator idle CPU < 1 % of a core" in missed:
        text = (
            f"**Idle CPU at {largest}.** {op['idle_cpu_pct']:.2f} % of a core with nothing "
            "changing but kwok's heartbeats, against the floor's "
            f"{sides['floor']['idle_cpu_pct']:.2f} % for only receiving the same watch events."
        )
        out += with_profile(text, "idle_profile")
    for name in sizes:
        for key, what in REACTIONS:
            late = [
                q
                for q in ("p50", "p99")
                if any(m.startswith(f"{name}: {what} {q} ") for m in missed)
            ]
            if not late:
                continue
            ours, floor = (
                ", ".join(
                    f"{q} {_fmt(value(results, name, side, METRIC_BY_KEY[f'{key}_{q}']), 'ms')}"
                    for q in late
                )
                for side in ("operator", "floor")
            )
            profile = sizes[name]["sides"]["operator"].get("churn_profile")
            out += [
                f"**{what} at {name}.** {ours}, against the floor's {floor} for the same "
                "changes."
                + (
                    " The operator under churn, all of it:"
                    if profile
                    else " py-spy did not sample this size's churn, so no profile here says "
                    "what bounds it."
                ),
                "",
                *([_profile_text(profile), ""] if profile else []),
            ]
    for name in sizes:
        if f"{name}: operator peak RSS ≤ ½ istiod's" not in missed:
            continue
        model = sizing(results)
        ours = sizes[name]["sides"]["operator"]["rss_peak_kib"] / MIB
        theirs = sizes[name]["sides"]["istiod"]["rss_peak_kib"] / MIB
        text = (
            f"**Peak RSS at {name}.** {ours:.1f} MiB against istiod's {theirs:.1f} MiB: "
            f"{ours - theirs / 2:.1f} MiB over half."
        )
        if model is not None:
            text += (
                f" The sizing model below puts {model.base_mib:.0f} MiB of it in the interpreter, "
                "its libraries and what does not grow with the cluster, which a small cluster "
                "cannot spread; `Where the memory goes` above measures each import."
            )
        out += [text, ""]
    return out


def _round_up(mib: float, step: int) -> int:
    return int(-(-mib // step) * step)


def chart_resources(results: Mapping[str, Any]) -> dict[str, str] | None:
    """The chart's memory request and limit from a run (pure), or None."""
    model = sizing(results)
    sizes = results.get("sizes") or {}
    if model is None or REQUEST_AT not in sizes or LIMIT_AT not in sizes:
        return None
    request = model.settled_mib(sizes[REQUEST_AT]["size"])
    limit = model.peak_ratio * model.settled_mib(sizes[LIMIT_AT]["size"]) * LIMIT_HEADROOM
    return {"request": f"{_round_up(request, 16)}Mi", "limit": f"{_round_up(limit, 64)}Mi"}


def sizing_lines(results: Mapping[str, Any]) -> list[str]:
    """How to size the operator's memory, with the arithmetic (pure)."""
    model = sizing(results)
    resources = chart_resources(results)
    if model is None or resources is None:
        return []
    sizes = results["sizes"]
    b = model.per_object
    lines = [
        "### Sizing the operator's memory",
        "",
        "From the bytes per object above (at the largest traced size) and the settled RSS at S "
        "and L, the operator's settled resident memory is about",
        "",
        f"    {model.base_mib:.0f} MiB + {model.overhead:.2f} x ("
        + " + ".join(f"{b[k]:,.0f} B x {COUNTS[k]}" for k in KINDS)
        + ")",
        "",
        f"where {model.base_mib:.0f} MiB is the interpreter, its libraries and what does not "
        f"grow with the cluster, and {model.overhead:.2f} is resident bytes per traced byte "
        "(the allocator's arenas and fragmentation), both solved from S and L. Its peak, while "
        f"it lists everything at start, was {model.peak_ratio:.2f}x its settled RSS at L.",
        "",
        "| size | estimated settled | measured settled | measured peak |",
        "|---|---|---|---|",
    ]
    for name, size in sizes.items():
        ours = size["sides"]["operator"]
        lines.append(
            f"| {name} | {model.settled_mib(size['size']):.0f} MiB | "
            f"{ours['rss_settled_kib'] / MIB:.0f} MiB | {ours['rss_peak_kib'] / MIB:.0f} MiB |"
        )
    lines += [
        "",
        f"**The chart's defaults** (`resources` in charts/ambient-operator/values.yaml) follow: "
        f"the memory request is the estimate for {REQUEST_AT} "
        f"({model.settled_mib(sizes[REQUEST_AT]['size']):.0f} MiB, rounded up to 16 MiB: "
        f"{resources['request']}); the limit is the estimate for {LIMIT_AT} times its measured "
        f"peak-to-settled ratio times {LIMIT_HEADROOM} "
        f"({model.settled_mib(sizes[LIMIT_AT]['size']):.0f} x {model.peak_ratio:.2f} x "
        f"{LIMIT_HEADROOM}, rounded up to 64 MiB: {resources['limit']}). A larger cluster sets "
        "both from the formula; tests/test_growth_bench.py checks the chart against "
        f"{CHART_DIR}/results.json.",
    ]
    return lines


def block_of(document: str, begin: str = BEGIN, end: str = END) -> str | None:
    """The section of `document` between the markers (growth's unless given), markers
    included; None when it has none (pure)."""
    if begin not in document or end not in document:
        return None
    return begin + document.split(begin, 1)[1].split(end, 1)[0] + end


def splice(document: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """`document` with its section between the markers (growth's unless given) replaced
    by `block`, or `block` appended (pure)."""
    if begin in document and end in document:
        head, rest = document.split(begin, 1)
        _, tail = rest.split(end, 1)
        return head + block + tail
    return document.rstrip() + "\n\n" + block + "\n"


def write(results: Mapping[str, Any], out: Path, doc: Path | None) -> list[Path]:
    """results.json, the charts, and the document's section (with the charts beside it)."""
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "results.json"
    saved.write_text(json.dumps(results, indent=1))
    written = [saved, *charts(results, out)]
    if doc is not None:
        target = doc.parent / CHART_DIR
        target.mkdir(parents=True, exist_ok=True)
        # The results too: the chart's defaults are checked against them.
        for made in written[:]:
            shutil.copy(made, target / made.name)
            written.append(target / made.name)
        doc.write_text(
            splice(doc.read_text() if doc.exists() else "# Performance\n", section(results))
        )
        written.append(doc)
    return written


RACE_TRIALS = {"idle": 20, "busy": 40}


def races(progress: Callable[[str], None]) -> dict[str, Any]:
    """bench/istiod_race.py both ways: isolated trials, then back to back (--busy)."""
    import istiod_race

    return {
        mode: istiod_race.measure(trials, progress, busy=mode == "busy")
        for mode, trials in RACE_TRIALS.items()
    }


def race_lines(results: Mapping[str, Any]) -> list[str]:
    """Ours against istiod's waypoint controller, idle and busy (pure)."""
    measured = results.get("races") or {}
    if not measured:
        return []
    lines = [
        "### Waypoints against istiod, idle and busy",
        "",
        "bench/istiod_race.py on a cluster of its own (its docstring says how), run by "
        "`bench/growth.py --races`: Gateway created → its Deployment, per side; **idle** "
        "trials each start after 2.1 s without a pass on either side, **busy** ones run back "
        "to back, each Gateway 0.5 s after its namespace while the previous trial's namespaces "
        "are deleted.",
        "",
        "| race | series | n | ours p50 / istiod's p50 | ours p99 / istiod's p99 | ours ÷ istiod's "
        "p50 / p99 |",
        "|---|---|---|---|---|---|",
    ]
    for mode, race in measured.items():
        summaries = race.get("summaries") or {}
        for series, row in deployment_rows(race):
            ours = summaries.get(f"ours {series} deployment") or {}
            theirs = summaries.get(f"istiod {series} deployment") or {}
            if not ours or not theirs:
                continue
            p50, p99 = row.get("ours/istiod p50"), row.get("ours/istiod p99")
            lines.append(
                f"| {mode} | {series} | {int(ours['n'])} | "
                f"{ours['p50'] * 1000:.1f} ms / "
                f"{theirs['p50'] * 1000:.1f} ms | {ours['p99'] * 1000:.1f} ms / "
                f"{theirs['p99'] * 1000:.1f} ms | "
                + (f"{p50:.2f}x / {p99:.2f}x" if p50 is not None and p99 is not None else "—")
                + " |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure (or reload) and write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="S,M,L", help="comma-separated, of S, M, L")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--doc", type=Path, default=DOC, help="'-' for none")
    parser.add_argument("--from-results", type=Path, help="rewrite from a results.json")
    parser.add_argument(
        "--raw", type=Path, help="also keep py-spy's collapsed stacks in this directory"
    )
    parser.add_argument(
        "--races",
        action="store_true",
        help="also race istiod's waypoint controller, idle and busy (about 6 more minutes)",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))

    def progress(message: str) -> None:
        print(f"{datetime.now(UTC):%H:%M:%S} {message}", file=sys.stderr, flush=True)

    if args.from_results:
        results = json.loads(args.from_results.read_text())
    else:
        wanted = [s.strip() for s in args.sizes.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in SIZES]
        if unknown:
            parser.error(f"unknown sizes {unknown}; known: {', '.join(SIZES)}")

        results = measure([SIZES[s] for s in wanted], Phases(), progress, args.raw)
    if args.races:
        results = {**results, "races": races(progress)}
    doc = None if str(args.doc) == "-" else args.doc
    for path in write(results, args.out, doc):
        print(f"wrote {path}", file=sys.stderr)
    for t in targets(results):
        print(f"{'MET ' if t.met else 'MISS' if t.met is False else '  - '} {t.name}: {t.value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
