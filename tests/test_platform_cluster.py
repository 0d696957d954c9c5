"""The platform on the local control plane: detected from the Nodes, reported, overridden.

kwok Nodes made from the realistic AKS inventory carry AKS's providerID and
labels. The operator must report `aks` in status.platform; spec.platform
`gke` must win (status says so, and the API server takes the quotas GKE
needs), and going back to auto must prune them. A node of another platform
joining makes the marks disagree: generic, and the status says why.

Tests in this module run in order against one operator process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster, create_nodes, delete_nodes
from ambient_devcluster.harness import (
    borrowed_mesh,
    condition,
    create_namespace,
    get_mesh,
    set_mesh_spec,
)
from conftest import ignoring, wait_for
from operator_harness import AuditLog, RunningOperator
from render_cases import INVENTORIES

pytestmark = pytest.mark.cluster

AGENTS_NS = "istio-system"
PASSES_DONE = "ambient_operator_reconcile_duration_seconds_count"
QUOTAS = ["istio-cni-resource-quota", "ztunnel"]
OURS = "app.kubernetes.io/managed-by=ambient-operator"


def _aks_evidence(k8s: client.ApiClient) -> str:
    # Other modules' nodes (no platform's marks) may share the cluster.
    total = len(client.CoreV1Api(k8s).list_node().items)
    return (
        f"aks: 3 of {total} node(s), e.g. aks-nodepool1-38290124-vmss000000: "
        "label kubernetes.azure.com/cluster"
    )


@pytest.fixture(scope="module")
def aks_nodes(k8s: client.ApiClient) -> Iterator[list[str]]:
    """The AKS inventory as kwok Nodes, and the agents' namespace."""
    with ignoring(409):
        create_namespace(k8s, AGENTS_NS)
    names = create_nodes(k8s, INVENTORIES / "platform-aks.yaml")
    yield names
    delete_nodes(k8s, names)


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    crds_installed: None,
    aks_nodes: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator process."""
    # A short resync, so that passes with nothing to do are observable.
    op = RunningOperator(
        cluster, tmp_path_factory.mktemp("operator"), extra_args=["--resync-seconds", "2"]
    )
    with op.running():
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


@pytest.fixture(scope="module")
def audit(cluster: LocalCluster) -> AuditLog:
    """The API server's audit log."""
    return AuditLog(cluster.audit_log)


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, operator: RunningOperator) -> Iterator[dict[str, Any]]:
    """The AmbientMesh `default`, all defaults (spec.platform auto), while the module runs."""
    with borrowed_mesh(k8s, lambda _original: {}) as stored:
        yield stored


def _platform(k8s: client.ApiClient) -> dict[str, Any]:
    status = get_mesh(k8s).get("status") or {}
    platform: dict[str, Any] = status.get("platform") or {}
    return platform


def _quotas(k8s: client.ApiClient) -> list[str]:
    items = client.CoreV1Api(k8s).list_namespaced_resource_quota(AGENTS_NS, label_selector=OURS)
    return sorted(q.metadata.name for q in items.items)


def _cni_bin_dir(k8s: client.ApiClient) -> str | None:
    with ignoring(404):
        ds = client.AppsV1Api(k8s).read_namespaced_daemon_set("istio-cni-node", AGENTS_NS)
        for volume in ds.spec.template.spec.volumes:
            if volume.name == "cni-bin-dir":
                return str(volume.host_path.path)
    return None


def test_status_reports_the_detected_platform(k8s: client.ApiClient, mesh: dict[str, Any]) -> None:
    wait_for(lambda: _platform(k8s).get("name") == "aks", 60, "status.platform aks")
    platform = _platform(k8s)
    assert (platform["name"], platform["detected"], platform["source"]) == (
        "aks",
        "aks",
        "detected",
    )
    assert platform["evidence"][0] == _aks_evidence(k8s)
    # AKS's Linux nodes use the chart's default paths, and need no quota.
    wait_for(lambda: _cni_bin_dir(k8s) == "/opt/cni/bin", 60, "istio-cni-node on /opt/cni/bin")
    assert _quotas(k8s) == []


def test_spec_platform_overrides_detection(k8s: client.ApiClient, mesh: dict[str, Any]) -> None:
    set_mesh_spec(k8s, {"platform": "gke"})
    wait_for(lambda: _platform(k8s).get("name") == "gke", 60, "status.platform gke")
    platform = _platform(k8s)
    assert (platform["detected"], platform["source"]) == ("aks", "spec")
    assert platform["evidence"][0] == _aks_evidence(k8s)
    # What GKE needs, accepted by the API server and owned by the mesh.
    wait_for(lambda: _quotas(k8s) == QUOTAS, 60, f"ResourceQuotas {QUOTAS}")
    uid = get_mesh(k8s)["metadata"]["uid"]
    for name in QUOTAS:
        quota = client.CoreV1Api(k8s).read_namespaced_resource_quota(name, AGENTS_NS)
        assert [ref.uid for ref in quota.metadata.owner_references if ref.controller] == [uid]
        # 5000 pods, in the API server's canonical form of the quantity.
        assert quota.spec.hard == {"pods": "5k"}
    wait_for(lambda: _cni_bin_dir(k8s) == "/home/kubernetes/bin", 60, "GKE's CNI bin dir")


def test_the_quotas_as_stored_are_what_is_asked(
    k8s: client.ApiClient, operator: RunningOperator, audit: AuditLog
) -> None:
    # The API server stores 5000 pods as 5k: a quota asked for as 5000 would
    # differ from its live copy in every pass and be rewritten each time.
    mark = audit.mark()
    done = operator.metric(PASSES_DONE, controller="dataplane")
    wait_for(
        lambda: operator.metric(PASSES_DONE, controller="dataplane") >= done + 2,
        60,
        "two more data-plane passes",
    )
    assert [w for w in audit.writes(mark) if "/resourcequotas" in w] == []


def test_back_to_auto_prunes_what_the_override_needed(
    k8s: client.ApiClient, mesh: dict[str, Any]
) -> None:
    set_mesh_spec(k8s, {})
    wait_for(lambda: _platform(k8s).get("source") == "detected", 60, "status.platform detected")
    assert _platform(k8s)["name"] == "aks"
    wait_for(lambda: _quotas(k8s) == [], 60, "ResourceQuotas pruned")
    wait_for(lambda: _cni_bin_dir(k8s) == "/opt/cni/bin", 60, "istio-cni-node on /opt/cni/bin")


def test_a_node_of_another_platform_makes_it_generic_and_degraded(
    k8s: client.ApiClient, mesh: dict[str, Any]
) -> None:
    names = create_nodes(k8s, INVENTORIES / "platform-eks.yaml")
    try:
        wait_for(lambda: _platform(k8s).get("name") == "generic", 60, "status.platform generic")
        platform = _platform(k8s)
        assert (platform["detected"], platform["source"]) == ("generic", "detected")
        first = (
            "nodes point at 2 platforms (aks, eks): rendering for generic; set spec.platform "
            "to the one whose paths the Linux nodes use"
        )
        assert platform["evidence"][0] == first
        wait_for(
            lambda: first in condition(get_mesh(k8s), "Degraded").get("message", ""),
            60,
            "Degraded names the disagreement",
        )
        assert condition(get_mesh(k8s), "Degraded")["status"] == "True"
    finally:
        delete_nodes(k8s, names)
    wait_for(lambda: _platform(k8s).get("name") == "aks", 60, "status.platform aks again")
