"""The operator on a large simulated cluster: convergence time, API requests, memory.

    .venv/bin/python bench/scale.py [--nodes 500] [--namespaces 1000] [--waypoints 200]
                                    [--pods 5000]

Populates a private local control plane first (concurrently, from a thread
pool): kwok nodes in bench/render_scale.py's OS/build mix, namespaces (every
other one enrolled), waypoint Gateways of class `ambient-waypoint` in
enrolled namespaces (which also carry `istio.io/use-waypoint`), and bare pods
bound to kwok nodes by `nodeName` and spread over all namespaces. Once kwok
runs every pod and kube-controller-manager has finished its per-namespace
work, `ambient-operator run` starts, and the clock starts with it:

- converged: AmbientMesh Reconciled=True and Ready=True for its generation,
  status counting every node, each DaemonSet's desired count equal to the
  nodes render assigns it, and every Gateway Programmed=True;
- requests: the operator's own API requests from the audit log between its
  start and convergence, by verb (watches appear only once they end);
- memory: VmHWM (peak RSS) of the operator process;
- no-op: the operator restarted after convergence with a 10 s resync, left
  for its first pass and two resyncs; every write it makes is counted.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

import render_scale
from ambient_devcluster import LocalCluster, default_bin_dir, to_kwok_node
from ambient_devcluster.harness import AuditLog, current, get_mesh, wait_for
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.render import render_dataplane
from ambient_operator.runtime.memory import REPORT_ENV
from ambient_operator.webhook.decide import ANNOTATION as WAIT_ANNOTATION
from benchlib import (
    AGENTS_NS,
    BenchOperator,
    by_verb,
    cpu_seconds,
    install_basics,
    proc_status_kib,
    writes,
)

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
MANAGED = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
THREADS = 16


@dataclass(frozen=True)
class Scale:
    """How big the simulated cluster is."""

    nodes: int = 500
    namespaces: int = 1000
    waypoints: int = 200
    pods: int = 5000


def _client(kubeconfig: Path) -> client.ApiClient:
    """An ApiClient whose connection pool fits the thread pool."""
    cfg = client.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = THREADS * 2
    return client.ApiClient(cfg)


def _ignore_exists(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except ApiException as exc:
        if exc.status != 409:
            raise


def _parallel(work: Iterable[Callable[[], Any]]) -> None:
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for future in [pool.submit(job) for job in work]:
            future.result()


def _namespace_name(i: int) -> str:
    return f"scale-{i:04d}"


def waypoint_gateway() -> dict[str, Any]:
    """The waypoint Gateway of the scenario, named `waypoint`, for any namespace."""
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": "waypoint"},
        "spec": {
            "gatewayClassName": "ambient-waypoint",
            "listeners": [{"name": "mesh", "port": c.PORT_HBONE, "protocol": "HBONE"}],
        },
    }


def populate(
    api: client.ApiClient,
    scale: Scale,
    progress: Callable[[str], None],
    controller_manager: bool = True,
    admitted: bool = False,
) -> dict[str, Any]:
    """Create every object of the scenario; returns what render needs to know.

    Settled once kwok runs every pod and, with a `controller_manager`
    running, once it has published every namespace's root CA. `admitted`
    Windows pods carry the webhook's annotation (opted out); without it each
    is a pod the webhook missed, told about with an Event.
    """
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    rng = random.Random(11)
    began = time.monotonic()

    raw_nodes = render_scale.inventory(scale.nodes)
    _parallel(
        (
            lambda n=n: _ignore_exists(
                lambda: core.create_node(to_kwok_node(n), _preload_content=False)
            )
        )
        for n in raw_nodes
    )
    progress(f"scale: {scale.nodes} nodes created ({time.monotonic() - began:.0f}s)")

    waypoint_ns = {
        _namespace_name(2 * i) for i in range(min(scale.waypoints, scale.namespaces // 2))
    }

    def make_namespace(i: int) -> None:
        name = _namespace_name(i)
        labels = {c.LABEL_DATAPLANE_MODE: "ambient"} if i % 2 == 0 else {}
        if name in waypoint_ns:
            labels[c.LABEL_USE_WAYPOINT] = "waypoint"
        _ignore_exists(
            lambda: core.create_namespace(
                {"metadata": {"name": name, "labels": labels}}, _preload_content=False
            )
        )
        # Pods need the default ServiceAccount; making it here spares waiting
        # for the controller to make a thousand of them at its own pace.
        _ignore_exists(
            lambda: core.create_namespaced_service_account(
                name, {"metadata": {"name": "default"}}, _preload_content=False
            )
        )

    _parallel((lambda i=i: make_namespace(i)) for i in range(scale.namespaces))
    progress(f"scale: {scale.namespaces} namespaces created ({time.monotonic() - began:.0f}s)")

    gateway = waypoint_gateway()
    _parallel(
        (
            lambda ns=ns: _ignore_exists(
                lambda: custom.create_namespaced_custom_object(
                    GW_GROUP, GW_VERSION, ns, "gateways", gateway
                )
            )
        )
        for ns in sorted(waypoint_ns)
    )
    progress(f"scale: {len(waypoint_ns)} Gateways created ({time.monotonic() - began:.0f}s)")

    facts = ClusterFacts.from_nodes(raw_nodes)
    plans = render_dataplane(AmbientMeshSpec(), facts).daemonsets
    linux_nodes = sorted({n for p in plans if p.platform == "linux" for n in p.nodes})
    windows_nodes = sorted({n for p in plans if p.platform != "linux" for n in p.nodes})

    def pod(j: int) -> tuple[str, dict[str, Any]]:
        windows = bool(windows_nodes) and rng.random() < 0.15
        node = rng.choice(windows_nodes if windows else linux_nodes)
        annotations = {c.ANNOTATION_REDIRECTION: "enabled"} if rng.random() < 0.5 else {}
        spec: dict[str, Any] = {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        }
        if windows and admitted:
            # Opted out of the workaround (the webhook's annotation, value
            # false), so no pod is one the webhook missed: steady state, not
            # a cluster full of Windows pods from before the operator.
            annotations[WAIT_ANNOTATION] = "false"
        if windows:
            spec["nodeSelector"] = {c.LABEL_OS: "windows"}
            spec["tolerations"] = [{"key": "os", "operator": "Exists"}]
        body = {
            "metadata": {"name": f"pod-{j:05d}", "annotations": annotations},
            "spec": spec,
        }
        return _namespace_name(j % scale.namespaces), body

    bodies = [pod(j) for j in range(scale.pods)]
    # The response is not read into a model: at 50,000 pods that alone would
    # keep this client's core busy for minutes.
    _parallel(
        (
            lambda ns=ns, b=b: _ignore_exists(
                lambda: core.create_namespaced_pod(ns, b, _preload_content=False)
            )
        )
        for ns, b in bodies
    )
    progress(f"scale: {scale.pods} pods created ({time.monotonic() - began:.0f}s)")

    def settled() -> bool:
        # kwok runs every pod, and the controller manager's per-namespace work is done.
        waiting = core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Running", limit=1
        ).items
        if not controller_manager:
            return not waiting
        roots = core.list_config_map_for_all_namespaces(
            field_selector="metadata.name=kube-root-ca.crt", _preload_content=False
        )
        return not waiting and len(json.loads(roots.data)["items"]) >= scale.namespaces

    wait_for(settled, 1200, "every pod Running and every namespace's root CA", interval=2)
    populate_s = time.monotonic() - began
    progress(f"scale: cluster populated and settled in {populate_s:.0f}s")
    return {
        "populate_s": populate_s,
        "expected_nodes": {p.name: len(p.nodes) for p in plans},
        "node_total": len(raw_nodes),
        "gateways": len(waypoint_ns),
    }


class Progress:
    """First time (seconds after the operator's start) each milestone was seen."""

    def __init__(
        self,
        api: client.ApiClient,
        expected: dict[str, Any],
        started: float,
        pids: Mapping[str, int] | None = None,
    ) -> None:
        self.api = api
        self.expected = expected
        self.started = started
        self.seen: dict[str, float] = {}
        # CPU seconds each process (control plane and operator) used from the
        # start to each milestone: what the 2 cores were busy with meanwhile.
        self.pids = dict(pids or {})
        self.cpu_start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.cpu: dict[str, dict[str, float]] = {}

    def _mark(self, name: str, reached: bool) -> bool:
        if reached and name not in self.seen:
            self.seen[name] = time.monotonic() - self.started
            self.cpu[name] = {
                proc: round(cpu_seconds(pid) - self.cpu_start[proc], 2)
                for proc, pid in self.pids.items()
            }
        return reached

    def check(self) -> bool:
        """One poll of the cluster; True once converged."""
        mesh = get_mesh(self.api)
        status = mesh.get("status") or {}
        apps, custom = client.AppsV1Api(self.api), client.CustomObjectsApi(self.api)
        counted = self._mark(
            "status counts every node",
            (status.get("nodes") or {}).get("total") == self.expected["node_total"],
        )
        daemonsets = {
            ds.metadata.name
            for ds in apps.list_namespaced_daemon_set(AGENTS_NS, label_selector=MANAGED).items
        }
        self._mark("every DaemonSet applied", daemonsets >= set(self.expected["expected_nodes"]))
        deployments = apps.list_deployment_for_all_namespaces(
            label_selector=f"{c.LABEL_GATEWAY_NAME},{MANAGED}", _preload_content=False
        )
        self._mark(
            "every waypoint Deployment applied",
            len(json.loads(deployments.data)["items"]) >= self.expected["gateways"],
        )
        desired = {cs["name"]: cs.get("desired") for cs in status.get("components") or []}
        counts_ok = all(
            desired.get(name) == n for name, n in self.expected["expected_nodes"].items()
        )
        ready = self._mark(
            "AmbientMesh Ready=True",
            current(mesh, "Reconciled") and current(mesh, "Ready") and counts_ok and counted,
        )
        gateways = custom.list_cluster_custom_object(GW_GROUP, GW_VERSION, "gateways")["items"]
        programmed = self._mark(
            "every Gateway Programmed=True",
            len(gateways) >= self.expected["gateways"]
            and all(current(gw, "Programmed") for gw in gateways),
        )
        return self._mark("converged", ready and programmed)


def measure(
    cluster: LocalCluster,
    workdir: Path,
    scale: Scale,
    progress: Callable[[str], None] = print,
    timeout: float = 900.0,
    tracemalloc: bool = False,
) -> dict[str, Any]:
    """Populate, start the operator, time its convergence, then count a no-op restart.

    With `tracemalloc`, the operator traces its allocations (slower, and
    larger: its timings and memory figures are then not comparable) and
    reports its largest holders (runtime/memory.py) at convergence and after
    the no-op restart, under `memory_reports`.
    """
    api = _client(cluster.kubeconfig)
    audit = AuditLog(cluster.audit_log)
    install_basics(api)
    expected = populate(api, scale, progress)
    reports = workdir / "memory-reports.jsonl"
    env = {"PYTHONTRACEMALLOC": "10", REPORT_ENV: str(reports)} if tracemalloc else None
    op = BenchOperator(cluster, workdir / "operator-scale.log", env=env)
    result: dict[str, Any] = {
        "scale": scale.__dict__,
        "populate_s": expected["populate_s"],
        "daemonset_nodes": expected["expected_nodes"],
        "agent_pods": sum(expected["expected_nodes"].values()),
    }
    try:
        mark = audit.mark()
        op.start()
        assert op.proc is not None
        watch_progress = Progress(
            api, expected, op.started_at, {**cluster.pids(), "operator": op.proc.pid}
        )
        wait_for(watch_progress.check, timeout, "convergence", interval=0.5)
        converged_mark = audit.mark()
        result["cpu_s"] = cpu_seconds(op.proc.pid)
        result["rss_converged_kib"] = op.rss_kib()
        result["milestones"] = watch_progress.seen
        result["cpu_at_milestones"] = watch_progress.cpu
        if tracemalloc:
            result.setdefault("memory_reports", []).append(_memory_report(op, reports))
        progress(f"scale: converged in {watch_progress.seen['converged']:.1f}s")
        events = audit.events(mark, converged_mark)
        result["requests"] = by_verb(events)
        result["writes_by_resource"] = _by_resource(events)

        # Let the first run finish what it does after convergence, then restart.
        op.wait_quiet(quiet=3.0, timeout=300)
        result["rss_peak_first_kib"] = op.rss_kib()
        op.stop()
        mark = audit.mark()
        op.start(["--resync-seconds", "10"])

        def passes() -> bool:
            return op.metric(
                "ambient_operator_reconcile_duration_seconds_count", controller="dataplane"
            ) >= 3 and (
                scale.waypoints == 0
                or op.metric("ambient_operator_reconcile_total", controller="waypoints") >= 2
            )

        wait_for(passes, 180, "a first pass and two resyncs after the restart", interval=0.5)
        noop = audit.events(mark)
        result["noop_requests"] = by_verb(noop)
        result["noop_writes"] = writes(noop)
        result["rss_peak_kib"] = op.rss_kib()
        assert op.proc is not None
        result["rss_restart_peak_kib"] = proc_status_kib(op.proc.pid, "VmHWM")
        result["rss_steady_kib"] = op.rss_now_kib()
        if tracemalloc:
            result.setdefault("memory_reports", []).append(_memory_report(op, reports))
        result["operator_survived"] = op.alive()
    finally:
        op.stop()
        api.close()
    return result


def _memory_report(op: BenchOperator, path: Path) -> dict[str, Any]:
    """Ask the operator for a memory report (SIGUSR2) and return it, with its RSS then."""
    done = len(path.read_text().splitlines()) if path.exists() else 0
    assert op.proc is not None
    op.proc.send_signal(signal.SIGUSR2)
    line: str = wait_for(
        lambda: (path.read_text().splitlines()[done:] or [None])[0] if path.exists() else None,
        600,  # a snapshot of every traced allocation takes minutes at this scale
        "the operator's memory report",
    )
    answer: dict[str, Any] = json.loads(line)
    answer["rss_kib"] = op.rss_now_kib()
    answer["rss_peak_kib"] = proc_status_kib(op.proc.pid, "VmHWM")
    return answer


def _by_resource(events: Iterable[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in writes(events):
        verb, resource = line.split()[:2]
        key = f"{verb} {resource}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def main() -> int:
    """Run on a private cluster and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Scale()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--namespaces", type=int, default=defaults.namespaces)
    parser.add_argument("--waypoints", type=int, default=defaults.waypoints)
    parser.add_argument("--pods", type=int, default=defaults.pods)
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the operator's allocations and report its largest holders",
    )
    args = parser.parse_args()
    scale = Scale(args.nodes, args.namespaces, args.waypoints, args.pods)
    with (
        tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=default_bin_dir(), verbose=False) as cluster,
    ):
        result = measure(cluster, Path(tmp), scale, tracemalloc=args.tracemalloc)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
