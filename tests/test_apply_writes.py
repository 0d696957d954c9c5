"""A fresh mesh converges writing each object once, in the order pods need (issue 44, item 2).

A control plane of the module's own (our CRDs, Gateway API, the sample
nodes: conftest.own_cluster) with istiod's objects, a namespace holding two
waypoint Gateways, and the sample AmbientMesh, all there before the operator
starts. The objects it must make are written out below from the sample
mesh on the sample nodes (the same list test_operator.py's placement
spells out) and from docs/waypoints.md (a ServiceAccount, Deployment and
Service per waypoint). The API server's audit log is the count: each of
them gets exactly one write request, the one that creates it, and nothing
else is written but status subresources and Events. Its timestamps give
the order: no DaemonSet was asked for before every object its pods use had
been answered, and the istio-cni ClusterRoleBinding not before its
ClusterRole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster, install_istiod_objects
from ambient_devcluster.harness import condition, get_mesh
from conftest import BIN_DIR, own_cluster, wait_for
from operator_harness import AuditLog, RunningOperator, apply_sample_mesh, full_passes_finished

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
APPS = "apps"
AGENTS = "istio-system"
WAYPOINTS = ("waypoint-a", "waypoint-b")
TIMEOUT = 120.0
CLASS_DEFAULTS = "ambient-operator-istio-waypoint-defaults"

DAEMONSETS = {
    (AGENTS, name)
    for name in (
        "istio-cni-node",
        "ztunnel",
        "istio-cni-node-windows-ltsc2022",
        "ztunnel-windows-ltsc2022",
        "istio-cni-node-windows-ltsc2025",
        "ztunnel-windows-ltsc2025",
    )
}
# (resource, namespace, name) of every object the operator makes here.
EXPECTED = {
    ("serviceaccounts", AGENTS, "istio-cni"),
    ("serviceaccounts", AGENTS, "ztunnel"),
    ("serviceaccounts", AGENTS, "ztunnel-windows"),
    ("clusterroles", "", "istio-cni"),
    ("clusterrolebindings", "", "istio-cni"),
    ("configmaps", AGENTS, "istio-cni-config"),
    ("configmaps", AGENTS, "istio-cni-config-windows-ltsc2022"),
    ("configmaps", AGENTS, "istio-cni-config-windows-ltsc2025"),
    *(("daemonsets", ns, name) for ns, name in DAEMONSETS),
    # The waypoints' own GatewayClass and istiod's istio-waypoint class defaults.
    ("gatewayclasses", "", "ambient-waypoint"),
    ("configmaps", AGENTS, CLASS_DEFAULTS),
    *(
        (resource, APPS, name)
        for name in WAYPOINTS
        for resource in ("serviceaccounts", "deployments", "services")
    ),
}
# What the DaemonSets' pods use, by resource.
USED = {"serviceaccounts", "configmaps", "clusterroles", "clusterrolebindings"}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path_factory, "writes") as local:
        with local.api_client() as api:
            install_istiod_objects(api, BIN_DIR, AGENTS)
        yield local


def _gateway(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {
            "gatewayClassName": "ambient-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


def _settled(api: client.ApiClient) -> bool:
    mesh = get_mesh(api)
    generation = mesh["metadata"]["generation"]
    for kind in ("Reconciled", "Ready"):
        cond = condition(mesh, kind)
        if cond.get("status") != "True" or cond.get("observedGeneration") != generation:
            return False
    custom = client.CustomObjectsApi(api)
    for name in WAYPOINTS:
        gw = custom.get_namespaced_custom_object(GW_GROUP, GW_VERSION, APPS, "gateways", name)
        if condition(gw, "Programmed").get("status") != "True":
            return False
    return True


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_fresh_mesh_writes_each_object_once(
    fresh: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    audit = AuditLog(fresh.audit_log)
    with fresh.api_client() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": APPS}})
        for name in WAYPOINTS:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                GW_GROUP, GW_VERSION, APPS, "gateways", _gateway(name)
            )
        apply_sample_mesh(fresh)
        mark = audit.mark()
        op = RunningOperator(fresh, Path(tmp_path_factory.mktemp("operator")))
        with op.running():
            wait_for(lambda: _settled(api), TIMEOUT, "the mesh Ready and both waypoints Programmed")
            # Barrier: two full data-plane passes begun after that, finished.
            full_passes_finished(api, op, 2, TIMEOUT)
            events = audit.events(mark)
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]

    writes: Counter[tuple[str, str, str]] = Counter()
    creations: set[tuple[str, str, str]] = set()
    asked: dict[tuple[str, str, str], datetime] = {}
    answered: dict[tuple[str, str, str], datetime] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") not in ("create", "update", "patch", "delete"):
            continue
        if ref.get("subresource") == "status" or ref.get("resource") == "events":
            continue
        key = (str(ref.get("resource")), str(ref.get("namespace") or ""), str(ref.get("name")))
        writes[key] += 1
        if (event.get("responseStatus") or {}).get("code") == 201:
            creations.add(key)
            asked[key] = _when(event["requestReceivedTimestamp"])
            answered[key] = _when(event["stageTimestamp"])
    assert dict(writes) == dict.fromkeys(EXPECTED, 1)
    assert creations == EXPECTED
    daemonsets = {("daemonsets", ns, name) for ns, name in DAEMONSETS}
    first_daemonset = min(asked[key] for key in daemonsets)
    used = [
        key
        for key in EXPECTED
        if key[0] in USED and key[1] != APPS and key[2] != CLASS_DEFAULTS  # the waypoints'
    ]
    assert len(used) == 8  # three accounts, the role and its binding, three ConfigMaps
    late = [key for key in used if answered[key] > first_daemonset]
    assert late == []
    role, binding = ("clusterroles", "", "istio-cni"), ("clusterrolebindings", "", "istio-cni")
    assert answered[role] <= asked[binding]
