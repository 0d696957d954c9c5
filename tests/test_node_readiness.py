"""Node readiness gating on the local control plane, under the chart's RBAC.

The operator runs as the chart's ServiceAccount with `nodeReadiness.enabled`
(the chart's grant of `patch` on Nodes). Nodes of this module carry the
readiness taint; the real DaemonSet controller and scheduler place the
agents and kwok makes them Ready. One Linux node has too little CPU for
ztunnel's request (200m of 150m allocatable), so its istio-cni becomes Ready
while its ztunnel stays Pending: that holds one agent not Ready for as long
as the test wants, until it raises the node's allocatable CPU.

A watch of the nodes and of the agents' pods records every version the API
server stored; resourceVersions of one etcd are one sequence, so the
timeline tells whether a taint left before or after an agent became Ready.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client, watch

from ambient_devcluster import LocalCluster, create_nodes, delete_nodes
from ambient_devcluster.harness import borrowed_mesh, current, read_mesh, set_mesh_spec
from ambient_operator.apply.writer import remove_taint
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import load_credentials
from chart_helpers import by_kind, template
from conftest import unique_name, wait_for
from operator_harness import AuditLog, RunningOperator
from test_chart_rbac import Identity, allows, chart_identity, forbidden

READINESS = {"key": "cni.istio.io/not-ready", "effect": "NoSchedule"}
# Another team's taints on the same node: one of the same key with another effect.
DEDICATED = {"key": "example.com/dedicated", "value": "infra", "effect": "NoSchedule"}
SAME_KEY = {"key": "cni.istio.io/not-ready", "effect": "PreferNoSchedule"}
WS2022, WS2025 = "10.0.20348", "10.0.26100"
POOL = "ambient-test/node-readiness"
TIMEOUT = 90.0


# -- offline: the chart --------------------------------------------------------------------


def _cluster_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for role in by_kind(template(values), "ClusterRole") for r in role["rules"]]


def test_the_chart_grants_node_patch_only_when_enabled() -> None:
    off = _cluster_rules({})
    on = _cluster_rules({"nodeReadiness": {"enabled": True}})
    for verb in ("patch", "update", "create", "delete"):
        assert not allows(off, "", "nodes", verb), verb
    assert allows(on, "", "nodes", "patch")
    for verb in ("update", "create", "delete"):
        assert not allows(on, "", "nodes", verb), verb
    # Nothing else changes with the flag.
    extra = [r for r in on if r not in off]
    assert extra == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]


# -- on the local control plane ------------------------------------------------------------


@dataclass
class Timeline:
    """Every version of the module's nodes and agent pods, in the API server's order."""

    # (resourceVersion, node, whether it carries the readiness taint)
    nodes: list[tuple[int, str, bool]] = field(default_factory=list)
    # (resourceVersion, node, component, Ready)
    pods: list[tuple[int, str, str, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def untainted_at(self, node: str) -> int | None:
        """The first version of `node` without the taint."""
        return next((rv for rv, name, tainted in self.nodes if name == node and not tainted), None)

    def ready_at(self, node: str, component: str) -> int | None:
        """The first version in which an agent pod of `component` on `node` was Ready."""
        return next(
            (rv for rv, n, comp, ok in self.pods if n == node and comp == component and ok), None
        )

    def tainted_throughout(self, node: str, until: int) -> bool:
        """Every version of `node` before `until` carried the taint (and there was one)."""
        before = [tainted for rv, name, tainted in self.nodes if name == node and rv < until]
        return bool(before) and all(before)


def _tainted(node: dict[str, Any]) -> bool:
    return any(
        (t.get("key"), t.get("effect")) == (READINESS["key"], READINESS["effect"])
        for t in (node.get("spec") or {}).get("taints") or []
    )


def _pod_ready(pod: dict[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (pod.get("status") or {}).get("conditions") or []
    )


def _follow(
    timeline: Timeline, lister: Callable[..., Any], record: Callable[[dict[str, Any]], None]
) -> threading.Thread:
    version = lister(limit=1).metadata.resource_version
    started = threading.Event()

    def run() -> None:
        nonlocal version
        stream = watch.Watch()
        started.set()
        while not timeline.stop.is_set():
            for event in stream.stream(lister, resource_version=version, timeout_seconds=2):
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "DELETED":
                    record(obj)
                if timeline.stop.is_set():
                    break

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    return thread


@dataclass(frozen=True)
class Setup:
    namespace: str
    identity: Identity
    timeline: Timeline
    op: RunningOperator
    audit: AuditLog
    since: int
    nodes: dict[str, str]  # role -> node name


def _node(
    name: str, os_name: str, build: str | None, cpu: str | None = None, *, pool: bool = True
) -> dict[str, Any]:
    labels = {"kubernetes.io/os": os_name, "kubernetes.io/arch": "amd64"}
    if pool:
        labels[POOL] = "yes"
    info = {"operatingSystem": os_name, "architecture": "amd64"}
    if build:
        labels["node.kubernetes.io/windows-build"] = build
        info["kernelVersion"] = f"{build}.2762"
    status: dict[str, Any] = {"nodeInfo": info}
    if cpu:
        status["allocatable"] = {"cpu": cpu}
    taints = [READINESS, DEDICATED, SAME_KEY] if cpu else [READINESS]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": status,
    }


def _spec(namespace: str, enabled: bool) -> dict[str, Any]:
    selector = {POOL: "yes"}  # the session's other nodes are not this module's
    return {
        "namespace": namespace,
        "platforms": {
            "linux": {"nodeSelector": selector},
            "windows": {"enabled": True, "nodeSelector": selector},
        },
        "nodeReadiness": {"enabled": enabled},
    }


@pytest.fixture(scope="module")
def setup(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    core = client.CoreV1Api(k8s)
    # The agents' usual namespace: the mesh's DaemonSets there become this
    # module's, so no other agent competes for the held node's CPU.
    namespace = "istio-system"
    nodes = {
        "held": unique_name("nr-linux-held"),
        "ws2022": unique_name("nr-ws2022"),
        "ws2025": unique_name("nr-ws2025"),
        # Joins the pool later (kwok misses pods bound to a node before it manages it).
        "off": unique_name("nr-linux-off"),
    }
    values = {"nodeReadiness": {"enabled": True}}
    timeline = Timeline()

    def record_node(obj: dict[str, Any]) -> None:
        if POOL in (obj["metadata"].get("labels") or {}):
            rv = int(obj["metadata"]["resourceVersion"])
            timeline.nodes.append((rv, obj["metadata"]["name"], _tainted(obj)))

    def record_pod(obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        component = (meta.get("labels") or {}).get("app.kubernetes.io/component")
        node = (obj.get("spec") or {}).get("nodeName")
        if component and node:
            timeline.pods.append((int(meta["resourceVersion"]), node, component, _pod_ready(obj)))

    audit = AuditLog(cluster.audit_log)
    with chart_identity(cluster, k8s, values) as identity:
        threads = [
            _follow(timeline, core.list_node, record_node),
            _follow(
                timeline,
                lambda **kw: core.list_namespaced_pod(namespace, **kw),
                record_pod,
            ),
        ]
        create_nodes(
            k8s,
            [
                _node(nodes["held"], "linux", None, cpu="150m"),
                _node(nodes["ws2022"], "windows", WS2022),
                _node(nodes["ws2025"], "windows", WS2025),
                _node(nodes["off"], "linux", None, pool=False),
            ],
            timeout=60,
        )
        op = RunningOperator(
            cluster,
            tmp_path_factory.mktemp("node-readiness"),
            extra_args=[*identity.operator_args, "--resync-seconds", "5"],
            kubeconfig=identity.kubeconfig,
        )
        try:
            with borrowed_mesh(k8s, lambda _original: _spec(namespace, True)):
                since = audit.mark()
                with op.running():
                    yield Setup(namespace, identity, timeline, op, audit, since, nodes)
        finally:
            timeline.stop.set()
            for thread in threads:
                thread.join(10)
            delete_nodes(k8s, [*nodes.values(), *EXTRA_NODES], timeout=60)
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


# Nodes the tests add besides the fixture's, deleted with them.
EXTRA_NODES: list[str] = []


def _read_node(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    node: dict[str, Any] = k8s.sanitize_for_serialization(client.CoreV1Api(k8s).read_node(name))
    return node


def _readiness(k8s: client.ApiClient) -> dict[str, Any]:
    return ((read_mesh(k8s) or {}).get("status") or {}).get("nodeReadiness") or {}


def _fail(setup: Setup, what: str) -> None:
    raise AssertionError(f"{what}; operator log:\n{setup.op.log_text()[-6000:]}")


def _released_after_both_agents(setup: Setup, node: str) -> None:
    timeline = setup.timeline
    # The API server has it; the watch brings it a moment later.
    untainted = wait_for(lambda: timeline.untainted_at(node), TIMEOUT, f"{node} untainted, watched")
    ztunnel, cni = timeline.ready_at(node, "ztunnel"), timeline.ready_at(node, "istio-cni")
    assert untainted is not None and ztunnel is not None and cni is not None, (
        untainted,
        ztunnel,
        cni,
    )
    assert untainted > max(ztunnel, cni)
    assert timeline.tainted_throughout(node, untainted)


def test_every_windows_build_is_released_once_both_agents_are_ready(
    k8s: client.ApiClient, setup: Setup
) -> None:
    for role in ("ws2022", "ws2025"):
        name = setup.nodes[role]
        try:
            wait_for(lambda n=name: not _tainted(_read_node(k8s, n)), TIMEOUT, f"{name} released")
        except TimeoutError:
            _fail(setup, f"{name} kept its taint")
        _released_after_both_agents(setup, name)
        assert _read_node(k8s, name)["spec"].get("taints") in (None, [])


def test_a_node_keeps_the_taint_while_one_agent_is_not_ready(
    k8s: client.ApiClient, setup: Setup
) -> None:
    core = client.CoreV1Api(k8s)
    name = setup.nodes["held"]

    def cni_ready_and_ztunnel_pending() -> bool:
        pods = core.list_namespaced_pod(setup.namespace).items
        cni = [
            p
            for p in pods
            if p.spec.node_name == name
            and p.metadata.labels.get("app.kubernetes.io/component") == "istio-cni"
        ]
        ztunnel_pending = [
            p
            for p in pods
            if p.metadata.labels.get("app.kubernetes.io/component") == "ztunnel"
            and p.status.phase == "Pending"
            and name in str(k8s.sanitize_for_serialization(p.spec.affinity))
        ]
        cni_ok = bool(cni) and all(_pod_ready(k8s.sanitize_for_serialization(p)) for p in cni)
        return cni_ok and len(ztunnel_pending) == 1

    wait_for(cni_ready_and_ztunnel_pending, TIMEOUT, "istio-cni Ready, ztunnel Pending")

    # A status pass that saw the istio-cni pod Ready: its DaemonSet counts it.
    def counted() -> bool:
        status = (read_mesh(k8s) or {}).get("status") or {}
        cni = [
            cs
            for cs in status.get("components") or []
            if cs["component"] == "istio-cni" and cs["platform"] == "linux"
        ]
        return bool(cni) and cni[0].get("ready") == 1

    wait_for(counted, TIMEOUT, "the linux istio-cni counted ready in the status")
    assert _readiness(k8s) == {
        "taint": "cni.istio.io/not-ready:NoSchedule",
        "waiting": 1,
        "exampleWaitingNodes": [name],
    }
    assert _tainted(_read_node(k8s, name))
    wait_for(lambda: setup.timeline.ready_at(name, "istio-cni"), TIMEOUT, "istio-cni, watched")
    assert setup.timeline.untainted_at(name) is None
    assert setup.timeline.ready_at(name, "ztunnel") is None

    # Room for ztunnel: the scheduler places it, kwok makes it Ready.
    core.patch_node_status(name, {"status": {"allocatable": {"cpu": "32"}}})
    try:
        wait_for(lambda: not _tainted(_read_node(k8s, name)), TIMEOUT, f"{name} released")
    except TimeoutError:
        _fail(setup, f"{name} kept its taint")
    _released_after_both_agents(setup, name)
    node = _read_node(k8s, name)
    # The other taints, one of them of the same key, are exactly as they were.
    assert node["spec"]["taints"] == [DEDICATED, SAME_KEY]
    # The operator's field manager owns the taint list and nothing else of the Node.
    ours = [m for m in node["metadata"]["managedFields"] if m["manager"] == "ambient-operator"]
    assert [(m["operation"], m["fieldsV1"]) for m in ours] == [
        ("Update", {"f:spec": {"f:taints": {}}})
    ]
    wait_for(lambda: _readiness(k8s).get("waiting") == 0, TIMEOUT, "no node waiting in the status")
    assert _readiness(k8s) == {
        "taint": "cni.istio.io/not-ready:NoSchedule",
        "waiting": 0,
        "exampleWaitingNodes": [],
    }


def test_the_operator_wrote_nothing_but_those_taints(setup: Setup) -> None:
    writes = setup.audit.writes(setup.since, user=setup.identity.user)
    node_writes = sorted(w for w in writes if " /api/v1/nodes" in w)
    assert {w.split("?")[0] for w in node_writes} == {
        f"patch /api/v1/nodes/{setup.nodes[role]}" for role in ("held", "ws2022", "ws2025")
    }
    # Once each: the caches were current, no test of the patch failed.
    assert len(node_writes) == 3, node_writes


def test_the_writer_never_loses_a_concurrent_taint(k8s: client.ApiClient, setup: Setup) -> None:
    core = client.CoreV1Api(k8s)
    name = unique_name("nr-race")
    EXTRA_NODES.append(name)
    body = _node(name, "linux", None)
    body["metadata"]["labels"] = {"kubernetes.io/os": "linux"}  # not the pool: no agents
    create_nodes(k8s, [body], timeout=60)
    stale = _read_node(k8s, name)
    added = {"key": "example.com/added-meanwhile", "effect": "NoSchedule"}
    core.patch_node(name, {"spec": {"taints": [READINESS, added]}})
    kube = Kube(load_credentials(str(setup.op.cluster.kubeconfig)))
    with contextlib.closing(kube):
        with pytest.raises(KubeError) as refused:
            remove_taint(kube, stale, READINESS["key"], READINESS["effect"])
        assert refused.value.status == 422
        assert _read_node(k8s, name)["spec"]["taints"] == [READINESS, added]
        fresh = _read_node(k8s, name)
        assert remove_taint(kube, fresh, READINESS["key"], "NoExecute") is None
        after = remove_taint(kube, fresh, READINESS["key"], READINESS["effect"])
        assert after is not None and after["spec"]["taints"] == [added]
    assert _read_node(k8s, name)["spec"]["taints"] == [added]


def test_disabled_nothing_is_written_on_nodes(k8s: client.ApiClient, setup: Setup) -> None:
    since = setup.audit.mark()
    stored = set_mesh_spec(k8s, _spec(setup.namespace, False))
    generation = stored["metadata"]["generation"]
    name = setup.nodes["off"]
    client.CoreV1Api(k8s).patch_node(name, {"metadata": {"labels": {POOL: "yes"}}})

    # A pass that saw both of the new node's agents Ready: the status counts
    # two ready pods for each Linux DaemonSet, for the new generation.
    def counted() -> bool:
        mesh = read_mesh(k8s) or {}
        linux = [
            cs
            for cs in (mesh.get("status") or {}).get("components") or []
            if cs["platform"] == "linux"
        ]
        return (
            current(mesh, "Reconciled")
            and len(linux) == 2
            and all(cs.get("ready") == 2 for cs in linux)
        )

    try:
        wait_for(counted, TIMEOUT, "both Linux nodes' agents counted Ready")
    except TimeoutError:
        pods = [
            (p.metadata.name, p.spec.node_name, p.status.phase, p.status.conditions)
            for p in client.CoreV1Api(k8s).list_namespaced_pod(setup.namespace).items
        ]
        _fail(setup, f"agents of the new node not counted: {pods}")
    for component in ("ztunnel", "istio-cni"):
        wait_for(
            lambda comp=component: setup.timeline.ready_at(name, comp), TIMEOUT, f"{component}"
        )
    assert (read_mesh(k8s) or {})["metadata"]["generation"] == generation
    assert "nodeReadiness" not in ((read_mesh(k8s) or {}).get("status") or {})
    assert _tainted(_read_node(k8s, name))
    writes = setup.audit.writes(since, user=setup.identity.user)
    assert writes, "the operator wrote nothing at all: no pass ran"
    assert [w for w in writes if " /api/v1/nodes" in w] == []


def test_no_request_was_forbidden(setup: Setup) -> None:
    # Last: everything above ran under the chart's identity.
    assert forbidden(setup.audit, setup.since, setup.identity) == []
