"""A team that may only create Gateways and ConfigMaps cannot use a waypoint to reach further.

Issue 14's waypoint attacks, each run as that team: a ServiceAccount whose
Role allows Gateways and ConfigMaps in its own namespace and nothing else,
against the real API server, with the operator running as the chart's
ServiceAccount under the chart's RBAC (test_chart_rbac's fixtures). The
other team's objects are made by the cluster admin; the expected outcome of
every case is written here, never taken from the operator's code.

Waiting for "the operator has handled this" uses its own pass counter: two
completed waypoint passes after a change mean the change was seen by a pass
that started after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import test_chart_rbac as chart_rbac
from ambient_devcluster import LocalCluster, api_client_for
from ambient_devcluster.harness import condition
from ambient_operator.api import constants as c
from conftest import unique_name, wait_for
from operator_harness import AuditLog
from test_chart_rbac import Identity, Running, _fail_with_log

# Reused, not copied: the chart's ServiceAccount and RBAC, the shared
# AmbientMesh, and the operator running as that ServiceAccount.
audit = chart_rbac.audit
identity = chart_rbac.identity
mesh = chart_rbac.mesh
operator = chart_rbac.operator

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
CLASS = "ambient-waypoint"
CONTROLLER = "ambientoperator.io/waypoint-controller"
MESH_LISTENER = {"name": "mesh", "port": c.PORT_HBONE, "protocol": "HBONE"}
OPT_IN = "ambientoperator.io/waypoint-service-account"
TIMEOUT = 90.0
PASSES = "ambient_operator_reconcile_duration_seconds_count"
# What the other team keeps in a ConfigMap: it must never be echoed.
SECRET_VALUE = "postgres://admin:hunter2@db.team-b.svc:5432/app"
SECRET_FRAGMENT = "hunter2"


@dataclass(frozen=True)
class Team:
    """The unprivileged team: its namespace and an API client acting as it."""

    namespace: str
    api: client.ApiClient


@pytest.fixture
def team(cluster: LocalCluster, k8s: client.ApiClient) -> Iterator[Team]:
    """A namespace, and a ServiceAccount in it allowed only Gateways and ConfigMaps there."""
    core, rbac = client.CoreV1Api(k8s), client.RbacAuthorizationV1Api(k8s)
    ns = unique_name("team")
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "team"}})
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "team"},
            "rules": [
                {"apiGroups": [GW_GROUP], "resources": ["gateways"], "verbs": verbs},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs},
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "team"},
            "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": ns}],
        },
    )
    with api_client_for(cluster.serviceaccount_kubeconfig(ns, "team")) as api:
        # The team really is that narrow: no Services, no pods, no Secrets.
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_namespaced_service(ns)
        assert refused.value.status == 403
        yield Team(ns, api)
    with contextlib.suppress(ApiException):
        core.delete_namespace(ns)


# -- helpers ----------------------------------------------------------------------------------


def create_gateway(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    class_name: str = CLASS,
    annotations: dict[str, str] | None = None,
    infrastructure: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"gatewayClassName": class_name, "listeners": [MESH_LISTENER]}
    if infrastructure:
        spec["infrastructure"] = infrastructure
    body = {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }
    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", body
    )
    return created


def get_gateway(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", name
    )
    return obj


def judged(
    op: Running, api: client.ApiClient, namespace: str, name: str, kind: str
) -> dict[str, Any]:
    """The `kind` condition of a Gateway once the operator wrote it for its generation."""

    def ready() -> dict[str, Any] | None:
        gw = get_gateway(api, namespace, name)
        cond = condition(gw, kind)
        return cond if cond.get("observedGeneration") == gw["metadata"]["generation"] else None

    try:
        return wait_for(ready, TIMEOUT, f"{kind} of Gateway {namespace}/{name}")
    except TimeoutError:
        _fail_with_log(op.op, f"Gateway {namespace}/{name} never judged")


def programmed(op: Running, api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        gw = get_gateway(api, namespace, name)
        cond = condition(gw, "Programmed")
        current = cond.get("observedGeneration") == gw["metadata"]["generation"]
        return gw if current and cond["status"] == "True" else None

    try:
        return wait_for(up, TIMEOUT, f"Gateway {namespace}/{name} Programmed")
    except TimeoutError:
        gw = get_gateway(api, namespace, name)
        _fail_with_log(op.op, f"{name} not Programmed: {gw.get('status')}")


def two_passes_later(op: Running) -> None:
    """Wait until a waypoint pass that started after now has completed."""
    before = op.op.metric(PASSES, controller="waypoints")
    wait_for(
        lambda: op.op.metric(PASSES, controller="waypoints") >= before + 2,
        TIMEOUT,
        "two waypoint passes",
    )


def snapshot(obj: Any) -> dict[str, Any]:
    """What another team's object must keep: identity, labels, annotations, owners, spec."""
    meta = obj.metadata
    spec = getattr(obj, "spec", None)
    return {
        "uid": meta.uid,
        "labels": meta.labels,
        "annotations": meta.annotations,
        "ownerReferences": meta.owner_references,
        "spec": spec.to_dict() if spec is not None else None,
    }


def events_mentioning(k8s: client.ApiClient, text: str) -> list[str]:
    events = client.CoreV1Api(k8s).list_event_for_all_namespaces().items
    return [f"{e.reason}: {e.message}" for e in events if text in (e.message or "")]


def waypoint_pods(k8s: client.ApiClient, namespace: str, gateway: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(k8s).list_namespaced_pod(
        namespace, label_selector=f"{c.LABEL_GATEWAY_NAME}={gateway}"
    )
    return list(pods.items)


def deployment_of(k8s: client.ApiClient, namespace: str, name: str) -> client.V1Deployment | None:
    try:
        return client.AppsV1Api(k8s).read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def others_objects(k8s: client.ApiClient, namespace: str, name: str) -> None:
    """Another team's Service, Deployment and (cloud-identity) ServiceAccount, all `name`."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    selector = {"app": name}
    core.create_namespaced_service_account(
        namespace,
        {
            "metadata": {
                "name": name,
                "annotations": {"iam.gke.io/gcp-service-account": f"{name}@corp.example"},
            }
        },
    )
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": name, "labels": selector},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80}]},
        },
    )
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": name, "labels": selector},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": selector},
                    "spec": {
                        "serviceAccountName": name,
                        "containers": [{"name": "app", "image": "example.com/app:1"}],
                    },
                },
            },
        },
    )

    # kube-controller-manager annotates a new Deployment with its revision:
    # a change of its own, not the operator's, so it comes before the snapshot.
    def observed() -> bool:
        live = apps.read_namespaced_deployment(name, namespace)
        return bool(
            (live.metadata.annotations or {}).get("deployment.kubernetes.io/revision")
            and (live.status.observed_generation or 0) >= live.metadata.generation
        )

    wait_for(observed, TIMEOUT, f"Deployment {namespace}/{name} observed by its controller")


def read_all(k8s: client.ApiClient, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    return {
        "ServiceAccount": snapshot(core.read_namespaced_service_account(name, namespace)),
        "Service": snapshot(core.read_namespaced_service(name, namespace)),
        "Deployment": snapshot(apps.read_namespaced_deployment(name, namespace)),
    }


def delete_and_collect(k8s: client.ApiClient, team: Team, gateway: dict[str, Any]) -> None:
    """Delete a Gateway as the team and wait until garbage collection handled it.

    A ConfigMap owned by the Gateway is the witness: once it is collected,
    the collector has acted on the Gateway's dependents.
    """
    core = client.CoreV1Api(k8s)
    witness = unique_name("witness")
    meta = gateway["metadata"]
    core.create_namespaced_config_map(
        team.namespace,
        {
            "metadata": {
                "name": witness,
                "ownerReferences": [
                    {
                        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
                        "kind": "Gateway",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    }
                ],
            }
        },
    )
    client.CustomObjectsApi(team.api).delete_namespaced_custom_object(
        GW_GROUP, GW_VERSION, team.namespace, "gateways", meta["name"]
    )

    def collected() -> bool:
        try:
            core.read_namespaced_config_map(witness, team.namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(collected, TIMEOUT, "garbage collection of the Gateway's dependents")


# -- ownership before every write ----------------------------------------------------------------


def test_a_gateway_named_like_another_teams_objects_leaves_them_alone(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    others_objects(k8s, team.namespace, "frontend")
    before = read_all(k8s, team.namespace, "frontend")
    gateway = create_gateway(team.api, team.namespace, "frontend")

    cond = judged(operator, team.api, team.namespace, "frontend", "Programmed")
    assert read_all(k8s, team.namespace, "frontend") == before
    assert (cond["status"], cond["reason"]) == ("False", "NameConflict"), cond
    for kind in ("Service", "Deployment", "ServiceAccount"):
        assert f"{kind} {team.namespace}/frontend" in cond["message"], cond["message"]
    gw = get_gateway(team.api, team.namespace, "frontend")
    assert not (gw.get("status") or {}).get("addresses"), "another team's address advertised"
    assert condition(gw, "Accepted")["status"] == "True"

    two_passes_later(operator)
    assert read_all(k8s, team.namespace, "frontend") == before
    delete_and_collect(k8s, team, gateway)
    two_passes_later(operator)
    assert read_all(k8s, team.namespace, "frontend") == before


def test_a_new_gateways_first_request_for_each_name_is_its_create(
    operator: Running, team: Team, identity: Identity, audit: AuditLog
) -> None:
    """Every name is known free from the watches: none is asked for before it is written.

    The conflicts above are found before any write, by asking for the names
    the watches saw taken; here none is taken, so the first request naming
    each object is the apply that creates it (201), whose precondition would
    refuse a name taken meanwhile (apply/writer.py).
    """
    since = audit.mark()
    create_gateway(team.api, team.namespace, "fresh")
    programmed(operator, team.api, team.namespace, "fresh")
    requests: dict[str, list[tuple[str, int]]] = {}
    for e in audit.events(since, user=identity.user):
        ref = e.get("objectRef") or {}
        if ref.get("namespace") == team.namespace and ref.get("name") == "fresh":
            code = int((e.get("responseStatus") or {}).get("code") or 0)
            requests.setdefault(str(ref.get("resource")), []).append((e["verb"], code))
    for resource in ("serviceaccounts", "deployments", "services"):
        assert requests.get(resource, [])[:1] == [("patch", 201)], requests


def test_a_name_override_and_a_class_switch_leave_another_teams_service_alone(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_service(
        team.namespace,
        {
            "metadata": {"name": "payments"},
            "spec": {"selector": {"app": "payments"}, "ports": [{"name": "http", "port": 80}]},
        },
    )
    before = snapshot(core.read_namespaced_service("payments", team.namespace))
    create_gateway(
        team.api,
        team.namespace,
        "innocent",
        annotations={c.ANNOTATION_GATEWAY_NAME_OVERRIDE: "payments"},
    )
    cond = judged(operator, team.api, team.namespace, "innocent", "Programmed")
    assert snapshot(core.read_namespaced_service("payments", team.namespace)) == before
    assert (cond["status"], cond["reason"]) == ("False", "NameConflict"), cond
    assert f"Service {team.namespace}/payments" in cond["message"]

    # A class the operator does not serve: whatever it wrote for this Gateway
    # goes, and only that.
    elsewhere = unique_name("elsewhere")
    client.CustomObjectsApi(k8s).create_cluster_custom_object(
        GW_GROUP,
        GW_VERSION,
        "gatewayclasses",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": elsewhere},
            "spec": {"controllerName": "example.com/elsewhere"},
        },
    )
    try:
        client.CustomObjectsApi(team.api).patch_namespaced_custom_object(
            GW_GROUP,
            GW_VERSION,
            team.namespace,
            "gateways",
            "innocent",
            {"spec": {"gatewayClassName": elsewhere}},
        )
        two_passes_later(operator)
        assert snapshot(core.read_namespaced_service("payments", team.namespace)) == before
    finally:
        with contextlib.suppress(ApiException):
            client.CustomObjectsApi(k8s).delete_cluster_custom_object(
                GW_GROUP, GW_VERSION, "gatewayclasses", elsewhere
            )


def test_two_gateways_with_one_override_do_not_fight_over_it(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    core = client.CoreV1Api(k8s)
    override = {c.ANNOTATION_GATEWAY_NAME_OVERRIDE: "shared"}
    create_gateway(team.api, team.namespace, "first", annotations=override)
    first = programmed(operator, team.api, team.namespace, "first")
    service = core.read_namespaced_service("shared", team.namespace)
    (ref,) = service.metadata.owner_references
    assert (ref.name, ref.uid) == ("first", first["metadata"]["uid"])

    create_gateway(team.api, team.namespace, "second", annotations=override)
    cond = judged(operator, team.api, team.namespace, "second", "Programmed")
    held = core.read_namespaced_service("shared", team.namespace)
    assert held.metadata.resource_version == service.metadata.resource_version
    assert (cond["status"], cond["reason"]) == ("False", "NameConflict"), cond
    assert f"Service {team.namespace}/shared" in cond["message"]
    assert "Gateway first" in cond["message"]

    two_passes_later(operator)
    held = core.read_namespaced_service("shared", team.namespace)
    assert held.metadata.resource_version == service.metadata.resource_version
    assert held.spec.selector == {c.LABEL_GATEWAY_NAME: "first"}
    assert condition(get_gateway(team.api, team.namespace, "first"), "Programmed")["status"] == (
        "True"
    )
    # Nothing of the second Gateway runs under the shared name.
    assert waypoint_pods(k8s, team.namespace, "second") == []
    deployment = deployment_of(k8s, team.namespace, "shared")
    assert deployment is not None
    assert [r.uid for r in deployment.metadata.owner_references] == [first["metadata"]["uid"]]


# -- GatewayClass parameters -------------------------------------------------------------------


def _gateway_class(k8s: client.ApiClient, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_cluster_custom_object(
        GW_GROUP, GW_VERSION, "gatewayclasses", name
    )
    return obj


def test_class_parameters_from_another_namespace_are_refused_and_never_echoed(
    k8s: client.ApiClient,
    operator: Running,
    team: Team,
    identity: Identity,
    audit: AuditLog,
) -> None:
    core, custom = client.CoreV1Api(k8s), client.CustomObjectsApi(k8s)
    team_b = unique_name("team-b")
    core.create_namespace({"metadata": {"name": team_b}})
    core.create_namespaced_config_map(
        team_b, {"metadata": {"name": "db-conn"}, "data": {"image": SECRET_VALUE}}
    )
    class_name = unique_name("xns")
    since = audit.mark()
    custom.create_cluster_custom_object(
        GW_GROUP,
        GW_VERSION,
        "gatewayclasses",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": class_name},
            "spec": {
                "controllerName": CONTROLLER,
                "parametersRef": {
                    "group": "",
                    "kind": "ConfigMap",
                    "name": "db-conn",
                    "namespace": team_b,
                },
            },
        },
    )
    try:

        def class_judged() -> dict[str, Any] | None:
            cls = _gateway_class(k8s, class_name)
            cond = condition(cls, "Accepted")
            current = cond.get("observedGeneration") == cls["metadata"]["generation"]
            return cond if current and cond.get("reason") != "Pending" else None

        try:
            cond = wait_for(class_judged, TIMEOUT, "the class judged")
        except TimeoutError:
            _fail_with_log(operator.op, "class never judged")
        assert SECRET_FRAGMENT not in cond["message"], cond["message"]
        assert (cond["status"], cond["reason"]) == ("False", "InvalidParameters"), cond
        assert f"{team_b}/db-conn" in cond["message"]

        create_gateway(team.api, team.namespace, "wp", class_name=class_name)
        accepted = judged(operator, team.api, team.namespace, "wp", "Accepted")
        assert SECRET_FRAGMENT not in str(get_gateway(team.api, team.namespace, "wp")["status"])
        assert (accepted["status"], accepted["reason"]) == ("False", "InvalidParameters")
        assert deployment_of(k8s, team.namespace, "wp") is None
        assert events_mentioning(k8s, SECRET_FRAGMENT) == []
        # Refused before it was read: the operator never asked for that ConfigMap.
        asked = [
            f"{e['verb']} {e.get('requestURI')}"
            for e in audit.events(since, user=identity.user)
            if f"/namespaces/{team_b}/configmaps" in str(e.get("requestURI"))
        ]
        assert asked == []
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses", class_name)
        with contextlib.suppress(ApiException):
            core.delete_namespace(team_b)


def test_a_bad_parameter_value_is_named_by_its_key_not_echoed(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    client.CoreV1Api(team.api).create_namespaced_config_map(
        team.namespace, {"metadata": {"name": "params"}, "data": {"image": SECRET_VALUE}}
    )
    create_gateway(
        team.api,
        team.namespace,
        "wp",
        infrastructure={"parametersRef": {"group": "", "kind": "ConfigMap", "name": "params"}},
    )
    cond = judged(operator, team.api, team.namespace, "wp", "Accepted")
    assert SECRET_FRAGMENT not in str(get_gateway(team.api, team.namespace, "wp")["status"])
    assert (cond["status"], cond["reason"]) == ("False", "InvalidParameters"), cond
    assert "key image" in cond["message"], cond["message"]
    assert events_mentioning(k8s, SECRET_FRAGMENT) == []


# -- what a waypoint pod may be --------------------------------------------------------------


def test_a_gateway_cannot_run_pods_as_a_privileged_service_account(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    core, rbac = client.CoreV1Api(k8s), client.RbacAuthorizationV1Api(k8s)
    core.create_namespaced_service_account(team.namespace, {"metadata": {"name": "deployer"}})
    # What makes it worth stealing: it may read the namespace's Secrets.
    rbac.create_namespaced_role_binding(
        team.namespace,
        {
            "metadata": {"name": "deployer-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "admin",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "deployer", "namespace": team.namespace}
            ],
        },
    )
    before = snapshot(core.read_namespaced_service_account("deployer", team.namespace))
    create_gateway(
        team.api,
        team.namespace,
        "wp",
        annotations={c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT: "deployer"},
    )
    cond = judged(operator, team.api, team.namespace, "wp", "Accepted")
    pods = core.list_namespaced_pod(team.namespace).items
    assert [p.metadata.name for p in pods if p.spec.service_account_name == "deployer"] == []
    assert (cond["status"], cond["reason"]) == ("False", "InvalidParameters"), cond
    assert "spec.waypoints.policy.serviceAccountLabels" in cond["message"], cond["message"]
    assert deployment_of(k8s, team.namespace, "wp") is None
    assert snapshot(core.read_namespaced_service_account("deployer", team.namespace)) == before

    # An account its owners opted in is used as it is: not labelled, not owned.
    core.create_namespaced_service_account(
        team.namespace, {"metadata": {"name": "mesh-identity", "labels": {OPT_IN: "true"}}}
    )
    opted_in = snapshot(core.read_namespaced_service_account("mesh-identity", team.namespace))
    create_gateway(
        team.api,
        team.namespace,
        "wp-ok",
        annotations={c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT: "mesh-identity"},
    )
    programmed(operator, team.api, team.namespace, "wp-ok")
    pods = waypoint_pods(k8s, team.namespace, "wp-ok")
    assert pods and {p.spec.service_account_name for p in pods} == {"mesh-identity"}
    assert snapshot(core.read_namespaced_service_account("mesh-identity", team.namespace)) == (
        opted_in
    )


def test_waypoint_pods_carry_no_kubernetes_api_token(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    create_gateway(team.api, team.namespace, "wp")
    programmed(operator, team.api, team.namespace, "wp")
    deployment = deployment_of(k8s, team.namespace, "wp")
    assert deployment is not None
    assert deployment.spec.template.spec.automount_service_account_token is False
    pods = waypoint_pods(k8s, team.namespace, "wp")
    assert pods
    for pod in pods:
        volumes = [v.name for v in pod.spec.volumes or []]
        assert not [v for v in volumes if v.startswith("kube-api-access")], volumes
        assert "istio-token" in volumes


@pytest.mark.parametrize(
    ("data", "annotations", "field"),
    [
        ({"tolerations": "[{operator: Exists}]"}, {}, "allowKeylessTolerations"),
        (
            {
                "tolerations": "[{key: node-role.kubernetes.io/control-plane, operator: Exists, "
                "effect: NoSchedule}]"
            },
            {},
            "deniedNodeKeys",
        ),
        ({"nodeSelector": "{node-role.kubernetes.io/control-plane: ''}"}, {}, "deniedNodeKeys"),
        ({"image": "evil.example.com/istio/proxyv2:1.30.3"}, {}, "imagePrefixes"),
        (
            {},
            {"container.apparmor.security.beta.kubernetes.io/istio-proxy": "unconfined"},
            "podAnnotations",
        ),
    ],
    ids=[
        "tolerate-everything",
        "tolerate-control-plane",
        "select-control-plane",
        "foreign-image",
        "apparmor-off",
    ],
)
def test_parameters_outside_the_policy_are_refused(
    k8s: client.ApiClient,
    operator: Running,
    team: Team,
    data: dict[str, str],
    annotations: dict[str, str],
    field: str,
) -> None:
    infrastructure: dict[str, Any] = {}
    if data:
        client.CoreV1Api(team.api).create_namespaced_config_map(
            team.namespace, {"metadata": {"name": "params"}, "data": data}
        )
        infrastructure["parametersRef"] = {"group": "", "kind": "ConfigMap", "name": "params"}
    if annotations:
        infrastructure["annotations"] = annotations
    create_gateway(team.api, team.namespace, "wp", infrastructure=infrastructure)
    cond = judged(operator, team.api, team.namespace, "wp", "Accepted")
    assert deployment_of(k8s, team.namespace, "wp") is None, "a waypoint was deployed"
    assert (cond["status"], cond["reason"]) == ("False", "InvalidParameters"), cond
    assert f"spec.waypoints.policy.{field}" in cond["message"], cond["message"]
    assert waypoint_pods(k8s, team.namespace, "wp") == []


# Last: everything above ran as the chart's ServiceAccount, and no request of it was refused.
test_no_request_was_forbidden = chart_rbac.test_no_request_was_forbidden
