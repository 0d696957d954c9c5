"""Waypoints without a cluster: render decisions, Gateway status rules, the watch caches.

The API server plays no part in what is tested here (pure functions, and the
in-memory bookkeeping of the controller); its behaviour is tested in
test_waypoint_cluster.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import Verdict
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.plan import Owner, prepare
from ambient_operator.cli.waypoint import waypoint_gateway
from ambient_operator.cluster.revisions import revision_inputs
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.controllers.waypoints import WaypointController
from ambient_operator.controllers.waypoints import controller as waypoint_controller
from ambient_operator.render import placement as pl
from ambient_operator.render.waypoints.class_defaults import (
    CLASS_DEFAULTS_NAME,
    pin_class_defaults,
    render_class_defaults,
)
from ambient_operator.render.waypoints.listeners import check_listeners, is_waypoint
from ambient_operator.render.waypoints.names import CONTROLLER, class_is_ours
from ambient_operator.render.waypoints.objects import render_gateway_class
from ambient_operator.render.waypoints.parameters import parameter_refs
from ambient_operator.render.waypoints.policy import annotation_allowed, image_allowed
from ambient_operator.render.waypoints.verdicts import (
    WaypointRender,
    class_verdict,
    render_waypoint,
)
from ambient_operator.status import waypoints as ws
from checks import every

NOW = "2026-11-30T10:00:00Z"
LATER = "2026-11-30T11:00:00Z"
VERSIONS = [f"1.{minor}" for minor in range(30, 38)]
MESH = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
HTTP = {"name": "http", "port": 80, "protocol": "HTTP"}


def gateway(
    *listeners: dict[str, Any],
    name: str = "waypoint",
    namespace: str = "apps",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    infrastructure: dict[str, Any] | None = None,
    generation: int = 1,
    status: dict[str, Any] | None = None,
    class_name: str = "ambient-waypoint",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "gatewayClassName": class_name,
        "listeners": list(listeners) or [MESH],
    }
    if infrastructure is not None:
        spec["infrastructure"] = infrastructure
    obj: dict[str, Any] = {
        "apiVersion": c.GATEWAY_API_VERSION,
        "kind": "Gateway",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": generation,
            "resourceVersion": "10",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def gateway_class(
    parameters: dict[str, Any] | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"controllerName": "ambientoperator.io/waypoint-controller"}
    if parameters:
        spec["parametersRef"] = parameters
    return {
        "apiVersion": c.GATEWAY_API_VERSION,
        "kind": "GatewayClass",
        "metadata": {"name": "ambient-waypoint", "generation": 1, "labels": labels or {}},
        "spec": spec,
    }


def params_ref(name: str = "params", **extra: str) -> dict[str, str]:
    return {"group": "", "kind": "ConfigMap", "name": name, **extra}


def render(
    gw: dict[str, Any],
    cls: dict[str, Any] | None = None,
    config_maps: dict[tuple[str, str], dict[str, Any] | None] | None = None,
    spec: AmbientMeshSpec | None = None,
    **kwargs: Any,
) -> WaypointRender:
    return render_waypoint(
        spec or AmbientMeshSpec(),
        gw,
        cls if cls is not None else gateway_class(),
        config_maps or {},
        **kwargs,
    )


def by_kind(result: WaypointRender) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in result.objects}


def pod_spec(result: WaypointRender) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(result)["Deployment"]["spec"]["template"]["spec"]
    return spec


# -- listeners and acceptance --------------------------------------------------------


def test_hbone_listener_on_15008_is_the_only_valid_one() -> None:
    checks = check_listeners(
        gateway(MESH, HTTP, {"name": "hb", "port": 15009, "protocol": "HBONE"})
    )
    assert [ch.valid for ch in checks] == [True, False, False]
    assert "accepts only protocol HBONE on port 15008" in checks[1].message
    assert "HTTP on port 80" in checks[1].message


def test_gateway_with_one_valid_listener_is_accepted() -> None:
    result = render(gateway(MESH, HTTP))
    assert result.accepted.status == "True"
    assert result.accepted.reason == "Accepted"
    assert {obj["kind"] for obj in result.objects} == {"ServiceAccount", "Deployment", "Service"}


def test_gateway_with_only_invalid_listeners_is_not_accepted_and_gets_nothing() -> None:
    result = render(gateway(HTTP))
    assert (result.accepted.status, result.accepted.reason) == ("False", "ListenersNotValid")
    assert "HBONE" in result.accepted.message and "15008" in result.accepted.message
    assert result.objects == ()


def test_spec_addresses_are_unsupported() -> None:
    gw = gateway()
    gw["spec"]["addresses"] = [{"type": "IPAddress", "value": "10.0.0.1"}]
    assert render(gw).accepted.reason == "UnsupportedAddress"


@pytest.mark.parametrize(
    ("ref", "maps", "fragment"),
    [
        (params_ref("missing"), {}, "not found"),
        ({"group": "example.com", "kind": "Params", "name": "p"}, {}, "only a core ConfigMap"),
        (params_ref(), {("apps", "params"): {"replicas": "many"}}, "replicas"),
        (params_ref(), {("apps", "params"): {"deployment": "spec: {}"}}, "allowed keys"),
        (params_ref(), {("apps", "params"): {"resources": "{requests: ["}}, "not valid YAML"),
        (params_ref(), {("apps", "params"): {"replicas": "-1"}}, "replicas"),
    ],
)
def test_bad_parameters_reject_the_gateway(
    ref: dict[str, str], maps: dict[tuple[str, str], dict[str, Any] | None], fragment: str
) -> None:
    result = render(gateway(infrastructure={"parametersRef": ref}), config_maps=maps)
    assert (result.accepted.status, result.accepted.reason) == ("False", "InvalidParameters")
    assert fragment in result.accepted.message
    assert result.objects == ()


SECRET = "postgres://admin:hunter2@db.team-b:5432/app"


@pytest.mark.parametrize(
    "data",
    [
        {"image": SECRET},
        {"replicas": SECRET},
        {"resources": f"{{requests: {{cpu: '{SECRET}'}}}}"},
        {"nodeSelector": f"{{'{SECRET}': [1]}}"},
        {"nodeSelector": f"{{zone: ['{SECRET}']}}"},
        {"tolerations": f"[{{key: a, operator: '{SECRET}'}}]"},
        {"tolerations": f"[{{key: a, value: '{SECRET}{'x' * 64}'}}]"},
        {"resources": f"{{requests: [{SECRET}"},
    ],
)
def test_a_bad_value_is_named_by_its_key_never_echoed(data: dict[str, str]) -> None:
    maps: dict[tuple[str, str], dict[str, Any] | None] = {("apps", "params"): data}
    result = render(gateway(infrastructure={"parametersRef": params_ref()}), config_maps=maps)
    assert (result.accepted.status, result.accepted.reason) == ("False", "InvalidParameters")
    assert "hunter2" not in result.accepted.message, result.accepted.message
    assert "key " in result.accepted.message


def test_class_parameters_are_read_only_from_the_mesh_namespace() -> None:
    spec = AmbientMeshSpec.model_validate({"namespace": "mesh"})
    elsewhere = gateway_class(params_ref("db-conn", namespace="team-b"))
    maps: dict[tuple[str, str], dict[str, Any] | None] = {("team-b", "db-conn"): {"image": SECRET}}
    assert parameter_refs(gateway(), elsewhere, "mesh") == []
    for verdict in (
        class_verdict(elsewhere, maps, "mesh"),
        render(gateway(), elsewhere, maps, spec).accepted,
    ):
        assert (verdict.status, verdict.reason) == ("False", "InvalidParameters")
        assert "team-b/db-conn" in verdict.message and "hunter2" not in verdict.message
    here = gateway_class(params_ref("class-params", namespace="mesh"))
    assert parameter_refs(gateway(), here, "mesh") == [("mesh", "class-params")]
    assert class_verdict(here, {("mesh", "class-params"): {"replicas": "2"}}, "mesh").status == (
        "True"
    )


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("docker.io/istio/proxyv2:1.30.3", True),
        ("docker.io/istio/proxyv2@sha256:" + "a" * 64, True),
        ("docker.io/istio", True),
        ("docker.io/istio-evil/proxyv2:1", False),
        ("docker.io/istiox:1", False),
        ("istio/proxyv2:1", False),
        ("evil.example.com/docker.io/istio/proxyv2:1", False),
    ],
)
def test_image_prefixes_match_whole_path_components(image: str, allowed: bool) -> None:
    assert image_allowed(image, ["docker.io/istio"]) is allowed
    assert image_allowed(image, ["docker.io/istio/"]) is (allowed and image != "docker.io/istio")


def test_pod_annotations_allow_exact_keys_and_prefixes() -> None:
    allowed = ["prometheus.io/*", "example.com/one"]
    assert annotation_allowed("prometheus.io/scrape", allowed)
    assert annotation_allowed("example.com/one", allowed)
    assert not annotation_allowed("example.com/two", allowed)
    assert not annotation_allowed("prometheus.io.evil/x", allowed)
    assert not annotation_allowed("container.apparmor.security.beta.kubernetes.io/x", allowed)


@pytest.mark.parametrize(
    ("policy", "data", "field"),
    [
        ({}, {"tolerations": "[{operator: Exists}]"}, None),
        ({"allowKeylessTolerations": True}, {"tolerations": "[{operator: Exists}]"}, "ok"),
        ({}, {"tolerations": "[{key: node-role.kubernetes.io/master}]"}, "deniedNodeKeys"),
        ({"deniedNodeKeys": []}, {"tolerations": "[{key: node-role.kubernetes.io/master}]"}, "ok"),
        ({}, {"nodeSelector": "{node-role.kubernetes.io/control-plane: ''}"}, "deniedNodeKeys"),
        ({}, {"image": "registry.example.com/istio/proxyv2:1"}, "imagePrefixes"),
        (
            {"imagePrefixes": ["registry.example.com/istio"]},
            {"image": "registry.example.com/istio/proxyv2:1"},
            "ok",
        ),
        (
            {},
            {"tolerations": "[{key: dedicated, operator: Exists}]", "nodeSelector": "{pool: mesh}"},
            "ok",
        ),
    ],
)
def test_parameters_are_held_to_the_policy(
    policy: dict[str, Any], data: dict[str, str], field: str | None
) -> None:
    spec = AmbientMeshSpec.model_validate({"waypoints": {"policy": policy}})
    maps: dict[tuple[str, str], dict[str, Any] | None] = {("apps", "params"): data}
    for where in ("gateway", "class"):
        if where == "gateway":
            result = render(
                gateway(infrastructure={"parametersRef": params_ref()}), config_maps=maps, spec=spec
            )
        else:
            cls = gateway_class(params_ref(namespace="istio-system"))
            result = render(gateway(), cls, {("istio-system", "params"): data}, spec)
        if field == "ok":
            assert result.accepted.status == "True", result.accepted
            continue
        assert (result.accepted.status, result.accepted.reason) == ("False", "InvalidParameters")
        expected = f"spec.waypoints.policy.{field or 'allowKeylessTolerations'}"
        assert expected in result.accepted.message, result.accepted.message
        assert result.objects == ()


def test_the_meshs_own_settings_are_not_held_to_the_policy() -> None:
    spec = AmbientMeshSpec.model_validate(
        {
            "waypoints": {
                "image": "registry.example.com/istio/proxyv2:1",
                "tolerations": [{"operator": "Exists"}],
                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            }
        }
    )
    result = render(gateway(), spec=spec)
    assert result.accepted.status == "True"
    assert pod_spec(result)["containers"][0]["image"] == "registry.example.com/istio/proxyv2:1"
    # ...and a Gateway may name the mesh's own image again.
    maps: dict[tuple[str, str], dict[str, Any] | None] = {
        ("apps", "params"): {"image": "registry.example.com/istio/proxyv2:1"}
    }
    again = render(
        gateway(infrastructure={"parametersRef": params_ref()}), config_maps=maps, spec=spec
    )
    assert again.accepted.status == "True"


def test_infrastructure_annotations_outside_the_allow_list_are_refused() -> None:
    bad = render(
        gateway(
            infrastructure={
                "annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}
            }
        )
    )
    assert (bad.accepted.status, bad.accepted.reason) == ("False", "InvalidParameters")
    assert "spec.waypoints.policy.podAnnotations" in bad.accepted.message
    good = render(gateway(infrastructure={"annotations": {"prometheus.io/scrape": "false"}}))
    assert good.accepted.status == "True"


def test_waypoint_pods_mount_no_kubernetes_api_token() -> None:
    spec = pod_spec(render(gateway()))
    assert spec["automountServiceAccountToken"] is False
    assert any(v["name"] == "istio-token" for v in spec["volumes"])


def test_a_name_that_cannot_name_a_service_is_invalid() -> None:
    result = render(gateway(name="1.waypoint"))
    assert (result.accepted.status, result.accepted.reason) == ("False", "Invalid")
    assert c.ANNOTATION_GATEWAY_NAME_OVERRIDE in result.accepted.message
    fixed = render(
        gateway(name="1.waypoint", annotations={c.ANNOTATION_GATEWAY_NAME_OVERRIDE: "wp"})
    )
    assert fixed.accepted.status == "True"
    assert by_kind(fixed)["Service"]["metadata"]["name"] == "wp"


# -- names, labels, objects -------------------------------------------------------------


def test_objects_are_named_after_the_gateway_unless_annotated() -> None:
    plain = by_kind(render(gateway()))
    assert {obj["metadata"]["name"] for obj in plain.values()} == {"waypoint"}
    annotated = by_kind(
        render(
            gateway(
                annotations={
                    c.ANNOTATION_GATEWAY_NAME_OVERRIDE: "wp-deploy",
                    c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT: "wp-sa",
                }
            )
        )
    )
    assert annotated["Deployment"]["metadata"]["name"] == "wp-deploy"
    assert annotated["Service"]["metadata"]["name"] == "wp-deploy"
    assert annotated["ServiceAccount"]["metadata"]["name"] == "wp-sa"
    pod = annotated["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "wp-sa"


def test_someone_elses_service_account_is_used_only_when_opted_in() -> None:
    annotated = gateway(annotations={c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT: "shared"})
    opted_in = {
        "metadata": {"name": "shared", "labels": {c.LABEL_WAYPOINT_SERVICE_ACCOUNT: "true"}}
    }
    result = render(annotated, foreign_service_account=opted_in)
    assert "ServiceAccount" not in by_kind(result)
    assert pod_spec(result)["serviceAccountName"] == "shared"
    refused = render(annotated, foreign_service_account={"metadata": {"name": "shared"}})
    assert (refused.accepted.status, refused.accepted.reason) == ("False", "InvalidParameters")
    assert "spec.waypoints.policy.serviceAccountLabels" in refused.accepted.message
    assert refused.objects == ()
    # {} is istiod's rule: any account of the namespace.
    anyone = AmbientMeshSpec.model_validate({"waypoints": {"policy": {"serviceAccountLabels": {}}}})
    result = render(
        annotated, spec=anyone, foreign_service_account={"metadata": {"name": "shared"}}
    )
    assert pod_spec(result)["serviceAccountName"] == "shared"


def test_an_empty_service_account_annotation_names_nothing() -> None:
    # docs/waypoints.md: without the annotation the account is the Gateway's
    # own, and one of that name held by somebody else is a NameConflict (when
    # it is written), not a policy refusal. An empty value names nothing.
    empty = gateway(annotations={c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT: ""})
    result = render(empty, foreign_service_account={"metadata": {"name": "waypoint"}})
    assert (result.accepted.status, result.accepted.reason) == ("True", "Accepted")
    assert by_kind(result)["ServiceAccount"]["metadata"]["name"] == "waypoint"
    assert pod_spec(result)["serviceAccountName"] == "waypoint"


def test_labels_selector_and_pod_template() -> None:
    result = render(gateway(infrastructure={"labels": {"team": "a", c.LABEL_GATEWAY_NAME: "x"}}))
    objs = by_kind(result)
    for obj in objs.values():
        labels = obj["metadata"]["labels"]
        assert labels[c.LABEL_GATEWAY_NAME] == "waypoint"  # ours beat infrastructure's
        assert labels[c.LABEL_GATEWAY_CLASS_NAME] == "ambient-waypoint"
        assert labels["team"] == "a"
    deploy = objs["Deployment"]
    assert deploy["spec"]["selector"]["matchLabels"] == {c.LABEL_GATEWAY_NAME: "waypoint"}
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[c.LABEL_DATAPLANE_MODE] == "none"
    assert pod_labels["sidecar.istio.io/inject"] == "false"
    assert pod_labels[c.LABEL_GATEWAY_NAME] == "waypoint"
    assert objs["Service"]["spec"]["selector"] == {c.LABEL_GATEWAY_NAME: "waypoint"}


def test_proxy_container_is_locked_down_and_probed() -> None:
    result = render(gateway(namespace="apps"))
    pod = pod_spec(result)
    (container,) = pod["containers"]
    assert container["name"] == "istio-proxy"
    assert container["image"] == "docker.io/istio/proxyv2:1.31.0"
    assert container["args"][:2] == ["proxy", "waypoint"]
    assert container["args"][container["args"].index("--domain") + 1] == (
        "$(POD_NAMESPACE).svc.cluster.local"
    )
    assert container["args"][container["args"].index("--serviceCluster") + 1] == (
        "waypoint.$(POD_NAMESPACE)"
    )
    sc = container["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (1337, 1337, True)
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    for probe in ("readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == 15021
        assert container[probe]["httpGet"]["path"] == "/healthz/ready"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CA_ADDR"] == "istiod.istio-system.svc:15012"
    assert '"discoveryAddress":"istiod.istio-system.svc:15012"' in env["PROXY_CONFIG"]
    assert env["ISTIO_META_OWNER"].endswith("/namespaces/apps/deployments/waypoint")
    assert pod["os"] == {"name": "linux"}
    assert pod["nodeSelector"] == {c.LABEL_OS: "linux"}


def test_service_has_status_port_and_one_port_per_valid_listener() -> None:
    result = render(
        gateway(
            MESH,
            HTTP,
            {"name": "mesh-b", "port": 15008, "protocol": "HBONE", "hostname": "b.example.com"},
        )
    )
    ports = by_kind(result)["Service"]["spec"]["ports"]
    assert [(p["name"], p["port"], p["appProtocol"]) for p in ports] == [
        ("status-port", 15021, "tcp"),
        ("mesh", 15008, "hbone"),
    ]


def test_istiod_revision_and_address_come_from_the_mesh() -> None:
    spec = AmbientMeshSpec.model_validate(
        {"istiod": {"revision": "canary"}, "namespace": "mesh", "clusterDomain": "corp.local"}
    )
    result = render(gateway(), spec=spec)
    container = pod_spec(result)["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CA_ADDR"] == "istiod-canary.mesh.svc:15012"
    assert "$(POD_NAMESPACE).svc.corp.local" in container["args"]
    annotations = by_kind(result)["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["istio.io/rev"] == "canary"


# -- cluster identity, network, image pulls and istiod's addresses ---------------------------
# Literal data: what istiod's waypoint template (istio-discovery/files/waypoint.yaml) and its
# deployment controller's setLabelOverrides do with the matching chart values, read from the
# pinned module's source. tests/test_istiod.py holds ours to the real istiod's own waypoints.

NETWORK = "topology.istio.io/network"


def proxy_env(result: WaypointRender) -> dict[str, str | None]:
    (container,) = pod_spec(result)["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_a_plain_mesh_renders_istiods_defaults_for_identity_and_pulls() -> None:
    result = render(gateway())
    env = proxy_env(result)
    assert env["ISTIO_META_CLUSTER_ID"] == "Kubernetes"
    assert "ISTIO_META_NETWORK" not in env
    pod = pod_spec(result)
    assert "imagePullSecrets" not in pod
    assert "imagePullPolicy" not in pod["containers"][0]
    assert all(NETWORK not in obj["metadata"]["labels"] for obj in result.objects)


def test_cluster_network_and_pulls_follow_the_mesh() -> None:
    spec = AmbientMeshSpec.model_validate(
        {
            "multiCluster": {"clusterName": "west-1"},
            "network": "net-west",
            "images": {"pullSecrets": ["reg-a", "reg-b"], "pullPolicy": "Always"},
        }
    )
    result = render(gateway(), spec=spec)
    env = proxy_env(result)
    assert (env["ISTIO_META_CLUSTER_ID"], env["ISTIO_META_NETWORK"]) == ("west-1", "net-west")
    pod = pod_spec(result)
    assert pod["imagePullSecrets"] == [{"name": "reg-a"}, {"name": "reg-b"}]
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    # istiod labels every object of a waypoint with the mesh's network, the pods included.
    assert {obj["kind"]: obj["metadata"]["labels"][NETWORK] for obj in result.objects} == {
        "ServiceAccount": "net-west",
        "Deployment": "net-west",
        "Service": "net-west",
    }
    assert by_kind(result)["Deployment"]["spec"]["template"]["metadata"]["labels"][NETWORK] == (
        "net-west"
    )
    # The ServiceAccount carries no pull secrets: istiod's template gives them to the pod.
    assert "imagePullSecrets" not in by_kind(result)["ServiceAccount"]


@pytest.mark.parametrize(
    ("own", "infra", "mesh", "label", "meta"),
    [
        # The Gateway's own label names the network, and with no infrastructure
        # labels istiod copies it (as it copies all of the Gateway's own labels).
        ("net-east", None, "net-west", "net-east", "net-east"),
        ("net-east", None, None, "net-east", "net-east"),
        # With infrastructure labels the own ones are not copied, and the own
        # label still keeps the mesh's off: no label, the mesh's network.
        ("net-east", {"team": "a"}, "net-west", None, "net-west"),
        # Without an own label the mesh's network beats an infrastructure one...
        (None, {NETWORK: "net-east"}, "net-west", "net-west", "net-west"),
        # ...which names the network when the mesh has none.
        (None, {NETWORK: "net-east"}, None, "net-east", "net-east"),
        (None, None, None, None, None),
    ],
)
def test_the_network_label_and_env_follow_istiods_precedence(
    own: str | None,
    infra: dict[str, str] | None,
    mesh: str | None,
    label: str | None,
    meta: str | None,
) -> None:
    spec = AmbientMeshSpec.model_validate({"network": mesh} if mesh else {})
    result = render(
        gateway(
            labels={NETWORK: own} if own else None,
            infrastructure={"labels": infra} if infra is not None else None,
        ),
        spec=spec,
    )
    assert {obj["metadata"]["labels"].get(NETWORK) for obj in result.objects} == {label}
    pod_labels = by_kind(result)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels.get(NETWORK) == label
    assert proxy_env(result).get("ISTIO_META_NETWORK") == meta


@pytest.mark.parametrize(
    ("istiod", "ca", "discovery"),
    [
        ({}, "istiod.istio-system.svc:15012", "istiod.istio-system.svc:15012"),
        ({"address": "mesh.example:443"}, "mesh.example:443", "mesh.example:443"),
        (
            {"address": "mesh.example:443", "caAddress": "ca.example:15012"},
            "ca.example:15012",
            "mesh.example:443",
        ),
        (
            {"address": "mesh.example:443", "xdsAddress": "xds.example:15012"},
            "mesh.example:443",
            "xds.example:15012",
        ),
        (
            {"revision": "canary", "caAddress": "ca.example:15012"},
            "ca.example:15012",
            "istiod-canary.istio-system.svc:15012",
        ),
        (
            {"caAddress": "ca.example:15012", "xdsAddress": "xds.example:15012"},
            "ca.example:15012",
            "xds.example:15012",
        ),
    ],
)
def test_ca_and_discovery_addresses_each_beat_address_which_beats_the_service(
    istiod: dict[str, str], ca: str, discovery: str
) -> None:
    result = render(gateway(), spec=AmbientMeshSpec.model_validate({"istiod": istiod}))
    env = proxy_env(result)
    assert env["CA_ADDR"] == ca
    assert env["PROXY_CONFIG"] == f'{{"discoveryAddress":"{discovery}"}}'


def test_waypoint_templates_fit_on_a_screen() -> None:
    # The project's rule for templates (tests/test_render.py checks the agents' own).
    folder = Path(__file__).resolve().parents[1] / "templates"
    found = sorted([*folder.glob("waypoint-*.j2"), *folder.glob("_waypoint-*.j2")])
    assert len(found) >= 8, found
    for path in found:
        lines = path.read_text().splitlines()
        assert len(lines) <= 60, path.name
        assert max(len(line) for line in lines) <= 100, path.name


# -- settings precedence and Linux pinning ---------------------------------------------------


def test_gateway_parameters_beat_class_parameters_beat_mesh_defaults() -> None:
    spec = AmbientMeshSpec.model_validate(
        {
            "waypoints": {
                "replicas": 2,
                "nodeSelector": {"pool": "mesh"},
                "image": "r.io/p:1",
                "policy": {"imagePrefixes": ["r.io"]},
            }
        }
    )
    cls = gateway_class(params_ref("class-params", namespace="istio-system"))
    maps: dict[tuple[str, str], dict[str, Any] | None] = {
        ("istio-system", "class-params"): {"replicas": "3", "nodeSelector": "{zone: a}"},
        ("apps", "gw-params"): {
            "replicas": "4",
            "resources": "{requests: {cpu: 50m}}",
            "image": "r.io/p:2",
        },
    }
    result = render(
        gateway(infrastructure={"parametersRef": params_ref("gw-params")}), cls, maps, spec
    )
    pod = pod_spec(result)
    assert by_kind(result)["Deployment"]["spec"]["replicas"] == 4
    assert pod["nodeSelector"] == {"pool": "mesh", "zone": "a", c.LABEL_OS: "linux"}
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "50m"}}
    assert pod["containers"][0]["image"] == "r.io/p:2"


def test_windows_placement_is_overridden_and_reported() -> None:
    maps: dict[tuple[str, str], dict[str, Any] | None] = {
        ("apps", "params"): {
            "nodeSelector": yaml.safe_dump(
                {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: "10.0.20348", "pool": "x"}
            ),
            "tolerations": yaml.safe_dump(
                [
                    {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"},
                    {"key": "dedicated", "operator": "Exists"},
                ]
            ),
        }
    }
    result = render(gateway(infrastructure={"parametersRef": params_ref()}), config_maps=maps)
    pod = pod_spec(result)
    assert pod["nodeSelector"] == {"pool": "x", c.LABEL_OS: "linux"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    (warning,) = result.warnings
    assert warning[0] == "WindowsPlacementIgnored"
    # Keys, not values: the values came from a ConfigMap.
    assert "nodeSelector kubernetes.io/os (not linux)" in warning[1]
    assert f"nodeSelector {c.LABEL_WINDOWS_BUILD}," in warning[1]
    assert "10.0.20348" not in warning[1]


@given(
    st.dictionaries(
        st.sampled_from(
            [c.LABEL_OS, "beta.kubernetes.io/os", c.LABEL_WINDOWS_BUILD, "pool", "zone"]
        ),
        st.sampled_from(["linux", "windows", "a", "10.0.20348"]),
    )
)
def test_pinning_always_selects_linux_and_nothing_windows_only(selector: dict[str, str]) -> None:
    pinned, _, dropped = pl.pin_linux(selector, [])
    assert pinned[c.LABEL_OS] == "linux"
    assert pl.pod_os(pinned) == "linux"
    assert not any(key.startswith("node.kubernetes.io/windows-") for key in pinned)
    assert pinned.get("beta.kubernetes.io/os", "linux") == "linux"
    kept = {k: v for k, v in selector.items() if k in ("pool", "zone")}
    assert {k: v for k, v in pinned.items() if k in ("pool", "zone")} == kept
    assert len(dropped) == sum(
        1
        for k, v in selector.items()
        if (k in (c.LABEL_OS, "beta.kubernetes.io/os") and v != "linux")
        or k == c.LABEL_WINDOWS_BUILD
    )


# -- waypoint-for ------------------------------------------------------------------------


def test_waypoint_for_gateway_label_beats_class_label() -> None:
    cls = gateway_class(labels={c.LABEL_WAYPOINT_FOR: "all"})
    from_class = render(gateway(), cls)
    assert from_class.waypoint_for == "all"
    assert by_kind(from_class)["Deployment"]["metadata"]["labels"][c.LABEL_WAYPOINT_FOR] == "all"
    own = render(gateway(labels={c.LABEL_WAYPOINT_FOR: "workload"}), cls)
    assert own.waypoint_for == "workload"
    assert "workload traffic" in own.accepted.message


def test_invalid_waypoint_for_is_reported_not_copied() -> None:
    result = render(gateway(labels={c.LABEL_WAYPOINT_FOR: "everything"}))
    assert result.accepted.status == "True"
    assert result.waypoint_for is None
    assert result.warnings[0][0] == "InvalidWaypointFor"
    assert c.LABEL_WAYPOINT_FOR not in by_kind(result)["Service"]["metadata"]["labels"]


# -- schema validity and determinism -----------------------------------------------------------


def _all_rendered() -> list[dict[str, Any]]:
    owner = Owner(c.GATEWAY_API_VERSION, "Gateway", "waypoint", "uid-waypoint")
    result = render(
        gateway(
            MESH,
            HTTP,
            infrastructure={
                "labels": {"team": "a"},
                # One the default policy allows: a refused Gateway renders nothing to judge.
                "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
                "parametersRef": params_ref(),
            },
        ),
        config_maps={
            ("apps", "params"): {
                "replicas": "2",
                "tolerations": "[{key: dedicated, operator: Exists, effect: NoSchedule}]",
            }
        },
        # Every optional field the Deployment can carry, for the schemas to judge.
        spec=AmbientMeshSpec.model_validate(
            {
                "multiCluster": {"clusterName": "west-1"},
                "network": "net-west",
                "images": {"pullSecrets": ["reg-a"], "pullPolicy": "IfNotPresent"},
            }
        ),
    )
    assert [obj["kind"] for obj in result.objects] == ["ServiceAccount", "Deployment", "Service"], (
        result.accepted
    )
    objects = [prepare(obj, owner, CONTROLLER) for obj in result.objects]
    overlay, _ = pin_class_defaults("spec:\n  replicas: 2\n")
    assert overlay is not None
    objects.append(render_class_defaults(CLASS_DEFAULTS_NAME, "istio-system", overlay))
    return objects


@pytest.mark.parametrize("version", VERSIONS)
def test_rendered_objects_validate_strictly(version: str) -> None:
    for obj in _all_rendered():
        try:
            kubernetes_validate.validate(obj, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']} invalid for {version}: {path}: {err.message}")


def test_render_is_deterministic() -> None:
    assert _all_rendered() == _all_rendered()
    assert yaml.safe_dump(_all_rendered()) == yaml.safe_dump(_all_rendered())


def test_gateway_class_is_ours() -> None:
    spec = AmbientMeshSpec.model_validate(
        {"waypoints": {"className": "wp", "controllerName": "example.com/wp"}}
    )
    cls = render_gateway_class(spec)
    assert cls["metadata"]["name"] == "wp"
    assert cls["spec"]["controllerName"] == "example.com/wp"
    assert len(cls["spec"]["description"]) <= 64  # Gateway API's limit
    assert class_is_ours(cls, "example.com/wp")
    assert not class_is_ours(cls, c.ISTIO_MESH_CONTROLLER)
    assert not class_is_ours(None, "example.com/wp")


def test_class_with_bad_parameters_is_not_accepted() -> None:
    cls = gateway_class(params_ref("nope", namespace="istio-system"))
    verdict = class_verdict(cls, {})
    assert (verdict.status, verdict.reason) == ("False", "InvalidParameters")
    assert class_verdict(gateway_class(), {}).status == "True"


# -- istiod's class defaults ----------------------------------------------------------------


def test_class_defaults_keep_user_content_and_add_the_pin() -> None:
    user = yaml.safe_dump(
        {
            "metadata": {"annotations": {"team": "mesh"}},
            "spec": {
                "replicas": 2,
                "template": {"spec": {"nodeSelector": {"pool": "infra", c.LABEL_OS: "windows"}}},
            },
        }
    )
    merged, problem = pin_class_defaults(user)
    assert problem is None and merged is not None
    doc = yaml.safe_load(merged)
    assert doc["metadata"] == {"annotations": {"team": "mesh"}}
    assert doc["spec"]["replicas"] == 2
    assert doc["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "infra", c.LABEL_OS: "linux"}
    # Idempotent: a pinned overlay needs no write.
    assert pin_class_defaults(merged) == (None, None)


@pytest.mark.parametrize("text", [None, "", "   \n"])
def test_class_defaults_from_nothing(text: str | None) -> None:
    merged, problem = pin_class_defaults(text)
    assert problem is None
    assert yaml.safe_load(merged or "") == {
        "spec": {"template": {"spec": {"nodeSelector": {c.LABEL_OS: "linux"}}}}
    }


@pytest.mark.parametrize("text", ["[1, 2]", "spec: [a]", "spec: {template: 3}", "a: [", ": :"])
def test_unreadable_class_defaults_are_left_alone(text: str) -> None:
    merged, problem = pin_class_defaults(text)
    assert merged is None and problem


# -- Gateway status ----------------------------------------------------------------------------

ACCEPTED = Verdict("Accepted", "True", "Accepted", "ok")


def deployment(available: int, replicas: int = 1) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"availableReplicas": available}}


def service(ip: str | None = "10.96.0.20", name: str = "waypoint") -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if ip:
        spec = {"clusterIP": ip, "clusterIPs": [ip]}
    return {"metadata": {"name": name, "namespace": "apps"}, "spec": spec}


@pytest.mark.parametrize(
    ("accepted", "replicas", "deploy", "svc", "error", "expected"),
    [
        (ACCEPTED, 1, deployment(1), service(), None, ("True", "Programmed")),
        (ACCEPTED, 1, deployment(0), service(), None, ("False", "Pending")),
        (ACCEPTED, 0, deployment(1), service(), None, ("False", "NoResources")),
        (ACCEPTED, 1, None, None, None, ("False", "Pending")),
        (ACCEPTED, 1, deployment(1), service(None), None, ("False", "AddressNotAssigned")),
        (ACCEPTED, 1, deployment(1), service(), "boom", ("False", "Invalid")),
        (
            Verdict("Accepted", "False", "ListenersNotValid", "x"),
            1,
            None,
            None,
            None,
            ("False", "Invalid"),
        ),
    ],
)
def test_programmed_reasons(
    accepted: Verdict,
    replicas: int,
    deploy: dict[str, Any] | None,
    svc: dict[str, Any] | None,
    error: str | None,
    expected: tuple[str, str],
) -> None:
    verdict = ws.programmed_verdict(accepted, replicas, deploy, svc, error)
    assert (verdict.status, verdict.reason) == expected


def _status(
    gw: dict[str, Any], programmed: Verdict, svc: dict[str, Any] | None, now: str = NOW
) -> dict[str, Any]:
    return ws.gateway_status(
        gw, ACCEPTED, programmed, check_listeners(gw), svc, "cluster.local", now
    )


PROGRAMMED = Verdict("Programmed", "True", "Programmed", "1/1")
PENDING = Verdict("Programmed", "False", "NoResources", "0 replicas")


def test_addresses_appear_when_programmed_and_are_never_removed() -> None:
    gw = gateway(MESH, HTTP)
    assert "addresses" not in _status(gw, PENDING, service())
    ready = _status(gw, PROGRAMMED, service())
    assert ready["addresses"] == [
        {"type": "IPAddress", "value": "10.96.0.20"},
        {"type": "Hostname", "value": "waypoint.apps.svc.cluster.local"},
    ]
    gw["status"] = ready
    scaled_down = _status(gw, PENDING, service())
    assert scaled_down["addresses"] == ready["addresses"]
    gw["status"] = scaled_down
    gone = _status(gw, PENDING, None)
    assert gone["addresses"] == ready["addresses"]
    gw["status"] = gone
    moved = _status(gw, PROGRAMMED, service("10.96.0.99"))
    assert moved["addresses"][:2] == ready["addresses"]
    assert {"type": "IPAddress", "value": "10.96.0.99"} in moved["addresses"]


def test_listener_status_rejects_unsupported_protocols() -> None:
    gw = gateway(MESH, HTTP)
    listeners = {item["name"]: item for item in _status(gw, PROGRAMMED, service())["listeners"]}
    assert set(listeners) == {"mesh", "http"}
    for item in listeners.values():
        assert item["supportedKinds"] == [] and item["attachedRoutes"] == 0
        assert {cond["type"] for cond in item["conditions"]} == {
            "Accepted",
            "Programmed",
            "ResolvedRefs",
        }
    mesh = {cond["type"]: cond for cond in listeners["mesh"]["conditions"]}
    http = {cond["type"]: cond for cond in listeners["http"]["conditions"]}
    assert (mesh["Accepted"]["status"], mesh["Programmed"]["status"]) == ("True", "True")
    assert (http["Accepted"]["status"], http["Accepted"]["reason"]) == (
        "False",
        "UnsupportedProtocol",
    )
    assert "only protocol HBONE on port 15008" in http["Accepted"]["message"]
    assert http["Programmed"]["status"] == "False"


def test_route_kinds_cannot_attach_to_a_waypoint_listener() -> None:
    listener = {**MESH, "allowedRoutes": {"kinds": [{"kind": "HTTPRoute"}]}}
    gw = gateway(listener)
    (item,) = _status(gw, PROGRAMMED, service())["listeners"]
    resolved = next(cond for cond in item["conditions"] if cond["type"] == "ResolvedRefs")
    assert (resolved["status"], resolved["reason"]) == ("False", "InvalidRouteKinds")


def test_observed_generation_and_transition_times() -> None:
    gw = gateway(generation=3)
    first = _status(gw, PROGRAMMED, service())
    # A Gateway's conditions are Accepted and Programmed.
    every(first["conditions"], lambda cond: cond["observedGeneration"] == 3, "conditions", count=2)
    gw["status"] = first
    gw["metadata"]["generation"] = 4
    again = _status(gw, PROGRAMMED, service(), now=LATER)
    every(again["conditions"], lambda cond: cond["observedGeneration"] == 4, "conditions", count=2)
    every(
        again["conditions"], lambda cond: cond["lastTransitionTime"] == NOW, "conditions", count=2
    )
    gw["status"] = again
    flipped = _status(gw, PENDING, service(), now=LATER)
    times = {cond["type"]: cond["lastTransitionTime"] for cond in flipped["conditions"]}
    assert times == {"Accepted": NOW, "Programmed": LATER}


def test_no_write_when_only_times_differ() -> None:
    gw = gateway()
    desired = _status(gw, PROGRAMMED, service())
    live = copy.deepcopy(desired)
    for cond in live["conditions"]:
        cond["lastTransitionTime"] = LATER
    live["conditions"].append(
        {
            "type": "SomeoneElses",
            "status": "True",
            "reason": "X",
            "message": "",
            "lastTransitionTime": NOW,
        }
    )
    assert not ws.gateway_status_changed(desired, live)
    live["conditions"][1]["status"] = "False"
    assert ws.gateway_status_changed(desired, live)
    assert ws.gateway_status_changed(desired, {})


address = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["IPAddress", "Hostname"]),
        "value": st.sampled_from([f"10.96.0.{i}" for i in range(30)] + ["a.b.svc"]),
    }
)
addresses = st.lists(address, max_size=20)


# A Service offers at most two cluster IPs and one name.
current_addresses = st.lists(address, max_size=3)


@given(addresses, current_addresses)
def test_merged_addresses_keep_what_was_reported(
    previous: list[dict[str, str]], current: list[dict[str, str]]
) -> None:
    merged = ws.merge_addresses(previous, current)
    keys = [(a["type"], a["value"]) for a in merged]
    assert len(keys) == len(set(keys)) <= ws.MAX_ADDRESSES
    assert all((a["type"], a["value"]) in keys for a in current)
    unique = list(dict.fromkeys((a["type"], a["value"]) for a in [*previous, *current]))
    if len(unique) <= ws.MAX_ADDRESSES:
        assert keys == unique  # nothing dropped, order kept
    assert ws.merge_addresses(merged, current) == merged


def test_class_status() -> None:
    cls = gateway_class()
    verdict = class_verdict(cls, {})
    desired = ws.class_status(cls, verdict, NOW)
    (cond,) = desired["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Accepted", "True", "Accepted")
    assert ws.class_status_changed(desired, None)
    assert not ws.class_status_changed(desired, desired)


# -- the controller's bookkeeping ------------------------------------------------------------


def _controller() -> WaypointController:
    return WaypointController(ClusterState(), None, None)  # type: ignore[arg-type]


def test_revisions_are_read_again_only_when_a_tag_or_a_namespaces_rev_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctl = _controller()
    rows = {row.id: row.record for row in state_watches(ctl.state, [])}
    walks: list[int] = []  # each walk of every namespace, by its count of namespaces

    def counted(tags: Any, namespaces: Any) -> Any:
        walks.append(len(namespaces))
        return revision_inputs(tags, namespaces)

    monkeypatch.setattr(waypoint_controller, "revision_inputs", counted)

    def namespace(name: str, version: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "resourceVersion": version, "labels": labels}}

    def tag(revision: str) -> dict[str, Any]:
        labels = {"istio.io/tag": "prod", c.LABEL_REVISION: revision}
        return {"metadata": {"name": "istio-revision-tag-prod", "labels": labels}}

    rows["namespaces"](None, namespace("shop", "1"))
    assert ctl.revisions_moved()  # the first pass reads them
    assert not ctl.revisions_moved()
    rows["namespaces"](None, namespace("shop", "2", **{"istio.io/dataplane-mode": "ambient"}))
    assert not ctl.revisions_moved()
    rows["namespaces"](None, namespace("shop", "3", **{c.LABEL_REVISION: "prod"}))
    assert ctl.revisions_moved()
    rows["revision-tags"](None, tag("canary"))
    assert ctl.revisions_moved() and ctl.tags == {"prod": "canary"}
    rows["revision-tags"](None, tag("canary"))  # the same again: no change
    assert not ctl.revisions_moved()
    rows["namespaces"]("DELETED", namespace("shop", "4"))
    assert ctl.revisions_moved()
    rows["revision-tags"]("DELETED", tag("canary"))
    assert ctl.revisions_moved() and ctl.tags == {}
    # Read on the first call and after each of the four moves; never for a
    # dataplane-mode label, a tag written again, or a call with nothing new.
    assert walks == [1, 1, 1, 0, 0]


def test_gateway_events_mark_only_that_gateway_and_skip_stale_copies() -> None:
    ctl = _controller()
    gw = gateway()
    ctl.on_gateway("ADDED", gw)
    assert ctl.dirty == {("apps", "waypoint")}
    ctl.dirty.clear()
    ctl.on_gateway("MODIFIED", gw)  # same resourceVersion: our own write coming back
    assert not ctl.dirty
    newer = copy.deepcopy(gw)
    newer["metadata"]["resourceVersion"] = "11"
    ctl.on_gateway("MODIFIED", newer)
    assert ctl.dirty == {("apps", "waypoint")}


def _deployment() -> dict[str, Any]:
    """The Deployment of Gateway apps/waypoint, as its watch reports it."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "waypoint",
            "namespace": "apps",
            "resourceVersion": "5",
            "labels": {c.LABEL_GATEWAY_NAME: "waypoint"},
        },
    }


def test_owned_object_events_mark_their_gateway() -> None:
    ctl = _controller()
    ctl.on_gateway("ADDED", gateway())
    ctl.on_gateway("ADDED", gateway(name="other"))
    ctl.dirty.clear()
    deploy = _deployment()
    ctl.on_owned("MODIFIED", deploy)
    assert ctl.dirty == {("apps", "waypoint")}
    assert ("apps/v1", "Deployment", "apps", "waypoint") in ctl.objects[("apps", "waypoint")]
    ctl.on_owned("DELETED", deploy)
    assert ("apps", "waypoint") not in ctl.objects


def _versioned(obj: dict[str, Any], version: str, **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = version
    out.update(changes)
    return out


def test_a_gateway_change_is_keyed_and_its_status_is_that_gateways_alone() -> None:
    ctl = _controller()
    state = ctl.state
    gw = gateway()

    def taken() -> tuple[bool, bool, bool]:
        # (the waypoints' loop: urgent, keyed; the operator's pass poked), then cleared
        seen = (ctl.urgent, ctl.keyed, state.trigger.is_set())
        ctl.urgent = ctl.keyed = False
        state.trigger.clear()
        return seen

    ctl.on_gateway("ADDED", gw)
    assert taken() == (True, True, True)
    # istiod (or our own status write seen late) changes its status only.
    ctl.dirty.clear()
    ctl.on_gateway("MODIFIED", _versioned(gw, "11", status={"addresses": [{"value": "10.0.0.9"}]}))
    assert ctl.dirty == {("apps", "waypoint")}
    assert taken() == (True, False, False)
    # A label (istio.io/rev names istiod) alters what is written for it.
    relabelled = _versioned(gw, "12")
    relabelled["metadata"]["labels"] = {c.LABEL_REVISION: "canary"}
    ctl.on_gateway("MODIFIED", relabelled)
    assert taken() == (True, True, True)
    ctl.on_gateway("DELETED", relabelled)
    assert taken() == (True, True, True)


def test_our_objects_rolling_along_is_status_and_their_drift_is_keyed() -> None:
    ctl = _controller()
    ctl.on_gateway("ADDED", gateway())
    ctl.keyed = False
    deploy = _deployment()
    deploy["metadata"]["generation"] = 1
    deploy["spec"] = {"replicas": 1}
    ctl.on_owned("ADDED", deploy)
    assert ctl.keyed  # ours, seen for the first time
    ctl.keyed = False
    ctl.on_owned("MODIFIED", _versioned(deploy, "6", status={"availableReplicas": 1}))
    assert (ctl.urgent, ctl.keyed) == (True, False)
    edited = _versioned(deploy, "7", spec={"replicas": 3})
    edited["metadata"]["generation"] = 2
    ctl.on_owned("MODIFIED", edited)
    assert ctl.keyed
    ctl.keyed = False
    ctl.on_owned("DELETED", edited)
    assert ctl.keyed


def test_class_events_mark_the_gateways_of_that_class() -> None:
    ctl = _controller()
    ctl.on_gateway("ADDED", gateway())
    ctl.on_gateway("ADDED", gateway(name="istio", class_name="istio-waypoint"))
    ctl.dirty.clear()
    ctl.on_gateway_class("ADDED", {**gateway_class(), "metadata": {"name": "ambient-waypoint"}})
    assert ctl.dirty == {("apps", "waypoint")}
    assert ctl.classes_dirty


def test_config_maps_are_watched_only_while_read() -> None:
    ctl = _controller()
    assert not ctl.wants_config_map("params", "apps", {})
    assert ctl.wants_config_map("x", "istio-system", {c.LABEL_DEFAULTS_FOR_CLASS: "istio-waypoint"})
    ctl._set_reads("gw:apps/waypoint", [("apps", "params")])
    ctl.config_maps[("apps", "params")] = {"metadata": {"name": "params", "namespace": "apps"}}
    assert ctl.wants_config_map("params", "apps", {})
    ctl._set_reads("gw:apps/waypoint", [])
    assert not ctl.wants_config_map("params", "apps", {})
    assert ("apps", "params") not in ctl.config_maps  # would go stale unwatched


def test_cli_gateway_shape() -> None:
    gw = waypoint_gateway("apps", "waypoint", "ambient-waypoint", "all")
    assert gw["spec"] == {
        "gatewayClassName": "ambient-waypoint",
        "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
    }
    assert gw["metadata"]["labels"] == {c.LABEL_WAYPOINT_FOR: "all"}
    assert is_waypoint(gw)
