"""A waypoint's HorizontalPodAutoscaler and PodDisruptionBudget, from its parameters.

The keys `horizontalPodAutoscaler` and `podDisruptionBudget` of a Gateway's
or GatewayClass's parametersRef ConfigMap are object overlays, read as
istiod reads them for its own waypoints. What istiod's template starts from
(an autoscaler of the Deployment with `maxReplicas: 1`, a budget selecting
the Gateway's pods) and how its strategic merge patch lays one overlay over
another are written here as literal data; tests/test_istiod.py compares the
objects with the ones a real istiod writes.

The first tests are offline. The rest run on the local control plane with
the operator under the chart's RBAC (test_chart_rbac's fixtures, so the
chart is shown to grant what scaling needs): kube-controller-manager's
autoscaler controller runs there. Without a metrics API it cannot measure
load, but it still holds the count inside minReplicas..maxReplicas, which is
what shows that the Deployment's replicas are its to set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import kubernetes_validate
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

import test_chart_rbac as chart_rbac
from ambient_devcluster.harness import condition
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import GatewayReason, WaypointEvent
from ambient_operator.apply.ownership import applies_field
from ambient_operator.apply.plan import Owner
from ambient_operator.apply.writer import NameConflictError, hand_over
from ambient_operator.kube.client import Kube
from ambient_operator.render.waypoints.parameters import refusal
from ambient_operator.render.waypoints.verdicts import WaypointRender, class_verdict
from conftest import unique_name, wait_for
from operator_harness import AuditLog
from test_chart_rbac import Identity, Running, _fail_with_log, forbidden
from test_waypoint_units import MESH, VERSIONS, gateway, gateway_class, params_ref, render

# Reused, not copied: the chart's ServiceAccount and RBAC, the shared
# AmbientMesh, and the operator running as that ServiceAccount.
audit = chart_rbac.audit
identity = chart_rbac.identity
mesh = chart_rbac.mesh
operator = chart_rbac.operator

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
CLASS = "ambient-waypoint"
TIMEOUT = 90.0
PASSES = "ambient_operator_reconcile_duration_seconds_count"
HPA = "horizontalPodAutoscaler"
PDB = "podDisruptionBudget"
SCALING_KINDS = ("HorizontalPodAutoscaler", "PodDisruptionBudget")


def _objects(result: WaypointRender) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in result.objects}


def _with_params(data: dict[str, str], cls_data: dict[str, str] | None = None) -> WaypointRender:
    config_maps: dict[tuple[str, str], dict[str, Any] | None] = {("apps", "params"): data}
    cls = gateway_class()
    if cls_data is not None:
        cls = gateway_class(params_ref("class-params", namespace="istio-system"))
        config_maps[("istio-system", "class-params")] = cls_data
    return render(gateway(MESH, infrastructure={"parametersRef": params_ref()}), cls, config_maps)


# -- offline ---------------------------------------------------------------------------------


def test_an_empty_key_asks_for_istiods_base_objects() -> None:
    """The key alone makes the object: istiod's waypoint.yaml has maxReplicas 1 and a selector."""
    objects = _objects(_with_params({HPA: "", PDB: ""}))
    assert objects["HorizontalPodAutoscaler"]["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "waypoint"},
        "maxReplicas": 1,
    }
    assert objects["PodDisruptionBudget"]["spec"] == {
        "selector": {"matchLabels": {c.LABEL_GATEWAY_NAME: "waypoint"}}
    }
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget"):
        meta = objects[kind]["metadata"]
        assert (meta["name"], meta["namespace"]) == ("waypoint", "apps")
        assert meta["labels"][c.LABEL_GATEWAY_NAME] == "waypoint"


def test_without_the_keys_there_is_neither_object() -> None:
    result = _with_params({"replicas": "3"})
    assert set(_objects(result)) == {"ServiceAccount", "Deployment", "Service"}
    assert _objects(result)["Deployment"]["spec"]["replicas"] == 3
    assert not result.autoscaled


def test_the_gateways_overlay_is_laid_over_its_classes() -> None:
    """Maps merge, a null removes, lists replace: a strategic merge patch of these kinds."""
    cls_data = {
        HPA: (
            "spec:\n"
            "  minReplicas: 2\n"
            "  maxReplicas: 6\n"
            "  metrics: [{type: Resource, resource: {name: cpu, target: "
            "{type: Utilization, averageUtilization: 70}}}]\n"
            "  behavior:\n"
            "    scaleDown: {stabilizationWindowSeconds: 300, selectPolicy: Min}\n"
        ),
        PDB: "spec:\n  minAvailable: 1\n  unhealthyPodEvictionPolicy: AlwaysAllow\n",
    }
    data = {
        HPA: (
            "spec:\n"
            "  maxReplicas: 3\n"
            "  metrics: [{type: Resource, resource: {name: memory, target: "
            "{type: Utilization, averageUtilization: 80}}}]\n"
            "  behavior:\n"
            "    scaleDown: {selectPolicy: null}\n"
            "    scaleUp: {stabilizationWindowSeconds: 0}\n"
        ),
        PDB: "spec:\n  minAvailable: null\n  maxUnavailable: 50%\n",
    }
    objects = _objects(_with_params(data, cls_data))
    assert objects["HorizontalPodAutoscaler"]["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "waypoint"},
        "minReplicas": 2,
        "maxReplicas": 3,
        "metrics": [
            {
                "type": "Resource",
                "resource": {
                    "name": "memory",
                    "target": {"type": "Utilization", "averageUtilization": 80},
                },
            }
        ],
        "behavior": {
            "scaleDown": {"stabilizationWindowSeconds": 300},
            "scaleUp": {"stabilizationWindowSeconds": 0},
        },
    }
    assert objects["PodDisruptionBudget"]["spec"] == {
        "maxUnavailable": "50%",
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": {c.LABEL_GATEWAY_NAME: "waypoint"}},
    }


def test_the_class_alone_gives_every_gateway_of_it_an_autoscaler() -> None:
    objects = _objects(_with_params({}, {HPA: "spec: {minReplicas: 2, maxReplicas: 4}"}))
    assert objects["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == 2
    assert "PodDisruptionBudget" not in objects


def test_the_deployment_leaves_its_replicas_to_the_autoscaler() -> None:
    result = _with_params({HPA: "spec: {minReplicas: 2, maxReplicas: 4}", "replicas": "3"})
    assert "replicas" not in _objects(result)["Deployment"]["spec"]
    assert result.autoscaled and result.replicas == 2
    reasons = [reason for reason, _ in result.warnings]
    assert reasons == [WaypointEvent.REPLICAS_LEFT_TO_AUTOSCALER]
    assert "key replicas is ignored" in result.warnings[0][1]
    # Without a replicas key there is nothing to warn about.
    assert _with_params({HPA: "spec: {maxReplicas: 4}"}).warnings == ()


BAD = [
    (HPA, "3", "key horizontalPodAutoscaler: not a YAML mapping"),
    (HPA, "[spec]", "key horizontalPodAutoscaler: not a YAML mapping"),
    (HPA, "spec: {minReplicas: 5, maxReplicas: 2}", "spec.minReplicas is above spec.maxReplicas"),
    (HPA, "spec: {minReplicas: 2}", "spec.minReplicas is above spec.maxReplicas"),
    (HPA, "spec: {maxReplicas: null}", "spec.maxReplicas is null"),
    (HPA, "spec: {minReplicas: 0, maxReplicas: 2}", "horizontalPodAutoscaler.spec.minReplicas"),
    (HPA, "spec: {maxReplicas: many}", "horizontalPodAutoscaler.spec.maxReplicas"),
    (HPA, "spec: {scaleTargetRef: {name: other}}", "scaleTargetRef is always the waypoint's"),
    (HPA, "metadata: {labels: {a: b}}", "horizontalPodAutoscaler takes only spec"),
    (HPA, "spec: [1]", "key horizontalPodAutoscaler.spec"),
    (PDB, "spec: {minAvailable: 1, maxUnavailable: 1}", "are both set"),
    (PDB, "spec: {minAvailable: '2'}", "podDisruptionBudget.spec.minAvailable"),
    (PDB, "spec: {maxUnavailable: 150%}", "podDisruptionBudget.spec.maxUnavailable"),
    (PDB, "spec: {minAvailable: -1}", "podDisruptionBudget.spec.minAvailable"),
    (PDB, "spec: {selector: {matchLabels: {a: b}}}", "selector is always the waypoint's pods"),
    (PDB, "spec: {unhealthyPodEvictionPolicy: Never}", "unhealthyPodEvictionPolicy"),
    (PDB, "spec: {minAvailable: [", "key podDisruptionBudget: not valid YAML"),
]


@pytest.mark.parametrize(("key", "text", "named"), BAD)
def test_a_bad_overlay_is_refused_with_what_is_wrong(key: str, text: str, named: str) -> None:
    result = _with_params({key: text})
    assert (result.accepted.status, result.accepted.reason) == (
        "False",
        GatewayReason.INVALID_PARAMETERS,
    ), result.accepted
    assert named in result.accepted.message, result.accepted.message
    assert "Gateway parametersRef ConfigMap apps/params" in result.accepted.message
    assert result.objects == ()


def test_a_bad_overlay_in_the_class_fails_its_gateways_and_the_class() -> None:
    result = _with_params({}, {HPA: "spec: {minReplicas: 3, maxReplicas: 1}"})
    assert result.accepted.reason == GatewayReason.INVALID_PARAMETERS
    assert "GatewayClass parametersRef ConfigMap istio-system/class-params" in (
        result.accepted.message
    )
    verdict = class_verdict(
        gateway_class(params_ref("class-params", namespace="istio-system")),
        {("istio-system", "class-params"): {HPA: "spec: {minReplicas: 3, maxReplicas: 1}"}},
    )
    assert (verdict.status, verdict.reason) == ("False", GatewayReason.INVALID_PARAMETERS)
    assert "spec.minReplicas is above spec.maxReplicas" in verdict.message


@pytest.mark.parametrize("version", VERSIONS)
def test_the_objects_validate_strictly(version: str) -> None:
    """Kubernetes' own OpenAPI schemas of each supported minor accept both objects."""
    data = {
        HPA: "spec: {minReplicas: 2, maxReplicas: 4, behavior: {scaleDown: "
        "{stabilizationWindowSeconds: 60}}}",
        PDB: "spec: {maxUnavailable: 1}",
    }
    result = _with_params(data)
    # A refused overlay renders nothing, and a loop over nothing passes.
    kinds = [obj["kind"] for obj in result.objects]
    assert kinds == ["ServiceAccount", "Deployment", "Service", *SCALING_KINDS], result.accepted
    for obj in result.objects:
        try:
            kubernetes_validate.validate(obj, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']} invalid for {version}: {path}: {err.message}")


def test_a_refused_autoscaler_is_named_by_its_key_in_status() -> None:
    """The API server's answer may quote the ConfigMap's metrics; status names the key."""
    hpa = {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "wp", "namespace": "apps"}}
    answer = 'spec.metrics[0].resource.name: Invalid value: "s3cret"'
    said = refusal(hpa, 422, answer)
    assert "s3cret" not in said and "parameters key horizontalPodAutoscaler" in said, said
    service = {"kind": "Service", "metadata": {"name": "wp", "namespace": "apps"}}
    assert refusal(service, 422, "ports: Invalid") == "Service wp: ports: Invalid"


def _managed(manager: str, operation: str, spec_fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": spec_fields},
    }


def test_which_manager_holds_the_replicas() -> None:
    held = {"f:replicas": {}, "f:selector": {}}
    obj = {"metadata": {"managedFields": [_managed(c.FIELD_MANAGER, "Apply", held)]}}
    assert applies_field(obj, ("spec", "replicas"))
    # Our create's entry, not yet made part of the apply entry: its next apply will be.
    created = {"metadata": {"managedFields": [_managed(c.FIELD_MANAGER, "Update", held)]}}
    assert applies_field(created, ("spec", "replicas"))
    others = [
        {**_managed(c.FIELD_MANAGER, "Update", held), "subresource": "scale"},
        _managed("kube-controller-manager", "Apply", held),
        _managed("kube-controller-manager", "Update", held),
        _managed(c.FIELD_MANAGER, "Apply", {"f:selector": {}}),
    ]
    assert not applies_field({"metadata": {"managedFields": others}}, ("spec", "replicas"))


class _RecordingKube:
    def __init__(self) -> None:
        self.applied: list[tuple[dict[str, Any], bool, str | None]] = []

    def apply(
        self, obj: dict[str, Any], *, force: bool = True, field_manager: str | None = None
    ) -> dict[str, Any]:
        self.applied.append((obj, force, field_manager))
        return obj


def test_the_hand_over_applies_only_the_field_at_its_live_value() -> None:
    owner = Owner(c.GATEWAY_API_VERSION, "Gateway", "wp", "uid-wp")
    live = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "wp",
            "namespace": "apps",
            "resourceVersion": "42",
            "ownerReferences": [owner.reference()],
        },
        "spec": {"replicas": 3, "template": {}},
    }
    kube = _RecordingKube()
    hand_over(cast(Kube, kube), live, owner, {"spec": {"replicas": 3}})
    assert kube.applied == [
        (
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "wp", "namespace": "apps", "resourceVersion": "42"},
                "spec": {"replicas": 3},
            },
            True,
            "ambient-operator-handover",
        )
    ]
    # Somebody else's Deployment is never written, not even this one field.
    foreign = {**live, "metadata": {**live["metadata"], "ownerReferences": []}}
    with pytest.raises(NameConflictError):
        hand_over(cast(Kube, kube), foreign, owner, {"spec": {"replicas": 3}})
    assert len(kube.applied) == 1


# -- on the local control plane, as the chart's ServiceAccount --------------------------------


@pytest.fixture
def ns(k8s: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(k8s)
    name = unique_name("wp-scaling")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


def put_params(k8s: client.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    """Create the ConfigMap, or replace its data (keys not in `data` are removed)."""
    core = client.CoreV1Api(k8s)
    body = {"metadata": {"name": name}, "data": data}
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_config_map(name, namespace, body)


def read(k8s: client.ApiClient, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """An autoscaler, budget or Deployment as a dict; None when there is none."""
    readers = {
        "HorizontalPodAutoscaler": client.AutoscalingV2Api(
            k8s
        ).read_namespaced_horizontal_pod_autoscaler,
        "PodDisruptionBudget": client.PolicyV1Api(k8s).read_namespaced_pod_disruption_budget,
        "Deployment": client.AppsV1Api(k8s).read_namespaced_deployment,
    }
    try:
        obj = readers[kind](name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    out: dict[str, Any] = k8s.sanitize_for_serialization(obj)
    return out


def programmed(op: Running, k8s: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The Gateway once Programmed=True for its generation."""

    def up() -> dict[str, Any] | None:
        gw = get_gateway(k8s, namespace, name)
        cond = condition(gw, "Programmed")
        current = cond.get("observedGeneration") == gw["metadata"]["generation"]
        return gw if current and cond.get("status") == "True" else None

    try:
        return wait_for(up, TIMEOUT, f"Gateway {namespace}/{name} Programmed")
    except TimeoutError:
        _fail_with_log(op.op, f"{name}: {get_gateway(k8s, namespace, name).get('status')}")


def get_gateway(k8s: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", name
    )
    return obj


def create_gateway(
    k8s: client.ApiClient,
    namespace: str,
    name: str,
    *,
    class_name: str = CLASS,
    params: str | None = "params",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"gatewayClassName": class_name, "listeners": [MESH]}
    if params:
        spec["infrastructure"] = {
            "parametersRef": {"group": "", "kind": "ConfigMap", "name": params}
        }
    body = {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": spec,
    }
    created: dict[str, Any] = client.CustomObjectsApi(k8s).create_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", body
    )
    return created


def replicas_become(k8s: client.ApiClient, namespace: str, count: int, why: str) -> None:
    def counted() -> bool:
        dep = read(k8s, "Deployment", namespace, "wp")
        return dep is not None and dep["spec"].get("replicas") == count

    wait_for(counted, TIMEOUT, f"Deployment {namespace}/wp at {count} replicas ({why})")


def two_passes_later(op: Running) -> None:
    """Wait until a waypoint pass that started after now has completed."""
    before = op.op.metric(PASSES, controller="waypoints")
    wait_for(
        lambda: op.op.metric(PASSES, controller="waypoints") >= before + 2,
        TIMEOUT,
        "two waypoint passes",
    )


def apply_fields(
    obj: dict[str, Any], manager: str, operation: str = "Apply"
) -> dict[str, Any] | None:
    """The fields `manager` holds through server-side apply (its Apply entry's fieldsV1).

    With `operation` "Update": those of its create, not made part of its apply entry yet.
    """
    for entry in obj["metadata"].get("managedFields") or []:
        if (
            entry.get("manager") == manager
            and entry.get("operation") == operation
            and not entry.get("subresource")
        ):
            fields: dict[str, Any] = entry.get("fieldsV1") or {}
            return fields
    return None


def controlled_by(obj: dict[str, Any], gw: dict[str, Any]) -> bool:
    return any(
        ref.get("controller")
        and ref.get("uid") == gw["metadata"]["uid"]
        and ref["kind"] == "Gateway"
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def test_autoscaler_and_budget_are_created_updated_and_pruned(
    k8s: client.ApiClient, operator: Running, ns: str
) -> None:
    put_params(
        k8s,
        ns,
        "params",
        {HPA: "spec: {minReplicas: 2, maxReplicas: 4}", PDB: "spec: {minAvailable: 1}"},
    )
    create_gateway(k8s, ns, "wp")
    gw = programmed(operator, k8s, ns, "wp")
    hpa = wait_for(lambda: read(k8s, "HorizontalPodAutoscaler", ns, "wp"), TIMEOUT, "the HPA")
    pdb = wait_for(lambda: read(k8s, "PodDisruptionBudget", ns, "wp"), TIMEOUT, "the PDB")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "wp",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": {c.LABEL_GATEWAY_NAME: "wp"}}
    for obj in (hpa, pdb):
        assert controlled_by(obj, gw), obj["metadata"]
        assert obj["metadata"]["labels"][c.LABEL_GATEWAY_NAME] == "wp"
    # kube-controller-manager's autoscaler raises the Deployment to minReplicas.
    replicas_become(k8s, ns, 2, "the autoscaler's minReplicas")

    put_params(
        k8s,
        ns,
        "params",
        {HPA: "spec: {minReplicas: 3, maxReplicas: 5}", PDB: "spec: {maxUnavailable: 1}"},
    )

    def updated() -> tuple[dict[str, Any], dict[str, Any]] | None:
        new_hpa = read(k8s, "HorizontalPodAutoscaler", ns, "wp")
        new_pdb = read(k8s, "PodDisruptionBudget", ns, "wp")
        if new_hpa is None or new_pdb is None:
            return None
        limits = (new_hpa["spec"].get("minReplicas"), new_hpa["spec"]["maxReplicas"])
        budget = (new_pdb["spec"].get("minAvailable"), new_pdb["spec"].get("maxUnavailable"))
        return (new_hpa, new_pdb) if limits == (3, 5) and budget == (None, 1) else None

    try:
        new_hpa, new_pdb = wait_for(updated, TIMEOUT, "the HPA and PDB updated")
    except TimeoutError:
        held = {kind: (read(k8s, kind, ns, "wp") or {}).get("spec") for kind in SCALING_KINDS}
        _fail_with_log(operator.op, f"not updated: {held}")
    # Updated in place, not made again.
    assert new_hpa["metadata"]["uid"] == hpa["metadata"]["uid"]
    assert new_pdb["metadata"]["uid"] == pdb["metadata"]["uid"]
    replicas_become(k8s, ns, 3, "the new minReplicas")

    # The keys removed: both are pruned and the count is ours again.
    put_params(k8s, ns, "params", {"replicas": "2"})
    wait_for(
        lambda: (
            read(k8s, "HorizontalPodAutoscaler", ns, "wp") is None
            and read(k8s, "PodDisruptionBudget", ns, "wp") is None
        ),
        TIMEOUT,
        "the HPA and PDB pruned",
    )
    replicas_become(k8s, ns, 2, "the replicas key, with no autoscaler")
    programmed(operator, k8s, ns, "wp")


def test_the_autoscalers_count_is_not_reverted(
    k8s: client.ApiClient, operator: Running, ns: str
) -> None:
    put_params(k8s, ns, "params", {HPA: "spec: {minReplicas: 1, maxReplicas: 5}", "replicas": "2"})
    create_gateway(k8s, ns, "wp")
    programmed(operator, k8s, ns, "wp")
    wait_for(lambda: read(k8s, "HorizontalPodAutoscaler", ns, "wp"), TIMEOUT, "the HPA")
    # Within its bounds and without metrics the autoscaler leaves the count be, so
    # this write stands in for one it makes: another client, the scale subresource.
    client.AppsV1Api(k8s).patch_namespaced_deployment_scale("wp", ns, {"spec": {"replicas": 4}})
    # A change that has the operator apply the Deployment again.
    client.CustomObjectsApi(k8s).patch_namespaced_custom_object(
        GW_GROUP,
        GW_VERSION,
        ns,
        "gateways",
        "wp",
        {"spec": {"infrastructure": {"labels": {"example.com/touch": "1"}}}},
    )

    def reapplied() -> dict[str, Any] | None:
        dep = read(k8s, "Deployment", ns, "wp")
        labels = (dep or {}).get("metadata", {}).get("labels") or {}
        return dep if labels.get("example.com/touch") == "1" else None

    wait_for(reapplied, TIMEOUT, "the Deployment applied with the new label")
    two_passes_later(operator)
    dep = read(k8s, "Deployment", ns, "wp")
    assert dep is not None and dep["spec"]["replicas"] == 4, dep and dep["spec"]
    ours = apply_fields(dep, c.FIELD_MANAGER)
    assert ours is not None and "f:replicas" not in ours["f:spec"], ours
    # The replicas key it cannot honour is named on the Gateway.
    events = client.CoreV1Api(k8s).list_namespaced_event(ns).items
    said = [e.message for e in events if e.reason == WaypointEvent.REPLICAS_LEFT_TO_AUTOSCALER]
    assert said and "key replicas is ignored" in said[0], said
    programmed(operator, k8s, ns, "wp")


def test_adding_an_autoscaler_never_drops_the_running_count(
    k8s: client.ApiClient, operator: Running, ns: str
) -> None:
    """Replicas we applied are handed over, not dropped (the API server would default them to 1)."""
    put_params(k8s, ns, "params", {"replicas": "3"})
    create_gateway(k8s, ns, "wp")
    programmed(operator, k8s, ns, "wp")
    replicas_become(k8s, ns, 3, "the replicas key")
    dep = read(k8s, "Deployment", ns, "wp")
    assert dep is not None
    # Created, never updated: the replicas are held by the creating apply's entry.
    held = apply_fields(dep, c.FIELD_MANAGER)
    assert held is not None and "f:replicas" in held["f:spec"], held
    hash_before = dep["metadata"]["annotations"]["ambientoperator.io/desired-hash"]
    since = dep["metadata"]["resourceVersion"]

    put_params(k8s, ns, "params", {HPA: "spec: {minReplicas: 3, maxReplicas: 5}"})
    seen: list[int] = []
    stream = watch.Watch()
    for event in stream.stream(
        client.AppsV1Api(k8s).list_namespaced_deployment,
        ns,
        field_selector="metadata.name=wp",
        resource_version=since,
        timeout_seconds=int(TIMEOUT),
    ):
        obj = k8s.sanitize_for_serialization(event["object"])
        seen.append(obj["spec"]["replicas"])
        annotations = obj["metadata"].get("annotations") or {}
        mine = apply_fields(obj, c.FIELD_MANAGER) or {}
        if annotations.get("ambientoperator.io/desired-hash") != hash_before and (
            "f:replicas" not in mine.get("f:spec", {})
        ):
            stream.stop()
    assert seen and min(seen) == 3, f"replicas seen while the autoscaler was added: {seen}"
    wait_for(lambda: read(k8s, "HorizontalPodAutoscaler", ns, "wp"), TIMEOUT, "the HPA")
    dep = read(k8s, "Deployment", ns, "wp")
    assert dep is not None and dep["spec"]["replicas"] == 3
    mine = apply_fields(dep, c.FIELD_MANAGER)
    assert mine is not None and "f:replicas" not in mine["f:spec"], mine


def test_a_bad_overlay_is_named_in_the_gateways_status(
    k8s: client.ApiClient, operator: Running, ns: str
) -> None:
    put_params(k8s, ns, "params", {HPA: "spec: {minReplicas: 5, maxReplicas: 2}"})
    create_gateway(k8s, ns, "wp")

    def judged() -> dict[str, Any] | None:
        gw = get_gateway(k8s, ns, "wp")
        cond = condition(gw, "Accepted")
        return cond if cond.get("observedGeneration") == gw["metadata"]["generation"] else None

    cond = wait_for(judged, TIMEOUT, "Accepted of the Gateway")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidParameters"), cond
    assert (
        f"ConfigMap {ns}/params key horizontalPodAutoscaler: spec.minReplicas is above"
        in (cond["message"])
    ), cond["message"]
    assert read(k8s, "Deployment", ns, "wp") is None
    assert read(k8s, "HorizontalPodAutoscaler", ns, "wp") is None
    # Fixed, the waypoint is made with its autoscaler.
    put_params(k8s, ns, "params", {HPA: "spec: {minReplicas: 2, maxReplicas: 2}"})
    programmed(operator, k8s, ns, "wp")
    replicas_become(k8s, ns, 2, "the fixed autoscaler")


def test_a_class_overlay_is_laid_under_the_gateways(
    k8s: client.ApiClient, operator: Running, mesh: chart_rbac.Mesh, ns: str
) -> None:
    class_name = unique_name("scaling-class")
    put_params(
        k8s,
        mesh.agents_namespace,
        class_name,
        {HPA: "spec: {minReplicas: 2, maxReplicas: 6}", PDB: "spec: {minAvailable: 1}"},
    )
    custom = client.CustomObjectsApi(k8s)
    custom.create_cluster_custom_object(
        GW_GROUP,
        GW_VERSION,
        "gatewayclasses",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": class_name},
            "spec": {
                "controllerName": "ambientoperator.io/waypoint-controller",
                "parametersRef": {
                    "group": "",
                    "kind": "ConfigMap",
                    "name": class_name,
                    "namespace": mesh.agents_namespace,
                },
            },
        },
    )
    try:
        put_params(k8s, ns, "params", {HPA: "spec: {maxReplicas: 3}"})
        create_gateway(k8s, ns, "wp", class_name=class_name)
        programmed(operator, k8s, ns, "wp")
        hpa = wait_for(lambda: read(k8s, "HorizontalPodAutoscaler", ns, "wp"), TIMEOUT, "HPA")
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 3)
        pdb = wait_for(lambda: read(k8s, "PodDisruptionBudget", ns, "wp"), TIMEOUT, "PDB")
        assert pdb["spec"]["minAvailable"] == 1
        replicas_become(k8s, ns, 2, "the class's minReplicas")
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses", class_name)
        with contextlib.suppress(ApiException):
            client.CoreV1Api(k8s).delete_namespaced_config_map(class_name, mesh.agents_namespace)


def test_the_charts_rbac_allowed_every_scaling_request(
    operator: Running, identity: Identity, audit: AuditLog
) -> None:
    # Last in the module: everything above ran under this identity.
    events = audit.events(operator.since, user=identity.user)
    # Authorized is what counts: a GET before the first creation answers 404.
    done = {
        ((e.get("objectRef") or {}).get("resource"), e["verb"])
        for e in events
        if (e.get("responseStatus") or {}).get("code") not in (401, 403)
    }
    created = {
        (e.get("objectRef") or {}).get("resource")
        for e in events
        if (e.get("responseStatus") or {}).get("code") == 201
    }
    for resource in ("horizontalpodautoscalers", "poddisruptionbudgets"):
        # A watch is logged only once it ends, so `watch` is not looked for.
        for verb in ("list", "patch", "delete"):
            assert (resource, verb) in done, f"no {verb} of {resource} seen"
        # Created by an apply (apply/writer.py), which RBAC lets through only with `create`.
        assert resource in created, f"no {resource} created"
    assert forbidden(audit, operator.since, identity) == []
