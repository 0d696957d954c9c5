"""Chaos for waypoints (issue 18): SIGKILL in the middle of a burst of 50 Gateways.

The test's own validating webhook (tests/write_gate.py) holds the operator's
k-th waypoint write (a Deployment, Service or ServiceAccount create, or a
Gateway status update) until the process is dead, so the kill lands inside
the burst on any machine. After a restart every Gateway must be Programmed,
each with exactly one Deployment, Service and ServiceAccount, all owned by
it (controller reference to its UID); nothing labelled as a waypoint object
of the namespace may be left without its Gateway.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster, api_client_for
from ambient_devcluster.harness import borrowed_mesh, condition
from ambient_operator.api import constants as c
from conftest import ignoring, unique_name, wait_for
from operator_harness import OPERATOR_USER, RunningOperator
from test_chaos import _seed
from write_gate import WriteGate

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
CLASS = "ambient-waypoint"
BURST = 50
# Per Gateway: a ServiceAccount, a Service and a Deployment, then its status.
WRITES_PER_GATEWAY = 4
CONVERGE_TIMEOUT = 180.0
WAYPOINT_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"]},
    {"apiGroups": [""], "resources": ["services", "serviceaccounts"]},
    {"apiGroups": [GW_GROUP], "resources": ["gateways/status"]},
]
KINDS = ("Deployment", "Service", "ServiceAccount")


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> Iterator[None]:
    """The shared AmbientMesh with every default, and the agents' namespace it names."""
    with ignoring(409):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": "istio-system"}})
    with borrowed_mesh(k8s, lambda _original: None):
        yield


@pytest.fixture
def operator(
    cluster: LocalCluster, mesh: None, gateway_api_crds: None, tmp_path: Path
) -> Iterator[RunningOperator]:
    """A fresh operator process; its log must stay free of tracebacks."""
    op = RunningOperator(cluster, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()
    assert "Traceback" not in op.log_text(), op.log_text()[-6000:]


def _gateway(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": CLASS,
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


def _ours(k8s: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    """Every object of the namespace that carries the waypoint's gateway-name label."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    found: list[dict[str, Any]] = []
    for kind, lister in (
        ("Deployment", apps.list_namespaced_deployment),
        ("Service", core.list_namespaced_service),
        ("ServiceAccount", core.list_namespaced_service_account),
    ):
        for item in lister(namespace, label_selector=c.LABEL_GATEWAY_NAME).items:
            meta = item.metadata
            owners = [
                (ref.kind, ref.name, ref.uid)
                for ref in meta.owner_references or []
                if ref.controller
            ]
            found.append({"kind": kind, "name": meta.name, "owners": owners})
    return found


def _programmed(custom: Any, namespace: str) -> list[str]:
    items = custom.list_namespaced_custom_object(GW_GROUP, GW_VERSION, namespace, "gateways")
    return sorted(
        gw["metadata"]["name"]
        for gw in items["items"]
        if condition(gw, "Programmed").get("status") == "True"
    )


def test_sigkill_during_a_burst_of_gateways_leaves_no_duplicate_and_no_orphan(
    cluster: LocalCluster, k8s: client.ApiClient, operator: RunningOperator, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(k8s)
    core = client.CoreV1Api(k8s)
    namespace = unique_name("burst")
    core.create_namespace({"metadata": {"name": namespace}})
    run_seed = _seed("AMBIENT_CHAOS_SEED")
    kill_at = random.Random(run_seed).randint(1, BURST * WRITES_PER_GATEWAY // 2)
    note = f"chaos seed: AMBIENT_CHAOS_SEED={run_seed}, held write {kill_at}"
    gate = WriteGate(tmp_path, OPERATOR_USER, unique_name("burst-gate"), WAYPOINT_RULES)
    as_operator = api_client_for(cluster.user_kubeconfig(OPERATOR_USER, ["system:masters"]))
    names = [f"wp-{i:02d}" for i in range(BURST)]
    try:
        with gate.installed(k8s, as_operator):
            wait_for(
                lambda: (
                    condition(
                        custom.get_cluster_custom_object(
                            GW_GROUP, GW_VERSION, "gatewayclasses", CLASS
                        ),
                        "Accepted",
                    ).get("status")
                    == "True"
                ),
                60,
                "our GatewayClass accepted",
            )
            gate.arm(kill_at)
            for name in names:
                custom.create_namespaced_custom_object(
                    GW_GROUP, GW_VERSION, namespace, "gateways", _gateway(name)
                )
            held = gate.held.wait(60)
            operator.stop(signal.SIGKILL)
            gate.disarm()
            assert held, f"{note}: only {gate.count} waypoint writes came"
            before_restart = _ours(k8s, namespace)
            # Fewer writes landed than the burst needs: the kill was inside it.
            assert len(before_restart) < BURST * len(KINDS), note
            operator.start()
            wait_for(
                lambda: _programmed(custom, namespace) == names,
                CONVERGE_TIMEOUT,
                f"all {BURST} Gateways Programmed after the restart ({note}, "
                f"held {gate.held_request}, {len(before_restart)} objects existed)",
            )
        gateways = {
            gw["metadata"]["name"]: gw["metadata"]["uid"]
            for gw in custom.list_namespaced_custom_object(
                GW_GROUP, GW_VERSION, namespace, "gateways"
            )["items"]
        }
        objects = _ours(k8s, namespace)
        # No duplicate: one of each kind per Gateway, named after it.
        assert sorted((o["kind"], o["name"]) for o in objects) == sorted(
            (kind, name) for name in names for kind in KINDS
        ), note
        # No orphan, nothing adopted: each is controlled by its own Gateway's UID.
        wrong = [o for o in objects if o["owners"] != [("Gateway", o["name"], gateways[o["name"]])]]
        assert not wrong, f"{note}: {wrong}"
    except BaseException as exc:
        exc.add_note(note)
        raise
    finally:
        as_operator.close()
        with ignoring(404):
            core.delete_namespace(namespace)
