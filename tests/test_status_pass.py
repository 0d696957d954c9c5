"""Work in proportion to the change: a pod change runs a status-only pass, counted at
5,000 nodes.

The data-plane controller runs in this process over caches filled through
the watch table's own record functions (cluster/watches.py) and the pod feed
(cluster/pods.py), against an API server kept in a dict (memory_kube.py).
The tests count what a pass does (full or status-only passes, templates
rendered, nodes whose facts were read, nodes judged), never how long it
took; the counts and the enrollment written to the status are literal.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import yaml

from ambient_operator.app.options import OWNED_API_KINDS
from ambient_operator.cluster.pods import PodFeed
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import Watched, state_watches
from ambient_operator.controllers import dataplane
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.kube.informer import Change
from memory_kube import MemoryKube
from render_cases import SAMPLE_MESH
from test_incremental_render import node, renders  # noqa: F401 (a fixture)

NODES = 5000
LINUX_NODE, WINDOWS_NODE = "linux-amd64-1-6", "win2022-1-9"  # node(6), node(9)


class _Events:
    """What the controller needs of an EventRecorder: post (nothing is told twice here)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def told(self, obj: Any, reason: str, message: str) -> bool:
        return False

    def post(self, obj: Any, kind_type: str, reason: str, message: str) -> bool:
        self.posted.append((kind_type, reason))
        return True


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}}


def pod(ns: str, name: str, node_name: str, redirection: str | None = None) -> dict[str, Any]:
    annotations = {"ambient.istio.io/redirection": redirection} if redirection else {}
    return {
        "metadata": {"namespace": ns, "name": name, "annotations": annotations},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running"},
    }


class Cluster:
    """The caches, fed as the watches feed them, and the controller over them."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.kube = MemoryKube()
        self.rows: dict[str, Watched] = {
            row.id: row for row in state_watches(self.state, OWNED_API_KINDS)
        }
        self.pods = PodFeed(self.state, [])
        self.ctl = DataplaneController(
            self.state,
            self.kube,  # type: ignore[arg-type]
            _Events(),  # type: ignore[arg-type]
            clock=lambda: "2025-01-01T00:00:00Z",
        )
        mesh = yaml.safe_load(SAMPLE_MESH.read_text())
        self.record("mesh", self.kube.put(mesh))
        self.record("namespaces", namespace("istio-system"))
        for i in range(NODES):
            self.record("nodes", node(i))

    def record(self, row: str, body: dict[str, Any], event: str | None = None) -> None:
        self.rows[row].record(event, body)

    def pod(self, body: dict[str, Any], event: str = "ADDED") -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.pods.apply([Change(event, key, self.pods.record_of(body))])

    def reconcile(self) -> None:
        asyncio.run(self.ctl.reconcile())

    def work(self) -> dict[str, int]:
        """What the passes did so far: passes by kind, node facts read, nodes judged."""
        return {
            **self.ctl.passes,
            "facts": self.ctl.node_facts_read,
            "judged": self.ctl.renders.verdicts.judged,
        }

    def enrollment(self) -> dict[str, Any]:
        """status.enrollment as written to the API server."""
        mesh = self.kube.get(self.rows["mesh"].kind, "default")
        assert mesh is not None
        return dict(mesh["status"]["enrollment"])


def counts(linux: tuple[int, int, int], windows: tuple[int, int, int]) -> dict[str, Any]:
    """linuxPods and windowsPods as (enabled, pending, missing)."""
    return {
        f"{os_name}Pods": dict(zip(("enabled", "pending", "missing"), values, strict=True))
        for os_name, values in (("linux", linux), ("windows", windows))
    }


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    out = Cluster()
    out.record("namespaces", namespace("shop", **{"istio.io/dataplane-mode": "ambient"}))
    out.record("namespaces", namespace("web", **{"istio.io/dataplane-mode": "ambient"}))
    out.record("namespaces", namespace("batch"))
    for body in (
        pod("shop", "a-1", LINUX_NODE, "enabled"),
        pod("shop", "a-2", LINUX_NODE),
        pod("web", "b-1", LINUX_NODE, "pending"),
        pod("web", "w-1", WINDOWS_NODE),
        pod("batch", "c-1", LINUX_NODE),
    ):
        out.pod(body)
    return out


def test_the_first_passes_are_full(cluster: Cluster) -> None:
    cluster.reconcile()
    # Every node read and judged once.
    assert cluster.work() == {"full": 1, "facts": 5000, "judged": 5000}
    # The first pass created the agents' DaemonSets: the agents it rendered
    # for (none ran) are not the agents that run now, a render input, so the
    # next pass is full too, whatever poked it; it reads no node again.
    cluster.pod(pod("shop", "a-0", LINUX_NODE, "enabled"))
    cluster.reconcile()
    assert cluster.work() == {"full": 2, "facts": 5000, "judged": 5000}
    assert cluster.enrollment() == {
        "namespaces": 2,
        **counts(linux=(2, 1, 1), windows=(0, 0, 1)),
        "examplePendingPods": ["shop/a-2", "web/b-1", "web/w-1"],
        "workaroundMisses": 0,
        "workaroundImageUnavailable": 0,
    }


def test_a_pod_change_runs_a_status_only_pass(
    cluster: Cluster,
    renders: list[tuple[str, str]],  # noqa: F811
) -> None:
    writes = len(cluster.kube.writes)
    cluster.pod(pod("shop", "a-2", LINUX_NODE, "enabled"))  # redirected now
    cluster.pod(pod("shop", "a-3", LINUX_NODE))  # new, not yet
    cluster.pod(pod("batch", "c-2", LINUX_NODE))  # not enrolled
    assert not cluster.state.full_pass_due
    cluster.reconcile()
    assert cluster.work() == {"full": 2, "status": 1, "facts": 5000, "judged": 5000}
    assert renders == []
    assert cluster.enrollment() == {
        "namespaces": 2,
        **counts(linux=(3, 1, 1), windows=(0, 0, 1)),
        "examplePendingPods": ["shop/a-3", "web/b-1", "web/w-1"],
        "workaroundMisses": 0,
        "workaroundImageUnavailable": 0,
    }
    # One write: the status.
    assert cluster.kube.writes[writes:] == [("status", "AmbientMesh", "default")]

    # A deletion, and a heartbeat of a node (its status only, nothing render reads).
    beat = node(6)
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "beat"}]
    cluster.record("nodes", beat)
    cluster.pod(pod("web", "b-1", LINUX_NODE, "pending"), event="DELETED")
    cluster.reconcile()
    assert cluster.work() == {"full": 2, "status": 2, "facts": 5000, "judged": 5000}
    assert cluster.enrollment()["linuxPods"] == {"enabled": 3, "pending": 0, "missing": 1}

    # Nothing changed: nothing written.
    writes = len(cluster.kube.writes)
    cluster.pod(pod("batch", "c-2", LINUX_NODE, "enabled"))  # not enrolled: no count moves
    cluster.reconcile()
    assert cluster.work()["status"] == 3
    assert cluster.kube.writes[writes:] == []


def test_a_namespace_label_runs_a_status_only_pass(
    cluster: Cluster,
    renders: list[tuple[str, str]],  # noqa: F811
) -> None:
    # Not spec.namespace, and none of the mesh's objects are in it: what the
    # data plane writes does not read it, its enrollment and Events alone move.
    writes = len(cluster.kube.writes)
    cluster.record("namespaces", namespace("batch", **{"istio.io/dataplane-mode": "ambient"}))
    assert not cluster.state.full_pass_due
    cluster.reconcile()
    assert cluster.work() == {"full": 2, "status": 4, "facts": 5000, "judged": 5000}
    assert renders == []
    assert cluster.kube.writes[writes:] == [("status", "AmbientMesh", "default")]
    assert cluster.enrollment() == {
        "namespaces": 3,
        **counts(linux=(4, 0, 2), windows=(0, 0, 1)),
        "examplePendingPods": ["batch/c-1", "shop/a-3", "web/w-1"],
        "workaroundMisses": 0,
        "workaroundImageUnavailable": 0,
    }


def test_a_node_event_at_5000_nodes_reads_and_judges_that_node_alone(
    cluster: Cluster,
    renders: list[tuple[str, str]],  # noqa: F811
) -> None:
    relabelled = copy.deepcopy(node(6))
    relabelled["metadata"]["labels"]["team"] = "payments"
    cluster.record("nodes", relabelled)
    assert cluster.state.full_pass_due
    cluster.reconcile()
    # Read once since its heartbeat (which changed its object, not its facts),
    # and judged again: its labels are facts.
    assert cluster.work() == {"full": 3, "status": 4, "facts": 5001, "judged": 5001}
    # A Linux node's label is no Linux object's input: nothing is rendered.
    assert renders == []

    # A Windows node leaves: nothing is read or judged.
    cluster.record("nodes", node(9), event="DELETED")
    cluster.reconcile()
    assert cluster.work() == {"full": 4, "status": 4, "facts": 5001, "judged": 5001}
    # web/w-1 ran there: without its node, it counts as Linux (Kubernetes' default).
    assert cluster.enrollment()["windowsPods"] == {"enabled": 0, "pending": 0, "missing": 0}

    # Then pods alone again: status-only.
    cluster.pod(pod("shop", "a-4", LINUX_NODE))
    cluster.reconcile()
    assert cluster.work() == {"full": 4, "status": 5, "facts": 5001, "judged": 5001}


def test_status_revisions_is_built_again_only_when_its_inputs_change(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    real = dataplane.revisions_status

    def counting(*args: Any) -> Any:
        built.append(1)
        return real(*args)

    monkeypatch.setattr(dataplane, "revisions_status", counting)
    # A pod, a namespace's dataplane-mode, a node: none is read by it.
    cluster.pod(pod("shop", "a-5", LINUX_NODE))
    cluster.reconcile()
    cluster.record("namespaces", namespace("batch"))
    cluster.reconcile()
    cluster.record("nodes", node(5000))
    cluster.reconcile()
    assert built == []
    # A namespace's istio.io/rev is.
    cluster.record("namespaces", namespace("batch", **{"istio.io/rev": "canary"}))
    cluster.reconcile()
    assert built == [1]
    mesh = cluster.kube.get(cluster.rows["mesh"].kind, "default")
    assert mesh is not None
    canary = [r for r in mesh["status"]["revisions"] if r["name"] == "canary"]
    assert [r["namespaces"] for r in canary] == [["batch"]]


def test_a_gateway_runs_a_status_only_pass_that_counts_it_in_status_revisions(
    cluster: Cluster,
    renders: list[tuple[str, str]],  # noqa: F811
) -> None:
    before = cluster.work()
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"namespace": "shop", "name": "waypoint", "labels": {}},
        "spec": {"gatewayClassName": "ambient-waypoint", "listeners": []},
    }
    # What the waypoint cache does with a new Gateway (controllers/waypoints/cache.py).
    cluster.state.gateways[("shop", "waypoint")] = gateway
    cluster.state.gateway_changed(("shop", "waypoint"))
    assert not cluster.state.full_pass_due and cluster.state.urgent
    cluster.reconcile()
    assert cluster.work() == {**before, "status": before["status"] + 1}
    assert renders == []
    mesh = cluster.kube.get(cluster.rows["mesh"].kind, "default")
    assert mesh is not None
    assert {r["name"]: r["waypoints"] for r in mesh["status"]["revisions"]} == {
        "canary": 0,
        "default": 1,
    }


def test_the_resync_runs_a_full_pass(cluster: Cluster) -> None:
    cluster.state.resync()
    assert cluster.state.full_pass_due and cluster.state.changed_namespaces is None
    cluster.reconcile()
    # Two first passes, two node events here and one in the revisions' test.
    assert cluster.work()["full"] == 6
