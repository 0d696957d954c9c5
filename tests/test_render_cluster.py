"""The rendered objects on a real control plane: accepted, and scheduled where they must be.

The API server validates every object (Windows pod rules, HostProcess, one
name per field selector) and the real DaemonSet controller decides where
pods go; kwok runs them on the sample's fake nodes. Where they must go is
tests/oracle.py's answer, and on the nodes this test knows, a literal.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

import oracle
from ambient_devcluster import create_nodes, delete_nodes
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.render import RenderResult, render_dataplane
from conftest import unique_name, wait_for
from render_cases import SAMPLE_MESH

pytestmark = pytest.mark.cluster

FIELD_MANAGER = "render-cluster-test"


def _unlabeled_ws2022(name: str) -> dict[str, Any]:
    """A WS2022 node without the windows-build label: only its kernel version tells."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {c.LABEL_OS: "windows", c.LABEL_ARCH: "amd64", c.LABEL_HOSTNAME: name},
        },
        "spec": {"taints": [{"key": "os", "value": "windows", "effect": "NoSchedule"}]},
        "status": {
            "nodeInfo": {
                "operatingSystem": "windows",
                "architecture": "amd64",
                "kernelVersion": "10.0.20348.2762",
                "osImage": "Windows Server 2022 Datacenter",
            }
        },
    }


@pytest.fixture
def extra_nodes(k8s: client.ApiClient, sample_nodes: list[str]) -> Iterator[list[str]]:
    """Two unlabeled WS2022 nodes next to the sample, so name terms meet the real controller."""
    names = [unique_name("win2022-nolabel") for _ in range(2)]
    create_nodes(k8s, [_unlabeled_ws2022(n) for n in names], timeout=60)
    yield names
    delete_nodes(k8s, names, timeout=60)


@pytest.fixture
def agents_namespace(k8s: client.ApiClient) -> Iterator[str]:
    """A namespace for the agents, made here; unique so the operator's own tests,
    which run the agents in istio-system, never meet these objects."""
    core = client.CoreV1Api(k8s)
    name = unique_name("istio-system")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


def _live_nodes(k8s: client.ApiClient) -> list[dict[str, Any]]:
    return [k8s.sanitize_for_serialization(n) for n in client.CoreV1Api(k8s).list_node().items]


def _live_facts(nodes: list[dict[str, Any]]) -> ClusterFacts:
    return ClusterFacts(
        nodes=tuple(NodeFacts.from_node(n) for n in nodes),
        istiod_ip="10.96.0.20",
        dns_ip="10.96.0.10",
    )


def _apply(dyn: dynamic.DynamicClient, objects: tuple[dict[str, Any], ...]) -> list[Any]:
    created = []
    for obj in objects:
        resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        # Cluster-scoped RBAC has fixed names another test's operator may
        # already own; take the fields over rather than fail on the conflict.
        created.append(
            dyn.server_side_apply(
                resource,
                body=copy.deepcopy(obj),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        )
    return created


def _exists(dyn: dynamic.DynamicClient, obj: dict[str, Any]) -> bool:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        dyn.get(resource, name=obj["metadata"]["name"])
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _pods_of(core: client.CoreV1Api, namespace: str, daemonset: str) -> list[client.V1Pod]:
    return [
        p
        for p in core.list_namespaced_pod(namespace).items
        if any(
            ref.kind == "DaemonSet" and ref.name == daemonset
            for ref in p.metadata.owner_references or []
        )
    ]


def _settled(
    apps: client.AppsV1Api, core: client.CoreV1Api, namespace: str, name: str, nodes: frozenset[str]
) -> bool:
    ds = apps.read_namespaced_daemon_set(name, namespace)
    status = ds.status
    if status is None or status.observed_generation != ds.metadata.generation:
        return False
    running = {
        p.spec.node_name
        for p in _pods_of(core, namespace, name)
        if p.status and p.status.phase == "Running"
    }
    return status.desired_number_scheduled == len(nodes) and running == set(nodes)


def _on_known_nodes(extra_nodes: list[str]) -> dict[str, frozenset[str]]:
    """Every DaemonSet of the sample mesh, and which of the sample's nodes and the two
    unlabeled WS2022 ones it runs on (docs/troubleshooting.md: WS2019 gets none)."""
    linux = frozenset({"linux-amd64-1", "linux-amd64-2", "linux-arm64-1"})
    ws2022 = frozenset({"win2022-1", *extra_nodes})
    ws2025 = frozenset({"win2025-1"})
    return {
        "istio-cni-node": linux,
        "ztunnel": linux,
        "istio-cni-node-windows-ltsc2022": ws2022,
        "ztunnel-windows-ltsc2022": ws2022,
        "istio-cni-node-windows-ltsc2025": ws2025,
        "ztunnel-windows-ltsc2025": ws2025,
    }


def test_rendered_daemonsets_run_exactly_on_their_planned_nodes(
    k8s: client.ApiClient,
    sample_nodes: list[str],
    extra_nodes: list[str],
    agents_namespace: str,
) -> None:
    doc = yaml.safe_load(SAMPLE_MESH.read_text())
    doc["spec"]["namespace"] = agents_namespace
    spec = AmbientMeshSpec.model_validate(doc["spec"])
    live = _live_nodes(k8s)
    result: RenderResult = render_dataplane(spec, _live_facts(live))

    # Where the pods must land: the oracle's answer for every node the cluster has
    # (other tests may add theirs), and a literal on the nodes this test knows.
    want = oracle.placement(doc["spec"], [oracle.Node.of(n) for n in live])
    known = {*sample_nodes, *extra_nodes}
    assert {name: nodes & known for name, nodes in want.items()} == _on_known_nodes(extra_nodes)
    assert {p.name: frozenset(p.nodes) for p in result.daemonsets} == want

    dyn = dynamic.DynamicClient(k8s)
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    cluster_scoped = [o for o in result.objects if "namespace" not in o["metadata"]]
    ours = [o for o in cluster_scoped if not _exists(dyn, o)]
    _apply(dyn, result.objects)
    try:
        for name, nodes in want.items():
            wait_for(
                lambda name=name, nodes=nodes: _settled(apps, core, agents_namespace, name, nodes),
                timeout=90,
                message=f"DaemonSet {name} to run on exactly {sorted(nodes)}",
            )
        for name, nodes in want.items():
            ds = apps.read_namespaced_daemon_set(name, agents_namespace)
            assert ds.status.desired_number_scheduled == len(nodes), name
            placed = sorted(p.spec.node_name for p in _pods_of(core, agents_namespace, name))
            assert placed == sorted(nodes), name
        # No DaemonSet beyond those: each one's count is pinned above.
        daemonsets = apps.list_namespaced_daemon_set(agents_namespace).items
        assert sorted(ds.metadata.name for ds in daemonsets) == sorted(want)
        # Applying the same objects again changes nothing the server keeps.
        before = {
            ds.metadata.name: ds.metadata.generation
            for ds in apps.list_namespaced_daemon_set(agents_namespace).items
        }
        _apply(dyn, render_dataplane(spec, _live_facts(_live_nodes(k8s))).objects)
        after = {
            ds.metadata.name: ds.metadata.generation
            for ds in apps.list_namespaced_daemon_set(agents_namespace).items
        }
        assert after == before
    finally:
        # The namespace takes its objects along; cluster-scoped ones go only
        # if this test made them.
        for obj in ours:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            with contextlib.suppress(ApiException):
                dyn.delete(resource, name=obj["metadata"]["name"])
