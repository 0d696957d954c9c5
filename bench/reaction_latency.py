"""How fast the operator's write follows the write that calls for it (issues 8 and 4).

    .venv/bin/python bench/reaction_latency.py [--trials 200] [--join-trials 50]

Starts a private local control plane with the sample nodes minus the WS2025
one, an AmbientMesh and `ambient-operator run`, then times, per trial, from
just before the triggering request to the arrival of the watch event that
shows the operator's resulting write:

- namespace: `istio.io/dataplane-mode` set to a new invalid value -> the
  Warning Event `InvalidDataplaneMode` naming that value;
- gateway: a Gateway of class `ambient-waypoint` (listener mesh 15008 HBONE)
  created -> its waypoint Deployment;
- node: a Node joins (linux/s390x, so no agent pod churn follows) -> the
  AmbientMesh status counting it;
- node join (issue 4): a WS2025 node joins while no node of that build
  exists -> the per-build DaemonSet `ztunnel-windows-ltsc2025`.

The floor of each kind is the same client making the same kind of write
(a namespace label, a Gateway of an unclaimed class, a Node) and waiting
for the watch event of that write itself, measured right before the
operator's trial. A second floor, "chain", is a zero-logic reactor in this
process: it watches ConfigMaps and answers each with a write; it is what any
controller doing write -> watch -> write -> watch could reach.

Each trial starts only after the operator made no reconcile pass for 2.1 s,
so every change is an isolated one: under sustained churn the operator
deliberately spaces passes further apart (up to 5 s).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import (
    KWOK_NODE_ANNOTATION,
    LocalCluster,
    create_nodes,
    default_bin_dir,
    parse_inventory,
    to_kwok_node,
)
from ambient_devcluster.harness import (
    OPERATOR_USER,
    SAMPLE_NODES,
    AuditLog,
    current,
    get_mesh,
    is_write,
    wait_for,
    ws2025_node,
)
from ambient_operator.api import constants as c
from benchlib import (
    AGENTS_NS,
    BenchOperator,
    Watcher,
    install_basics,
    named,
    summary,
)

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
WAYPOINT_CLASS = "ambient-waypoint"
WS2025_ZTUNNEL = "ztunnel-windows-ltsc2025"
WS2025_CNI = "istio-cni-node-windows-ltsc2025"
TIMEOUT = 60.0
KINDS = ("namespace", "gateway", "node")
# Who the benchmark client is in the audit log (the devcluster's admin kubeconfig).
CLIENT_USER = "kubernetes-admin"
# The parts of a trial, from the audit log: the trigger's time in the API server, the
# reactor's share (trigger stored -> its first request received: watch delivery,
# debounce, its own work, its client), the reactor's requests (first received -> last
# done, so sequential ones count with the gaps between them), and the rest (this
# client's request overhead and the watch event back to it).
PARTS = ("trigger", "reactor", "requests", "rest")


def base_nodes() -> list[dict[str, Any]]:
    """The sample mixed inventory without its WS2025 node."""
    return [
        n
        for n in parse_inventory(SAMPLE_NODES.read_text())
        if (n["metadata"].get("labels") or {}).get(c.LABEL_WINDOWS_BUILD) != c.BUILD_WS2025
    ]


def s390x_node(name: str) -> dict[str, Any]:
    """A Linux node on an architecture the agents are not built for (no DaemonSet pod).

    Not handed to kwok: nothing needs to run there.
    """
    body = to_kwok_node(
        {
            "metadata": {"name": name, "labels": {c.LABEL_OS: "linux", c.LABEL_ARCH: "s390x"}},
            "status": {"nodeInfo": {"kernelVersion": "6.8.0"}},
        }
    )
    del body["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
    return body


def gateway(name: str, class_name: str = WAYPOINT_CLASS) -> dict[str, Any]:
    """A waypoint Gateway with the one valid listener."""
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": class_name,
            "listeners": [{"name": "mesh", "port": c.PORT_HBONE, "protocol": "HBONE"}],
        },
    }


class Reactor:
    """The chain floor: answers each ConfigMap `ping-N` with a ConfigMap `pong-N`."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Reactor:
        """Start reacting; returns when the watch is about to open."""
        self._thread.start()
        self._ready.wait(30)
        return self

    def stop(self) -> None:
        """Stop after the current watch request."""
        self._stop.set()

    def _run(self) -> None:
        selector = "bench/role=ping"
        listed = self.core.list_namespaced_config_map(
            self.namespace, label_selector=selector, _preload_content=False
        )
        rv = json.loads(listed.data)["metadata"]["resourceVersion"]
        self._ready.set()
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self.core.list_namespaced_config_map,
                self.namespace,
                label_selector=selector,
                resource_version=rv,
                timeout_seconds=240,
                deserialize=False,
            )
            for event in stream:
                obj = event["object"]
                rv = obj["metadata"]["resourceVersion"]
                if event["type"] == "ADDED":
                    number = obj["metadata"]["name"].removeprefix("ping-")
                    with contextlib.suppress(ApiException):
                        self.core.create_namespaced_config_map(
                            self.namespace,
                            {
                                "metadata": {
                                    "name": f"pong-{number}",
                                    "labels": {"bench/role": "pong"},
                                }
                            },
                        )


def _unsupported(mesh: dict[str, Any]) -> set[str]:
    nodes = (mesh.get("status") or {}).get("nodes") or {}
    return {n["name"] for n in nodes.get("unsupportedNodes") or []}


def _timed(write: Callable[[], Any], arrival: Callable[[], float]) -> float:
    started = time.monotonic()
    write()
    return arrival() - started


def _stamp(text: str) -> float:
    """An audit timestamp as seconds since the epoch (the machine's wall clock)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def trial_parts(
    window: tuple[float, float],
    client_events: list[dict[str, Any]],
    reactor_events: list[dict[str, Any]],
) -> dict[str, float] | None:
    """The PARTS of one trial that ran in `window` (wall clock, start and end).

    The trigger is the client's first request received in the window; the
    reactor's requests are those received after the trigger was stored and
    before the window's end. A request's watch event can reach the client
    before the API server logs the request complete, so the last one counts
    up to the window's end at most. None when either is missing.
    """
    start, end = window

    def times(e: dict[str, Any]) -> tuple[float, float]:
        return _stamp(e["requestReceivedTimestamp"]), _stamp(e["stageTimestamp"])

    triggers = sorted(t for t in map(times, client_events) if start <= t[0] <= end)
    if not triggers:
        return None
    received, stored = triggers[0]
    answers = [t for t in map(times, reactor_events) if stored <= t[0] <= end]
    if not answers:
        return None
    first = min(r for r, _ in answers)
    last = min(end, max(d for _, d in answers))
    return {
        "trigger": stored - received,
        "reactor": first - stored,
        "requests": last - first,
        "rest": (received - start) + (end - last),
    }


class ReactionBench:
    """Watches and namespaces of the reaction-latency trials on one cluster."""

    def __init__(
        self, api: client.ApiClient, op: BenchOperator, audit: AuditLog | None = None
    ) -> None:
        self.api = api
        self.op = op
        # Without the audit log, parts() has nothing to tell.
        self.audit = audit
        self.audit_since = audit.mark() if audit else 0
        # (kind, wall-clock start, end) of each operator and chain-floor trial.
        self.windows: list[tuple[str, float, float]] = []
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.samples: dict[str, list[float]] = {}
        for kind in KINDS:
            self.samples[kind] = []
            self.samples[f"{kind} floor"] = []
        self.samples["chain floor"] = []
        for ns in ("bench-react", "bench-floor", "bench-gw", "bench-gw-floor", "bench-chain"):
            self.core.create_namespace({"metadata": {"name": ns}})
        self.watch_events = Watcher(
            self.core.list_namespaced_event,
            "default",
            field_selector="involvedObject.kind=Namespace",
        ).start()
        self.watch_namespaces = Watcher(self.core.list_namespace).start()
        self.watch_deployments = Watcher(self.apps.list_namespaced_deployment, "bench-gw").start()
        self.watch_gateways = Watcher(
            self.custom.list_namespaced_custom_object,
            GW_GROUP,
            GW_VERSION,
            "bench-gw-floor",
            "gateways",
        ).start()
        self.watch_nodes = Watcher(self.core.list_node).start()
        self.watch_mesh = Watcher(
            self.custom.list_cluster_custom_object, c.API_GROUP, c.API_VERSION, c.PLURAL
        ).start()
        self.watch_pongs = Watcher(
            self.core.list_namespaced_config_map, "bench-chain", label_selector="bench/role=pong"
        ).start()
        self.reactor = Reactor(api, "bench-chain").start()
        self.trial = 0

    def close(self) -> None:
        """Stop the watches and remove what the trials created."""
        self.reactor.stop()
        for w in (
            self.watch_events,
            self.watch_namespaces,
            self.watch_deployments,
            self.watch_gateways,
            self.watch_nodes,
            self.watch_mesh,
            self.watch_pongs,
        ):
            w.stop()
        for ns in ("bench-react", "bench-floor", "bench-gw", "bench-gw-floor", "bench-chain"):
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(ns)

    def _timed(self, kind: str, write: Callable[[], Any], arrival: Callable[[], float]) -> None:
        """One trial of `kind`: its sample, and its window for :meth:`parts`."""
        start = time.time()
        sample = _timed(write, arrival)
        self.samples[kind].append(sample)
        self.windows.append((kind, start, start + sample))

    def clear(self) -> None:
        """Forget the samples so far (a warm-up's)."""
        for values in self.samples.values():
            values.clear()
        self.windows.clear()
        self.audit_since = self.audit.mark() if self.audit else 0

    def parts(self) -> dict[str, dict[str, list[float]]]:
        """Per kind (and the chain floor), each of PARTS across its trials, in seconds.

        The operator's requests are its own user's; the chain floor's reactor is
        this client, whose answer is its second request in the window.
        """
        if self.audit is None:
            return {}
        # A watch or list completes when it ends, long after it was received.
        ours = [
            e
            for e in self.audit.events(self.audit_since, user=OPERATOR_USER)
            if e["verb"] not in ("watch", "list")
        ]
        mine = [e for e in self.audit.events(self.audit_since, user=CLIENT_USER) if is_write(e)]
        out: dict[str, dict[str, list[float]]] = {}
        for kind, start, end in self.windows:
            if kind == "chain floor":
                inside = sorted(
                    (e for e in mine if start <= _stamp(e["requestReceivedTimestamp"]) <= end),
                    key=lambda e: _stamp(e["requestReceivedTimestamp"]),
                )
                got = trial_parts((start, end), inside[:1], inside[1:])
            else:
                got = trial_parts((start, end), mine, ours)
            if got is not None:
                for part, value in got.items():
                    out.setdefault(kind, {}).setdefault(part, []).append(value)
        return out

    # -- one trial of each kind ------------------------------------------------------------
    def namespace(self, i: int) -> None:
        """Floor: a label on a namespace; operator: the Warning Event for a bad label."""
        event = self.watch_events.expect(
            lambda _t, o: (
                o["involvedObject"]["name"] == "bench-react"
                and o["reason"] == "InvalidDataplaneMode"
                and f"'bad-{i}'" in o["message"]
            )
        )
        self._timed(
            "namespace",
            lambda: self.core.patch_namespace(
                "bench-react", {"metadata": {"labels": {c.LABEL_DATAPLANE_MODE: f"bad-{i}"}}}
            ),
            lambda: event.wait(TIMEOUT, "the InvalidDataplaneMode Event"),
        )
        floor = self.watch_namespaces.expect(
            lambda _t, o: (
                o["metadata"]["name"] == "bench-floor"
                and (o["metadata"].get("labels") or {}).get("bench/value") == f"v{i}"
            )
        )
        self.samples["namespace floor"].append(
            _timed(
                lambda: self.core.patch_namespace(
                    "bench-floor", {"metadata": {"labels": {"bench/value": f"v{i}"}}}
                ),
                lambda: floor.wait(TIMEOUT, "the floor namespace label"),
            )
        )

    def gateway(self, i: int) -> None:
        """Floor: a Gateway nobody serves; operator: the waypoint Deployment of ours."""
        deployment = self.watch_deployments.expect(named(f"wp-{i}", "ADDED"))
        self._timed(
            "gateway",
            lambda: self.custom.create_namespaced_custom_object(
                GW_GROUP, GW_VERSION, "bench-gw", "gateways", gateway(f"wp-{i}")
            ),
            lambda: deployment.wait(TIMEOUT, f"Deployment wp-{i}"),
        )
        floor = self.watch_gateways.expect(named(f"floor-{i}", "ADDED"))
        self.samples["gateway floor"].append(
            _timed(
                lambda: self.custom.create_namespaced_custom_object(
                    GW_GROUP,
                    GW_VERSION,
                    "bench-gw-floor",
                    "gateways",
                    gateway(f"floor-{i}", "bench-unclaimed"),
                ),
                lambda: floor.wait(TIMEOUT, "the floor Gateway"),
            )
        )

    def node(self, i: int) -> None:
        """Floor: a Node created (and removed); operator: the status listing the new node.

        An s390x node is unsupported, so the status names it in unsupportedNodes;
        waiting for its name (not a count) cannot be fooled by the floor's node.
        """
        floor_name, name = f"floor-node-{i}", f"joining-{i}"
        counted = self.watch_mesh.expect(lambda _t, o: name in _unsupported(o))
        self._timed(
            "node",
            lambda: self.core.create_node(s390x_node(name)),
            lambda: counted.wait(TIMEOUT, "the AmbientMesh status to list the node"),
        )
        floor = self.watch_nodes.expect(named(floor_name, "ADDED"))
        self.samples["node floor"].append(
            _timed(
                lambda: self.core.create_node(s390x_node(floor_name)),
                lambda: floor.wait(TIMEOUT, "the floor Node"),
            )
        )
        gone = self.watch_mesh.expect(
            lambda _t, o: name not in _unsupported(o) and floor_name not in _unsupported(o)
        )
        self.core.delete_node(floor_name)
        self.core.delete_node(name)
        gone.wait(TIMEOUT, "the AmbientMesh status to drop both nodes")

    def chain(self, i: int) -> None:
        """Floor: write -> watch -> write -> watch with no logic in between."""
        pong = self.watch_pongs.expect(named(f"pong-{i}", "ADDED"))
        self._timed(
            "chain floor",
            lambda: self.core.create_namespaced_config_map(
                "bench-chain",
                {"metadata": {"name": f"ping-{i}", "labels": {"bench/role": "ping"}}},
            ),
            lambda: pong.wait(TIMEOUT, f"pong-{i}"),
        )

    def run(self, trials: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
        """`trials` isolated trials of each kind, interleaved."""
        trial_of = {"namespace": self.namespace, "gateway": self.gateway, "node": self.node}
        for n in range(trials):
            i = self.trial
            self.trial += 1
            self.chain(i)
            # Rotate the order so no kind always follows the same one.
            for k in range(len(KINDS)):
                kind = KINDS[(i + k) % len(KINDS)]
                self.op.wait_quiet()
                trial_of[kind](i)
            if (n + 1) % 20 == 0 or n + 1 == trials:
                p50 = {k: round(summary(self.samples[k])["p50"] * 1000) for k in KINDS}
                progress(f"reaction: {n + 1}/{trials} trials, p50 ms {p50}")
        return self.samples


# The operator's loop is idle (waiting for a change) only once it made no pass for
# longer than its longest spacing gap (5 s): a stray event shortly after a pass puts
# it to sleep for that gap, and a change arriving then waits for the gap's end.
IDLE_QUIET_SECONDS = 5.2


def node_join(
    api: client.ApiClient,
    op: BenchOperator,
    trials: int,
    progress: Callable[[str], None],
    quiet: float = IDLE_QUIET_SECONDS,
) -> dict[str, list[float]]:
    """Seconds from a WS2025 node's create to its DaemonSets (none existed before)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    daemonsets = Watcher(apps.list_namespaced_daemon_set, AGENTS_NS).start()
    samples: dict[str, list[float]] = {
        "ztunnel": [],
        "istio-cni": [],
        "desired=1": [],
        "create request": [],
        "quiet": [quiet],
    }
    try:
        for i in range(trials):
            op.wait_quiet(quiet)
            if apps.list_namespaced_daemon_set(
                AGENTS_NS, field_selector=f"metadata.name={WS2025_ZTUNNEL}"
            ).items:
                raise RuntimeError(f"{WS2025_ZTUNNEL} exists before the trial")
            name = f"ws2025-join-{i}"
            ztunnel = daemonsets.expect(named(WS2025_ZTUNNEL, "ADDED"))
            cni = daemonsets.expect(named(WS2025_CNI, "ADDED"))
            scheduled = daemonsets.expect(
                lambda _t, o: (
                    o["metadata"]["name"] == WS2025_ZTUNNEL
                    and (o.get("status") or {}).get("desiredNumberScheduled") == 1
                )
            )
            started = time.monotonic()
            core.create_node(to_kwok_node(ws2025_node(name)))
            samples["create request"].append(time.monotonic() - started)
            samples["ztunnel"].append(ztunnel.wait(TIMEOUT, WS2025_ZTUNNEL) - started)
            samples["istio-cni"].append(cni.wait(TIMEOUT, WS2025_CNI) - started)
            samples["desired=1"].append(
                scheduled.wait(TIMEOUT, "desiredNumberScheduled=1") - started
            )
            pruned = daemonsets.expect(named(WS2025_ZTUNNEL, "DELETED"))
            core.delete_node(name)
            pruned.wait(TIMEOUT, f"{WS2025_ZTUNNEL} pruned after the node left")
            if (i + 1) % 10 == 0 or i + 1 == trials:
                p50 = summary(samples["ztunnel"])["p50"] * 1000
                progress(f"node join: {i + 1}/{trials} trials, p50 {p50:.0f} ms")
    finally:
        daemonsets.stop()
    return samples


def prepare(cluster: LocalCluster, api: client.ApiClient, workdir: Path) -> BenchOperator:
    """Nodes, CRDs, istiod, the AmbientMesh and a running operator whose mesh is Ready."""
    create_nodes(api, base_nodes(), timeout=120)
    install_basics(api)
    op = BenchOperator(cluster, workdir / "operator-reaction.log")
    op.start()
    wait_for(lambda: current(get_mesh(api), "Ready"), 180, "AmbientMesh Ready=True")
    wait_for(
        lambda: any(
            current(gc, "Accepted")
            for gc in client.CustomObjectsApi(api)
            .list_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses")
            .get("items", [])
            if gc["metadata"]["name"] == WAYPOINT_CLASS
        ),
        60,
        f"GatewayClass {WAYPOINT_CLASS} Accepted",
    )
    return op


def measure(
    cluster: LocalCluster,
    api: client.ApiClient,
    workdir: Path,
    trials: int,
    join_trials: int,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Both benchmarks on one cluster; samples in seconds."""
    op = prepare(cluster, api, workdir)
    try:
        # Warm up every path once (template compilation, first connections).
        bench = ReactionBench(api, op, AuditLog(cluster.audit_log))
        try:
            bench.run(1, lambda _msg: None)
            bench.clear()
            reaction = bench.run(trials, progress)
            parts = bench.parts()
        finally:
            bench.close()
        join = node_join(api, op, join_trials, progress)
        alive = op.alive()
    finally:
        op.stop()
    return {"reaction": reaction, "parts": parts, "join": join, "operator_survived": alive}


def main() -> int:
    """Run both benchmarks on a private cluster and print their quantiles."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--join-trials", type=int, default=50)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="reaction-bench-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=default_bin_dir(), verbose=False) as cluster,
        cluster.api_client() as api,
    ):
        result = measure(cluster, api, Path(tmp), args.trials, args.join_trials)
    for group in ("reaction", "join"):
        for name, values in result[group].items():
            s = summary(values)
            print(
                f"{group:9} {name:16} n={len(values):4} p50 {s['p50'] * 1000:7.1f} ms  "
                f"p95 {s['p95'] * 1000:7.1f} ms  p99 {s['p99'] * 1000:7.1f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
