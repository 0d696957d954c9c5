"""Names from user data never reach an API path unchecked.

A name or namespace that no object can carry is refused before any request
(a ServiceAccount named `deployer/token` would otherwise be a GET of
`serviceaccounts/deployer/token`), and a Gateway naming one is told so in
its status instead.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import Credentials
from ambient_operator.kube.resources import KINDS
from ambient_operator.render.waypoints.parameters import parameter_refs
from ambient_operator.render.waypoints.verdicts import class_verdict, render_waypoint
from operator_harness import free_port

SERVICE_ACCOUNT = KINDS[("v1", "ServiceAccount")]
NAMESPACE = KINDS[("v1", "Namespace")]
CLUSTER_ROLE = KINDS[("rbac.authorization.k8s.io/v1", "ClusterRole")]
ROLE = KINDS[("rbac.authorization.k8s.io/v1", "Role")]
GATEWAY_CLASS = KINDS[("gateway.networking.k8s.io/v1", "GatewayClass")]
# Not DNS-1123 subdomains: what most kinds' names must be.
HOSTILE_NAMES = [
    "a/b",
    "..",
    ".",
    "%2F",
    "a%2Fb",
    "",
    "A",
    "a_b",
    "a b",
    "-a",
    "a.",
    "a\n",
    "a" * 254,
]
# Not DNS-1123 labels: what a namespace must be.
HOSTILE_NAMESPACES = ["a/b", "..", "%2F", "A", "a.b", "a_b", "a" * 64]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_name_that_is_no_subdomain_makes_no_path(name: str) -> None:
    with pytest.raises(ValueError, match="ServiceAccount name"):
        SERVICE_ACCOUNT.path(name, "apps")
    with pytest.raises(ValueError, match="GatewayClass name"):
        GATEWAY_CLASS.path(name)


@pytest.mark.parametrize("namespace", HOSTILE_NAMESPACES)
def test_a_namespace_that_is_no_label_makes_no_path(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        SERVICE_ACCOUNT.path("deployer", namespace)
    with pytest.raises(ValueError, match="namespace"):
        SERVICE_ACCOUNT.collection(namespace)
    with pytest.raises(ValueError, match="Namespace name"):
        NAMESPACE.path(namespace)


def test_valid_names_make_the_paths_the_api_serves() -> None:
    assert SERVICE_ACCOUNT.path("deployer", "apps") == (
        "/api/v1/namespaces/apps/serviceaccounts/deployer"
    )
    assert SERVICE_ACCOUNT.path("a" * 253, "b" * 63).endswith("/" + "a" * 253)
    assert SERVICE_ACCOUNT.collection("apps") == "/api/v1/namespaces/apps/serviceaccounts"
    assert SERVICE_ACCOUNT.collection() == "/api/v1/serviceaccounts"
    assert GATEWAY_CLASS.path("ambient.waypoint-1") == (
        "/apis/gateway.networking.k8s.io/v1/gatewayclasses/ambient.waypoint-1"
    )
    assert NAMESPACE.path("istio-system") == "/api/v1/namespaces/istio-system"
    # RBAC objects may be named anything but '.', '..' or with '/' or '%' in it
    # (system:controller:... are real names); every other character is quoted.
    assert CLUSTER_ROLE.path("system:controller:x?y#z") == (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Acontroller%3Ax%3Fy%23z"
    )
    assert ROLE.path("a b", "apps") == (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/apps/roles/a%20b"
    )
    for name in ("a/b", "..", ".", "%2F", "a%b", ""):
        with pytest.raises(ValueError, match="ClusterRole name"):
            CLUSTER_ROLE.path(name)
    with pytest.raises(ValueError, match="namespace"):
        ROLE.path("reader", "a/b")


def _requests() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "ambient_operator_api_requests"
        for sample in metric.samples
        if sample.name == "ambient_operator_api_requests_total"
    )


@pytest.fixture
def unreachable() -> Kube:
    """A client of an API server that is not there: any request it made would fail."""
    return Kube(Credentials(server=f"https://127.0.0.1:{free_port()}"), timeout=2.0)


def test_no_request_is_made_for_a_name_no_object_can_carry(unreachable: Kube) -> None:
    before = _requests()
    # An object with such a name cannot exist: the answer is known without asking.
    assert unreachable.get(SERVICE_ACCOUNT, "deployer/token", "apps") is None
    assert unreachable.get(SERVICE_ACCOUNT, "deployer", "a/b") is None
    assert unreachable.get(NAMESPACE, "..") is None
    account = {"apiVersion": "v1", "kind": "ServiceAccount"}
    writes = [
        lambda: unreachable.apply({**account, "metadata": {"name": "a/b", "namespace": "apps"}}),
        lambda: unreachable.create({**account, "metadata": {"name": "x", "namespace": "a/b"}}),
        lambda: unreachable.delete(SERVICE_ACCOUNT, "..", "apps"),
        lambda: unreachable.merge_patch(SERVICE_ACCOUNT, "%2F", "apps", {}),
        lambda: unreachable.list(SERVICE_ACCOUNT, "a/b"),
    ]
    for write in writes:
        with pytest.raises(KubeError) as err:
            write()
        assert (err.value.status, err.value.reason) == (422, "Invalid"), err.value
    assert _requests() == before
    # The control: a valid name does go out, and fails.
    with pytest.raises(KubeError) as err:
        unreachable.get(SERVICE_ACCOUNT, "deployer", "apps")
    assert err.value.status == 0
    assert _requests() == before + 1


# -- the Gateway is told -----------------------------------------------------------------


def _gateway(annotations: dict[str, str], infrastructure: dict[str, Any] | None = None) -> Any:
    spec: dict[str, Any] = {
        "gatewayClassName": "ambient-waypoint",
        "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
    }
    if infrastructure:
        spec["infrastructure"] = infrastructure
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": "waypoint",
            "namespace": "apps",
            "uid": "uid-waypoint",
            "generation": 1,
            "annotations": annotations,
        },
        "spec": spec,
    }


def _class(parameters: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"controllerName": "ambientoperator.io/waypoint-controller"}
    if parameters:
        spec["parametersRef"] = parameters
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": "ambient-waypoint", "generation": 1},
        "spec": spec,
    }


@pytest.mark.parametrize("account", ["deployer/token", "..", "Deployer", "a_b", "a" * 254])
def test_a_service_account_annotation_that_is_no_name_is_invalid_parameters(
    account: str,
) -> None:
    result = render_waypoint(
        AmbientMeshSpec(),
        _gateway({"gateway.istio.io/service-account": account}),
        _class(),
        {},
    )
    assert (result.accepted.status, result.accepted.reason) == ("False", "InvalidParameters")
    assert "annotation gateway.istio.io/service-account" in result.accepted.message
    assert "cannot name a ServiceAccount" in result.accepted.message
    assert len(result.accepted.message) < 300
    assert result.objects == ()
    # The control: the same Gateway naming a valid account is deployed with it.
    fixed = render_waypoint(
        AmbientMeshSpec(), _gateway({"gateway.istio.io/service-account": "deployer"}), _class(), {}
    )
    assert fixed.accepted.status == "True"
    [deployment] = [o for o in fixed.objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "deployer"


@pytest.mark.parametrize(
    ("gateway_ref", "class_ref"),
    [
        ({"group": "", "kind": "ConfigMap", "name": "team/db-conn"}, None),
        ({"group": "", "kind": "ConfigMap", "name": ".."}, None),
        (None, {"group": "", "kind": "ConfigMap", "name": "params", "namespace": "a/b"}),
        (None, {"group": "", "kind": "ConfigMap", "name": "%2F", "namespace": "istio-system"}),
    ],
)
def test_a_parameters_ref_that_is_no_name_is_never_fetched(
    gateway_ref: dict[str, str] | None, class_ref: dict[str, str] | None
) -> None:
    gateway = _gateway({}, {"parametersRef": gateway_ref} if gateway_ref else None)
    gateway_class = _class(class_ref)
    assert parameter_refs(gateway, gateway_class) == []
    result = render_waypoint(AmbientMeshSpec(), gateway, gateway_class, {})
    assert (result.accepted.status, result.accepted.reason) == ("False", "InvalidParameters")
    assert "cannot name a ConfigMap" in result.accepted.message
    assert result.objects == ()
    if class_ref:
        verdict = class_verdict(gateway_class, {})
        assert (verdict.status, verdict.reason) == ("False", "InvalidParameters")
