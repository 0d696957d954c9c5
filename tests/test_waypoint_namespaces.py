"""Gateways whose namespace is going or gone are left alone, against the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from ambient_devcluster import LocalCluster
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import namespace_entry
from ambient_operator.controllers.waypoints import WaypointController
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.resources import KINDS, Kind
from ambient_operator.render.waypoints.names import names_of
from conftest import unique_name

HOLD = "ambient-operator.test/hold"
GHOSTS = "ambient_operator_cache_ghosts_total"


def _gateway(namespace: str) -> dict[str, object]:
    return {
        "apiVersion": c.GATEWAY_API_VERSION,
        "kind": "Gateway",
        "metadata": {
            "name": "waypoint",
            "namespace": namespace,
            "uid": "uid-of-the-gateway",
            "resourceVersion": "1",
        },
        "spec": {
            "gatewayClassName": "ambient-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


# The class as the operator keeps it: Gateways of it are rendered and written.
GATEWAY_CLASS = {
    "apiVersion": c.GATEWAY_API_VERSION,
    "kind": "GatewayClass",
    "metadata": {"name": "ambient-waypoint", "resourceVersion": "1"},
    "spec": {"controllerName": "ambientoperator.io/waypoint-controller"},
}


@pytest.fixture
def terminating(k8s: client.ApiClient) -> Iterator[str]:
    """A namespace held in Terminating by a finalizer of ours."""
    core = client.CoreV1Api(k8s)
    name = unique_name("wp-going")
    core.create_namespace({"metadata": {"name": name, "finalizers": [HOLD]}})
    core.delete_namespace(name)
    try:
        yield name
    finally:
        core.patch_namespace(name, {"metadata": {"finalizers": None}})


def _reconcile(cluster: LocalCluster, state: ClusterState, namespace: str) -> tuple[bool, bool]:
    """(the reconcile's verdict, whether the waypoint's ServiceAccount was written).

    Written: the API server answered our write (the controller keeps what it
    answered), or the account exists. The garbage collector may delete it at
    any moment when Gateways are served, since the Gateway owning it exists
    only in this test's cache.
    """
    kube = Kube(load_credentials(str(cluster.kubeconfig)))
    ctl = WaypointController(state, kube, None)  # type: ignore[arg-type]  # no Event expected
    gateway = _gateway(namespace)
    ctl.on_gateway_class("ADDED", GATEWAY_CLASS)
    ctl.on_gateway("ADDED", gateway)
    spec = AmbientMeshSpec.model_validate({})
    ok = asyncio.run(ctl._reconcile_gateway(spec, (namespace, "waypoint")))
    account = names_of(gateway).service_account
    kept = ctl.objects.get((namespace, "waypoint"), {})
    answered = ("v1", "ServiceAccount", namespace, account) in kept
    return ok, answered or kube.get(KINDS[("v1", "ServiceAccount")], account, namespace) is not None


def test_a_namespace_not_yet_cached_that_exists_gets_its_waypoint(
    cluster: LocalCluster, k8s: client.ApiClient
) -> None:
    """The control for the cases below: the same Gateway where the namespace is fine."""
    name = unique_name("wp-new")
    client.CoreV1Api(k8s).create_namespace({"metadata": {"name": name}})
    try:
        assert _reconcile(cluster, ClusterState(), name) == (True, True)
    finally:
        client.CoreV1Api(k8s).delete_namespace(name)


def test_gone_namespace_needs_no_retry(cluster: LocalCluster) -> None:
    # True: done. A retry would only be refused again, on every backoff step.
    assert _reconcile(cluster, ClusterState(), unique_name("wp-gone")) == (True, False)


def test_terminating_namespace_not_yet_cached_is_left_alone(
    cluster: LocalCluster, k8s: client.ApiClient, terminating: str
) -> None:
    live = client.CoreV1Api(k8s).read_namespace(terminating)
    assert live.metadata.deletion_timestamp is not None
    assert _reconcile(cluster, ClusterState(), terminating) == (True, False)


def test_terminating_namespace_known_from_the_cache_is_left_alone(
    cluster: LocalCluster, k8s: client.ApiClient, terminating: str
) -> None:
    state = ClusterState()
    live = client.CoreV1Api(k8s).read_namespace(terminating)
    state.namespaces[terminating] = namespace_entry(k8s.sanitize_for_serialization(live))
    assert state.namespaces[terminating]["terminating"]
    assert _reconcile(cluster, state, terminating) == (True, False)


def test_objects_gone_with_their_gateway_are_not_made_again_from_a_stale_cache(
    cluster: LocalCluster, k8s: client.ApiClient
) -> None:
    """The Deployment's deletion came before the Gateway's (another watch, or its list after a 410).

    The cache still holds the Gateway, which the API server no longer has;
    the control above writes the same cache-only Gateway's objects when
    none of them went away.
    """
    name = unique_name("wp-stale")
    client.CoreV1Api(k8s).create_namespace({"metadata": {"name": name}})
    try:
        kube = Kube(load_credentials(str(cluster.kubeconfig)))
        ctl = WaypointController(ClusterState(), kube, None)  # type: ignore[arg-type]
        gateway = _gateway(name)
        ctl.on_gateway_class("ADDED", GATEWAY_CLASS)
        ctl.on_gateway("ADDED", gateway)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "waypoint",
                "namespace": name,
                "resourceVersion": "2",
                "labels": {c.LABEL_GATEWAY_NAME: "waypoint"},
            },
        }
        ctl.on_owned("ADDED", deployment)
        ctl.on_owned("DELETED", deployment)
        spec = AmbientMeshSpec.model_validate({})
        before = REGISTRY.get_sample_value(GHOSTS, {"kind": "Gateway"}) or 0.0
        assert asyncio.run(ctl._reconcile_gateway(spec, (name, "waypoint")))
        assert (name, "waypoint") not in ctl.gateways  # the cache learnt it is gone
        assert REGISTRY.get_sample_value(GHOSTS, {"kind": "Gateway"}) == before + 1
        account = names_of(gateway).service_account
        assert kube.get(KINDS[("v1", "ServiceAccount")], account, name) is None
    finally:
        client.CoreV1Api(k8s).delete_namespace(name)


def test_a_name_taken_since_the_watches_looked_is_refused_and_nothing_else_is_written(
    cluster: LocalCluster, k8s: client.ApiClient
) -> None:
    """The watches say every name is free; another team's ServiceAccount took one meanwhile.

    No name is asked for before the writes then (gateways.py), so the
    ServiceAccount's POST is the check: refused, it stops the Gateway before
    its Deployment and Service are written, and the account is not touched.
    """
    name = unique_name("wp-taken")
    core = client.CoreV1Api(k8s)
    core.create_namespace({"metadata": {"name": name}})
    try:
        account = names_of(_gateway(name)).service_account
        theirs = core.create_namespaced_service_account(
            name, {"metadata": {"name": account, "annotations": {"example.com/role": "db"}}}
        )
        kube = Kube(load_credentials(str(cluster.kubeconfig)))
        asked: list[str] = []

        def stale(kind: Kind, key: tuple[str, str]) -> bool:
            asked.append(f"{kind.kind} {'/'.join(key)}")
            return False

        ctl = WaypointController(ClusterState(), kube, None, seen=stale)  # type: ignore[arg-type]
        ctl.on_gateway_class("ADDED", GATEWAY_CLASS)
        ctl.on_gateway("ADDED", _gateway(name))
        spec = AmbientMeshSpec.model_validate({})
        assert not asyncio.run(ctl._reconcile_gateway(spec, (name, "waypoint")))  # retried
        assert f"ServiceAccount {name}/{account}" in asked  # the watches were consulted
        assert kube.get(KINDS[("apps/v1", "Deployment")], "waypoint", name) is None
        assert kube.get(KINDS[("v1", "Service")], "waypoint", name) is None
        live = core.read_namespaced_service_account(account, name)
        assert live.metadata.resource_version == theirs.metadata.resource_version
        assert not live.metadata.owner_references
    finally:
        core.delete_namespace(name)
