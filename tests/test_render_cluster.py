"""The rendered objects on a real control plane: accepted, and scheduled where planned.

The API server validates every object (Windows pod rules, HostProcess, one
name per field selector) and the real DaemonSet controller decides where
pods go; kwok runs them on the sample's fake nodes.
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

from ambient_devcluster import create_nodes, delete_nodes
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.render import DaemonSetPlan, RenderResult, render_dataplane
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


def _live_facts(k8s: client.ApiClient) -> ClusterFacts:
    nodes = client.CoreV1Api(k8s).list_node().items
    return ClusterFacts(
        nodes=tuple(NodeFacts.from_node(k8s.sanitize_for_serialization(n)) for n in nodes),
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
    apps: client.AppsV1Api, core: client.CoreV1Api, namespace: str, plan: DaemonSetPlan
) -> bool:
    ds = apps.read_namespaced_daemon_set(plan.name, namespace)
    status = ds.status
    if status is None or status.observed_generation != ds.metadata.generation:
        return False
    running = {
        p.spec.node_name
        for p in _pods_of(core, namespace, plan.name)
        if p.status and p.status.phase == "Running"
    }
    return status.desired_number_scheduled == len(plan.nodes) and running == set(plan.nodes)


def test_rendered_daemonsets_run_exactly_on_their_planned_nodes(
    k8s: client.ApiClient,
    sample_nodes: list[str],
    extra_nodes: list[str],
    agents_namespace: str,
) -> None:
    doc = yaml.safe_load(SAMPLE_MESH.read_text())
    doc["spec"]["namespace"] = agents_namespace
    spec = AmbientMeshSpec.model_validate(doc["spec"])
    result: RenderResult = render_dataplane(spec, _live_facts(k8s))

    plans = {p.name: p for p in result.daemonsets}
    assert set(plans["ztunnel"].nodes) >= {"linux-amd64-1", "linux-amd64-2", "linux-arm64-1"}
    assert set(plans["ztunnel-windows-ltsc2022"].nodes) >= {"win2022-1", *extra_nodes}
    assert "win2025-1" in plans["ztunnel-windows-ltsc2025"].nodes
    assert not any("win2019-1" in p.nodes for p in result.daemonsets)

    dyn = dynamic.DynamicClient(k8s)
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    cluster_scoped = [o for o in result.objects if "namespace" not in o["metadata"]]
    ours = [o for o in cluster_scoped if not _exists(dyn, o)]
    _apply(dyn, result.objects)
    try:
        for plan in result.daemonsets:
            wait_for(
                lambda plan=plan: _settled(apps, core, agents_namespace, plan),
                timeout=90,
                message=f"DaemonSet {plan.name} to run on exactly {plan.nodes}",
            )
        for plan in result.daemonsets:
            ds = apps.read_namespaced_daemon_set(plan.name, agents_namespace)
            assert ds.status.desired_number_scheduled == len(plan.nodes), plan.name
            placed = sorted(p.spec.node_name for p in _pods_of(core, agents_namespace, plan.name))
            assert placed == sorted(plan.nodes), plan.name
        # Applying the same objects again changes nothing the server keeps.
        before = {
            ds.metadata.name: ds.metadata.generation
            for ds in apps.list_namespaced_daemon_set(agents_namespace).items
        }
        _apply(dyn, render_dataplane(spec, _live_facts(k8s)).objects)
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
