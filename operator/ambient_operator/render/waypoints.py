"""Waypoint objects for one Gateway, our GatewayClass, istiod's class defaults. Pure.

Every decision about a waypoint is made here from the AmbientMesh spec, the
Gateway, its GatewayClass and the ConfigMaps their `parametersRef`s name:
names, which listeners are valid, the effective settings, Linux pinning and
the objects themselves. No API calls, no clock: same input, same output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import (
    GatewayCondition,
    GatewayReason,
    Verdict,
    WaypointEvent,
)
from ambient_operator.api.types import ApiModel, ImageRef, LabelMap
from ambient_operator.api.v1alpha1 import (
    AmbientMeshSpec,
    Resources,
    Toleration,
    Tolerations,
    WaypointPolicy,
)
from ambient_operator.kube.resources import NameRule, shown, why_not_a_name
from ambient_operator.render.placement import pin_linux, pod_os
from ambient_operator.render.templating import render_object

# Prune sets (apply.LABEL_CONTROLLER): one per Gateway, selected together with
# the gateway-name label, and one for the GatewayClass we keep.
CONTROLLER = "waypoint"
CLASS_CONTROLLER = "waypoint-class"
COMPONENT = "waypoint"
# The ConfigMap we create in istiod's namespace when none carries the
# defaults label for istio-waypoint yet.
CLASS_DEFAULTS_NAME = "ambient-operator-istio-waypoint-defaults"
# Where a GatewayClass's parametersRef may point when the caller does not say:
# the AmbientMesh's default spec.namespace (istiod's, the agents').
CLASS_PARAMETERS_NAMESPACE: str = AmbientMeshSpec.model_fields["namespace"].default
# Gateway API allows 64 characters here.
CLASS_DESCRIPTION = "Istio ambient waypoints on Linux nodes, by ambient-operator"
# Gateway metadata that steers istiod-style deployment, not infrastructure.
_NOT_COPIED_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        c.ANNOTATION_GATEWAY_NAME_OVERRIDE,
        c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT,
        "gateway.istio.io/controller-version",
    }
)
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Envoy and the Go agent name log levels differently from the AmbientMesh.
_PROXY_LEVELS = {
    "trace": "trace",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "error": "error",
}
_AGENT_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warn",
    "error": "error",
}


class ParametersError(ValueError):
    """A parametersRef that cannot be used; the message names what to fix."""


def _only(data: Any, allowed: Sequence[str], what: str, why: str = "") -> Any:
    """Refuse keys outside `allowed` without echoing them (they are the ConfigMap's content)."""
    if isinstance(data, Mapping) and any(key not in allowed for key in data):
        raise PydanticCustomError(
            "operator_rule",
            "{what} takes only {allowed}{why}",
            {"what": what, "allowed": ", ".join(allowed), "why": why},
        )
    return data


def _budget_count(value: int | str) -> int | str:
    # The API server takes a count or a percentage up to 100%; "2" (a string
    # without %) is refused there, so it is refused here, where it can be named.
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if not re.fullmatch(r"[0-9]+%", value) or int(value[:-1]) > 100:
        raise ValueError(f"{value!r} is neither a count nor a percentage from 0% to 100%")
    return value


BudgetCount = Annotated[int | str, AfterValidator(_budget_count)]


class AutoscalerSpec(ApiModel):
    """The spec fields a horizontalPodAutoscaler overlay may set (autoscaling/v2).

    `scaleTargetRef` is the operator's: the autoscaler scales the waypoint's
    Deployment and nothing else. A null removes what a lower layer set.
    """

    min_replicas: Annotated[int, Field(ge=1)] | None = None
    max_replicas: Annotated[int, Field(ge=1)] | None = None
    # Checked by the API server, item by item; lists replace, as in a
    # strategic merge patch of this type.
    metrics: list[dict[str, Any]] | None = None
    behavior: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        return _only(
            data,
            ("minReplicas", "maxReplicas", "metrics", "behavior"),
            "horizontalPodAutoscaler spec",
            "; scaleTargetRef is always the waypoint's Deployment",
        )


class DisruptionBudgetSpec(ApiModel):
    """The spec fields a podDisruptionBudget overlay may set (policy/v1).

    `selector` is the operator's: the budget covers the waypoint's pods.
    """

    min_available: BudgetCount | None = None
    max_unavailable: BudgetCount | None = None
    unhealthy_pod_eviction_policy: Literal["IfHealthyBudget", "AlwaysAllow"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        return _only(
            data,
            ("minAvailable", "maxUnavailable", "unhealthyPodEvictionPolicy"),
            "podDisruptionBudget spec",
            "; selector is always the waypoint's pods",
        )


_OVERLAY_WHY = (
    "; its labels and annotations are the Gateway's spec.infrastructure ones, as on "
    "the waypoint's other objects"
)


class AutoscalerOverlay(ApiModel):
    """A horizontalPodAutoscaler key: an overlay of the object, as istiod reads it."""

    spec: AutoscalerSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        return _only(data, ("spec",), "horizontalPodAutoscaler", _OVERLAY_WHY)


class DisruptionBudgetOverlay(ApiModel):
    """A podDisruptionBudget key: an overlay of the object, as istiod reads it."""

    spec: DisruptionBudgetSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        return _only(data, ("spec",), "podDisruptionBudget", _OVERLAY_WHY)


# Keys whose YAML is an object overlay: present (even empty) means "make one".
HPA_KEY = "horizontalPodAutoscaler"
PDB_KEY = "podDisruptionBudget"
_OVERLAY_EXAMPLES = {
    HPA_KEY: "`spec: {minReplicas: 2, maxReplicas: 4}`",
    PDB_KEY: "`spec: {minAvailable: 1}`",
}
_OVERLAY_KEYS = tuple(_OVERLAY_EXAMPLES)


class WaypointParameters(ApiModel):
    """Keys of a parametersRef ConfigMap; each value is YAML (replicas: "2")."""

    image: ImageRef | None = None
    replicas: Annotated[int, Field(ge=0, le=100)] | None = None
    resources: Resources | None = None
    node_selector: LabelMap | None = None
    tolerations: Tolerations | None = None
    horizontal_pod_autoscaler: AutoscalerOverlay | None = None
    pod_disruption_budget: DisruptionBudgetOverlay | None = None


@dataclass(frozen=True)
class Names:
    """Names of a Gateway's objects (istiod's annotations can override them)."""

    deployment: str
    service: str
    service_account: str
    # The service-account annotation names the account: a value, not an empty
    # one, which names nothing (the account is then the Gateway's own).
    named_account: bool = False


@dataclass(frozen=True)
class ListenerCheck:
    """One listener judged against what a waypoint can serve."""

    name: str
    port: int
    protocol: str
    valid: bool
    message: str
    # Route kinds the listener named in allowedRoutes that we cannot attach.
    invalid_kinds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """Effective waypoint settings after defaults, class and Gateway parameters."""

    image: str
    replicas: int
    resources: dict[str, Any]
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    # What Linux pinning removed from the user's scheduling, for an Event.
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scaling:
    """The autoscaler's and the disruption budget's spec after every layer; None: none wanted."""

    autoscaler: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    # Layers whose `replicas` the autoscaler makes moot, for a Warning Event.
    replicas_ignored: tuple[str, ...] = ()

    @property
    def min_replicas(self) -> int:
        """The fewest pods the autoscaler keeps (autoscaling/v2 defaults minReplicas to 1)."""
        return int((self.autoscaler or {}).get("minReplicas", 1))


@dataclass(frozen=True)
class WaypointRender:
    """Everything the controller needs for one Gateway."""

    names: Names
    listeners: tuple[ListenerCheck, ...]
    accepted: Verdict
    # Empty when the Gateway is not Accepted: nothing new is deployed for it.
    objects: tuple[dict[str, Any], ...]
    # With an autoscaler, its minReplicas: the Deployment's count is the autoscaler's.
    replicas: int
    waypoint_for: str | None
    # (reason, message) of things the user asked for that were not done.
    warnings: tuple[tuple[WaypointEvent, str], ...] = field(default=())
    autoscaled: bool = False


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


# -- ownership and references -------------------------------------------------


def class_is_ours(gateway_class: Mapping[str, Any] | None, controller_name: str) -> bool:
    """Whether a GatewayClass names our controller (Gateway API's ownership rule)."""
    return _spec(gateway_class).get("controllerName") == controller_name


def is_waypoint(gateway: Mapping[str, Any]) -> bool:
    """A Gateway meant to carry mesh traffic: it has the HBONE listener on 15008."""
    return any(
        listener.get("port") == c.PORT_HBONE and listener.get("protocol") == c.PROTOCOL_HBONE
        for listener in _spec(gateway).get("listeners") or []
        if isinstance(listener, Mapping)
    )


def config_map_ref(
    ref: Mapping[str, Any] | None, default_namespace: str | None, allowed_namespace: str
) -> tuple[str, str] | None:
    """(namespace, name) of the ConfigMap a parametersRef names; None without a ref.

    Raises ParametersError for a reference to anything but a core ConfigMap
    in `allowed_namespace`.
    """
    if not ref:
        return None
    group, kind = str(ref.get("group") or ""), str(ref.get("kind") or "")
    if group not in ("", "core") or kind != "ConfigMap":
        raise ParametersError(
            f"parametersRef names {kind or '?'}.{group or 'core'}; only a core ConfigMap "
            '(group "", kind ConfigMap) is supported'
        )
    namespace = ref.get("namespace") or default_namespace
    if not namespace:
        raise ParametersError("parametersRef of a GatewayClass needs a namespace")
    namespace, name = str(namespace), str(ref.get("name") or "")
    # Checked here, before the controller reads the ConfigMap: an unchecked
    # name would become part of an API path.
    checks: tuple[tuple[str, str, NameRule], ...] = (
        ("namespace", namespace, "label"),
        ("name", name, "subdomain"),
    )
    for what, value, rule in checks:
        problem = why_not_a_name(value, rule)
        if problem:
            raise ParametersError(
                f"parametersRef {what} {shown(value)} cannot name a ConfigMap; it {problem}"
            )
    # A GatewayClass is cluster-scoped: were its reference followed anywhere,
    # whoever may write a class could read any namespace's ConfigMaps through
    # the operator (and see them echoed in errors).
    if namespace != allowed_namespace:
        raise ParametersError(
            f"parametersRef names ConfigMap {namespace}/{name}; parameters are read only from "
            f"namespace {allowed_namespace}, so it is not read"
        )
    return namespace, name


def parameter_refs(
    gateway: Mapping[str, Any],
    gateway_class: Mapping[str, Any] | None,
    class_namespace: str = CLASS_PARAMETERS_NAMESPACE,
) -> list[tuple[str, str]]:
    """ConfigMaps whose data the render of this Gateway reads (none that would be refused)."""
    refs: list[tuple[str, str]] = []
    gateway_namespace = str(_meta(gateway).get("namespace") or "")
    for ref, namespace, allowed in (
        (_spec(gateway_class).get("parametersRef"), None, class_namespace),
        (
            (_spec(gateway).get("infrastructure") or {}).get("parametersRef"),
            gateway_namespace,
            gateway_namespace,
        ),
    ):
        try:
            target = config_map_ref(ref, namespace, allowed)
        except ParametersError:
            continue
        if target is not None:
            refs.append(target)
    return refs


def _field_names(*models: type[ApiModel]) -> frozenset[str]:
    return frozenset(
        name for model in models for field in model.model_fields.values() if (name := field.alias)
    )


# The parts of an error location that are ours, not the ConfigMap's content
# (a nodeSelector's keys are content, and so may be a secret).
_PARAMETER_FIELDS = _field_names(
    WaypointParameters,
    Resources,
    Toleration,
    AutoscalerOverlay,
    AutoscalerSpec,
    DisruptionBudgetOverlay,
    DisruptionBudgetSpec,
)


def _location(loc: Sequence[int | str]) -> str:
    out = str(loc[0]) if loc else "?"
    for part in loc[1:]:
        out += (
            f"[{part}]"
            if isinstance(part, int)
            else f".{part if part in _PARAMETER_FIELDS else '*'}"
        )
    return out


def _reason(error: Mapping[str, Any]) -> str:
    """What is wrong, without the value: a ConfigMap may hold anything, secrets included."""
    value = error.get("input")
    if error["type"] in ("value_error", "assertion_error"):
        # Our validators say `{value!r} is not ...`; keep what follows the value.
        text = str((error.get("ctx") or {}).get("error", ""))
        prefix = repr(value) if isinstance(value, str) else None
        msg = text[len(prefix) :].strip() if prefix and text.startswith(prefix) else ""
    else:
        msg = str(error["msg"])
    if not msg or (isinstance(value, str) and value and value in msg):
        return "is not a valid value"
    return msg


def parse_parameters(data: Mapping[str, Any] | None, where: str) -> WaypointParameters:
    """The settings a parametersRef ConfigMap holds.

    ParametersError names the bad key, never its value: the message goes
    into status, which more people read than may read the ConfigMap.
    """
    if data is None:
        raise ParametersError(f"{where} not found")
    values: dict[str, Any] = {}
    for key, text in sorted(data.items()):
        if key == "image":
            values[key] = str(text).strip()
            continue
        try:
            values[key] = yaml.safe_load(str(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ParametersError(f"{where} key {key}: not valid YAML{at}") from None
        if key in _OVERLAY_KEYS:
            # As in istiod, the key being there is what asks for the object.
            if values[key] is None:
                values[key] = {}
            if not isinstance(values[key], Mapping):
                raise ParametersError(
                    f"{where} key {key}: not a YAML mapping; it is an overlay of the object, "
                    f"as istiod reads it, e.g. {_OVERLAY_EXAMPLES[key]}"
                )
    try:
        return WaypointParameters.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        allowed = ", ".join(WaypointParameters.model_json_schema(by_alias=True)["properties"])
        hint = f" (allowed keys: {allowed})" if first["type"] == "extra_forbidden" else ""
        raise ParametersError(
            f"{where} key {_location(first['loc'])}: {_reason(first)}{hint}"
        ) from None


@dataclass(frozen=True)
class Layer:
    """One parametersRef's settings, and where they came from (for messages)."""

    where: str
    parameters: WaypointParameters


def _layer(
    ref: Any,
    default_namespace: str | None,
    allowed_namespace: str,
    config_maps: Mapping[tuple[str, str], Mapping[str, Any] | None],
    owner: str,
) -> Layer | None:
    target = config_map_ref(ref, default_namespace, allowed_namespace)
    if target is None:
        return None
    where = f"{owner} parametersRef ConfigMap {target[0]}/{target[1]}"
    return Layer(where, parse_parameters(config_maps.get(target), where))


# -- the AmbientMesh's waypoint policy ---------------------------------------------

_POLICY = "spec.waypoints.policy"


def image_prefixes(spec: AmbientMeshSpec) -> list[str]:
    """Where images set by parameters may come from."""
    policy = spec.waypoints.policy
    return list(policy.image_prefixes) if policy.image_prefixes is not None else [spec.images.hub]


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """Whether `image` is under one of `prefixes`, matched up to a '/', ':' or '@'.

    `docker.io/istio` must not admit `docker.io/istio-evil/proxyv2`.
    References are compared as written: `istio/proxyv2` is not under
    `docker.io/istio`.
    """
    for prefix in prefixes:
        if image == prefix or (prefix.endswith(("/", ":", "@")) and image.startswith(prefix)):
            return True
        if image.startswith(prefix) and image[len(prefix)] in "/:@":
            return True
    return False


def annotation_allowed(key: str, allowed: Sequence[str]) -> bool:
    """Whether an annotation key is an exact entry of `allowed`, or under a `prefix/*` one."""
    return any(
        key == entry or (entry.endswith("/*") and key.startswith(entry[:-1])) for entry in allowed
    )


def _layer_problem(spec: AmbientMeshSpec, layer: Layer) -> str | None:
    """Why the policy refuses what one parametersRef asks for, naming the policy field.

    Values are named only where they are the policy's own (a denied key).
    """
    policy = spec.waypoints.policy
    params, where = layer.parameters, layer.where
    if params.image is not None and params.image != spec.waypoints.image:
        prefixes = image_prefixes(spec)
        if not image_allowed(params.image, prefixes):
            return (
                f"{where} key image: not under an image prefix {_POLICY}.imagePrefixes allows "
                f"({', '.join(prefixes)})"
            )
    for index, toleration in enumerate(params.tolerations or []):
        if not toleration.key and not policy.allow_keyless_tolerations:
            return (
                f"{where} key tolerations[{index}]: a toleration without a key tolerates every "
                f"taint, and {_POLICY}.allowKeylessTolerations is false"
            )
        if toleration.key in policy.denied_node_keys:
            return (
                f"{where} key tolerations[{index}]: tolerates {toleration.key}, which "
                f"{_POLICY}.deniedNodeKeys denies"
            )
    for key in sorted(params.node_selector or {}):
        if key in policy.denied_node_keys:
            return f"{where} key nodeSelector: selects {key}, which {_POLICY}.deniedNodeKeys denies"
    return None


def _labels_allow(labels: Mapping[str, str], policy: WaypointPolicy) -> bool:
    return all(labels.get(k) == v for k, v in policy.service_account_labels.items())


def policy_problem(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    layers: Sequence[Layer | None],
    names: Names,
    foreign_service_account: Mapping[str, Any] | None,
) -> str | None:
    """Why spec.waypoints.policy refuses this Gateway, or None.

    `foreign_service_account` is the live account the service-account
    annotation names when it exists and is not this Gateway's own.
    """
    policy = spec.waypoints.policy
    if foreign_service_account is not None:
        labels = _str_map(_meta(foreign_service_account).get("labels"))
        if not _labels_allow(labels, policy):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(policy.service_account_labels.items()))
            return (
                f"annotation {c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT} names ServiceAccount "
                f"{names.service_account}, which exists and is not this Gateway's own; waypoint "
                f"pods run only as accounts labelled {wanted} "
                f"({_POLICY}.serviceAccountLabels)"
            )
    infra = _str_map((_spec(gateway).get("infrastructure") or {}).get("annotations"))
    for key in sorted(infra):
        if key in _NOT_COPIED_ANNOTATIONS or annotation_allowed(key, policy.pod_annotations):
            continue
        return (
            f"spec.infrastructure.annotations {shown(key)} would be copied to the waypoint's "
            f"pods, and {_POLICY}.podAnnotations allows only {', '.join(policy.pod_annotations)}"
        )
    for layer in layers:
        if layer is not None and (problem := _layer_problem(spec, layer)):
            return problem
    return None


# -- settings --------------------------------------------------------------------


def default_image(spec: AmbientMeshSpec) -> str:
    """The proxyv2 image waypoints run unless told otherwise."""
    return spec.waypoints.image or f"{spec.images.hub}/proxyv2:{spec.images.tag}"


def effective_settings(
    spec: AmbientMeshSpec, layers: Sequence[WaypointParameters | None]
) -> Settings:
    """AmbientMesh defaults, then each parameters layer in order (later wins).

    Scalars and `resources` are replaced, `nodeSelector` keys are merged and
    `tolerations` replace the list, as a Gateway's own setting is meant to
    override its class's.
    """
    wp = spec.waypoints
    image = default_image(spec)
    replicas = wp.replicas
    resources = wp.resources.model_dump(by_alias=True, exclude_none=True)
    selector = dict(wp.node_selector or {})
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in wp.tolerations or []]
    for layer in layers:
        if layer is None:
            continue
        image = layer.image or image
        replicas = replicas if layer.replicas is None else layer.replicas
        if layer.resources is not None:
            resources = layer.resources.model_dump(by_alias=True, exclude_none=True)
        selector.update(layer.node_selector or {})
        if layer.tolerations is not None:
            tolerations = [
                t.model_dump(by_alias=True, exclude_none=True) for t in layer.tolerations
            ]
    selector, tolerations, dropped = pin_linux(selector, tolerations)
    return Settings(image, replicas, resources, selector, tolerations, dropped)


def _overlay(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` laid over `base` as istiod's strategic merge patch lays it over these kinds.

    Maps merge key by key, a null removes the key, and lists replace: no list
    in an autoscaling/v2 or policy/v1 spec has a merge key.
    """
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            below = out.get(key)
            out[key] = _overlay(below if isinstance(below, Mapping) else {}, value)
        else:
            out[key] = value
    return out


# What istiod's waypoint template starts each object's spec from, before the
# overlays; the target and the selector are added with the waypoint's names.
_AUTOSCALER_BASE: dict[str, Any] = {"maxReplicas": 1}
_BUDGET_BASE: dict[str, Any] = {}


def scaling_of(layers: Sequence[Layer | None]) -> Scaling:
    """The autoscaler and disruption budget the layers ask for, lowest layer first.

    Each layer's overlay is laid over the one before (a Gateway's over its
    class's); the object exists when any layer has the key. Raises
    ParametersError when the result is not one the API server would take.
    """
    autoscaler: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    asked: list[str] = []
    budgeted: list[str] = []
    replicas: list[str] = []
    for layer in layers:
        if layer is None:
            continue
        params = layer.parameters
        if params.replicas is not None:
            replicas.append(layer.where)
        if params.horizontal_pod_autoscaler is not None:
            asked.append(layer.where)
            patch = params.horizontal_pod_autoscaler.model_dump(by_alias=True, exclude_unset=True)
            below = _AUTOSCALER_BASE if autoscaler is None else autoscaler
            autoscaler = _overlay(below, patch.get("spec") or {})
        if params.pod_disruption_budget is not None:
            budgeted.append(layer.where)
            patch = params.pod_disruption_budget.model_dump(by_alias=True, exclude_unset=True)
            budget = _overlay(_BUDGET_BASE if budget is None else budget, patch.get("spec") or {})
    if autoscaler is not None:
        where = " over ".join(reversed(asked))
        if "maxReplicas" not in autoscaler:
            raise ParametersError(
                f"{where} key horizontalPodAutoscaler: spec.maxReplicas is null; an autoscaler "
                "needs a maximum"
            )
        if int(autoscaler.get("minReplicas", 1)) > int(autoscaler["maxReplicas"]):
            raise ParametersError(
                f"{where} key horizontalPodAutoscaler: spec.minReplicas is above "
                "spec.maxReplicas (maxReplicas is 1 unless set, as in istiod)"
            )
    if budget is not None and "minAvailable" in budget and "maxUnavailable" in budget:
        raise ParametersError(
            f"{' over '.join(reversed(budgeted))} key podDisruptionBudget: spec.minAvailable "
            "and spec.maxUnavailable are both set, and a budget takes one; where the class "
            "sets the other, write it as null in the Gateway's ConfigMap"
        )
    return Scaling(autoscaler, budget, tuple(replicas) if autoscaler is not None else ())


# The kinds whose spec carries a parameters key's content as written
# (metrics, behavior), for the API server alone to check.
_FROM_OVERLAY = {"HorizontalPodAutoscaler": HPA_KEY, "PodDisruptionBudget": PDB_KEY}


def refusal(obj: Mapping[str, Any], status: int, message: str) -> str:
    """What the Gateway's status says when the API server refused one of its objects.

    A refusal of an autoscaler or budget may quote a value from the ConfigMap,
    which status must never hold: it names the key instead.
    """
    kind, name = str(obj.get("kind")), str(_meta(obj).get("name"))
    key = _FROM_OVERLAY.get(kind)
    if key is not None and status == 422:
        return (
            f"{kind} {name}: the API server refused the spec made from parameters key {key} "
            "(its answer, which may quote the ConfigMap, is in the operator's log)"
        )
    return f"{kind} {name}: {message}"


# -- names, listeners, waypoint-for -------------------------------------------------


def names_of(gateway: Mapping[str, Any]) -> Names:
    """Deployment/Service and ServiceAccount names, after istiod's override annotations."""
    meta = _meta(gateway)
    annotations = _str_map(meta.get("annotations"))
    base = annotations.get(c.ANNOTATION_GATEWAY_NAME_OVERRIDE) or str(meta.get("name", ""))
    named = annotations.get(c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT)
    return Names(
        deployment=base, service=base, service_account=named or base, named_account=bool(named)
    )


def name_problem(gateway: Mapping[str, Any], names: Names) -> str | None:
    """Why these names cannot be used, if they cannot."""
    gateway_name = str(_meta(gateway).get("name", ""))
    if len(gateway_name) > 63 or not _LABEL_VALUE.match(gateway_name):
        return (
            f"Gateway name {gateway_name!r} cannot be a label value (at most 63 characters); "
            "its pods are selected by that label"
        )
    if len(names.service) > 63 or not _DNS1035.match(names.service):
        return (
            f"{names.service!r} cannot name a Service (lowercase letters, digits and '-', "
            f"starting with a letter, at most 63 characters); set annotation "
            f"{c.ANNOTATION_GATEWAY_NAME_OVERRIDE}"
        )
    return None


def service_account_problem(names: Names) -> str | None:
    """Why the ServiceAccount the Gateway names by annotation cannot be used, if it cannot.

    Without the annotation the account is named like the Service, which
    `name_problem` has checked.
    """
    problem = why_not_a_name(names.service_account)
    if problem:
        return (
            f"annotation {c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT}: {shown(names.service_account)} "
            f"cannot name a ServiceAccount; it {problem}"
        )
    return None


def check_listeners(gateway: Mapping[str, Any]) -> tuple[ListenerCheck, ...]:
    """Judge each listener: a waypoint serves only HBONE on port 15008."""
    checks: list[ListenerCheck] = []
    for listener in _spec(gateway).get("listeners") or []:
        name = str(listener.get("name", ""))
        port = int(listener.get("port", 0))
        protocol = str(listener.get("protocol", ""))
        valid = port == c.PORT_HBONE and protocol == c.PROTOCOL_HBONE
        message = (
            "HBONE on 15008: the waypoint's mesh listener"
            if valid
            else f"listener {name!r} is {protocol} on port {port}; a waypoint accepts only "
            f"protocol {c.PROTOCOL_HBONE} on port {c.PORT_HBONE}"
        )
        # Routes reach a waypoint through the Services that use it, never
        # through its HBONE listener, so no route kind can attach here.
        kinds = (listener.get("allowedRoutes") or {}).get("kinds") or []
        invalid = tuple(str(k.get("kind", "")) for k in kinds if isinstance(k, Mapping))
        checks.append(ListenerCheck(name, port, protocol, valid, message, invalid))
    return tuple(checks)


def waypoint_for(
    gateway: Mapping[str, Any], gateway_class: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    """(effective istio.io/waypoint-for, problem): the Gateway's label beats its class's."""
    for source, obj in (("Gateway", gateway), ("GatewayClass", gateway_class)):
        value = _str_map(_meta(obj or {}).get("labels")).get(c.LABEL_WAYPOINT_FOR)
        if value is None:
            continue
        if value not in c.WAYPOINT_FOR_VALUES:
            allowed = ", ".join(c.WAYPOINT_FOR_VALUES)
            return None, f"{source} label {c.LABEL_WAYPOINT_FOR}={value!r} is not one of {allowed}"
        return value, None
    return None, None


# -- objects ----------------------------------------------------------------------


def _service_ports(listeners: Sequence[ListenerCheck]) -> list[dict[str, Any]]:
    ports: list[dict[str, Any]] = [
        {"name": "status-port", "port": c.PORT_READINESS, "app_protocol": "tcp"}
    ]
    used_ports = {c.PORT_READINESS}
    used_names = {"status-port"}
    for listener in listeners:
        if not listener.valid or listener.port in used_ports:
            continue  # listeners that differ only by hostname share one port
        name = listener.name
        if len(name) > 63 or not _DNS1123_LABEL.match(name) or name in used_names:
            name = f"{listener.protocol.lower()}-{listener.port}"
        used_ports.add(listener.port)
        used_names.add(name)
        ports.append(
            {"name": name, "port": listener.port, "app_protocol": listener.protocol.lower()}
        )
    return ports


def istiod_address(spec: AmbientMeshSpec) -> str:
    """host:port of istiod's XDS and CA as the waypoint dials it."""
    if spec.istiod.address:
        return spec.istiod.address
    return f"{spec.istiod.service()}.{spec.namespace}.svc:{c.PORT_ISTIOD_XDS}"


def _objects(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    class_name: str,
    names: Names,
    listeners: Sequence[ListenerCheck],
    settings: Settings,
    waypoint: str | None,
    *,
    own_service_account: bool,
    scaling: Scaling = Scaling(),
) -> tuple[dict[str, Any], ...]:
    meta = _meta(gateway)
    namespace = str(meta.get("namespace", ""))
    gateway_name = str(meta.get("name", ""))
    infra = _spec(gateway).get("infrastructure") or {}
    infra_labels = _str_map(infra.get("labels"))
    infra_annotations = {
        k: v
        for k, v in _str_map(infra.get("annotations")).items()
        if k not in _NOT_COPIED_ANNOTATIONS
    }
    # Ours are applied last: a user's infrastructure label cannot unpin or
    # unselect the waypoint.
    reserved = {
        c.LABEL_NAME: names.deployment,
        c.LABEL_COMPONENT: COMPONENT,
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_GATEWAY_NAME: gateway_name,
        c.LABEL_GATEWAY_CLASS_NAME: class_name,
        # istiod's deployment controller puts this on every waypoint object it
        # writes; ours are waypoints too and must be read as such.
        c.LABEL_GATEWAY_MANAGED: c.GATEWAY_MANAGED_MESH,
    }
    if waypoint is not None:
        reserved[c.LABEL_WAYPOINT_FOR] = waypoint
    labels = {**infra_labels, **reserved}
    pod_labels = {
        **infra_labels,
        **reserved,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        "sidecar.istio.io/inject": "false",
        c.LABEL_DATAPLANE_MODE: "none",
        "service.istio.io/canonical-name": names.deployment,
        "service.istio.io/canonical-revision": "latest",
    }
    pod_annotations = {
        **infra_annotations,
        "istio.io/rev": spec.istiod.revision or "default",
        "prometheus.io/path": "/stats/prometheus",
        "prometheus.io/port": str(c.PORT_METRICS),
        "prometheus.io/scrape": "true",
    }
    common = {
        "names": names,
        "namespace": namespace,
        "labels": labels,
        "annotations": infra_annotations,
    }
    selector = {c.LABEL_GATEWAY_NAME: gateway_name}
    objects: list[dict[str, Any]] = []
    if own_service_account:
        objects.append(render_object("waypoint-serviceaccount.yaml.j2", **common))
    objects.append(
        render_object(
            "waypoint-deployment.yaml.j2",
            **common,
            # The autoscaler's to set: a count we applied would undo its every change.
            replicas=None if scaling.autoscaler is not None else settings.replicas,
            selector=selector,
            pod_labels=pod_labels,
            pod_annotations=pod_annotations,
            os=pod_os(settings.node_selector),
            node_selector=settings.node_selector,
            tolerations=settings.tolerations,
            image=settings.image,
            resources=settings.resources,
            cluster_domain=spec.cluster_domain,
            trust_domain=spec.trust_domain,
            proxy_log_level=_PROXY_LEVELS[spec.log_level],
            agent_log_level=_AGENT_LEVELS[spec.log_level],
            istiod_address=istiod_address(spec),
            proxy_config=json.dumps(
                {"discoveryAddress": istiod_address(spec)}, separators=(",", ":")
            ),
            owner=f"kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/"
            f"{names.deployment}",
            ports={
                "metrics": c.PORT_METRICS,
                "status": c.PORT_READINESS,
                "envoy_stats": c.PORT_ENVOY_STATS,
            },
        )
    )
    objects.append(
        render_object(
            "waypoint-service.yaml.j2",
            **common,
            # istiod asks ztunnel to prefer waypoint endpoints close to the
            # client; the user's own infrastructure annotation may override it.
            service_annotations={
                "networking.istio.io/traffic-distribution": "PreferClose",
                **infra_annotations,
            },
            selector=selector,
            ports=_service_ports(listeners),
        )
    )
    if scaling.autoscaler is not None:
        target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.deployment}
        objects.append(
            render_object(
                "waypoint-autoscaler.yaml.j2",
                **common,
                spec={**scaling.autoscaler, "scaleTargetRef": target},
            )
        )
    if scaling.budget is not None:
        objects.append(
            render_object(
                "waypoint-disruption-budget.yaml.j2",
                **common,
                spec={**scaling.budget, "selector": {"matchLabels": selector}},
            )
        )
    return tuple(objects)


def render_waypoint(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    gateway_class: Mapping[str, Any] | None,
    config_maps: Mapping[tuple[str, str], Mapping[str, Any] | None],
    *,
    foreign_service_account: Mapping[str, Any] | None = None,
) -> WaypointRender:
    """Judge one Gateway of our class and lay out its objects.

    `config_maps` maps (namespace, name) to the data of every ConfigMap a
    parametersRef names (None when it does not exist). A
    `foreign_service_account` is the live ServiceAccount the Gateway names by
    annotation when it exists and is not the Gateway's own: if the policy
    allows it, it is used, not rendered.
    """
    names = names_of(gateway)
    if not names.named_account:
        # Only an account the annotation names can be somebody else's to
        # borrow; without one it is the Gateway's own, and a namesake held
        # by another is the writer's NameConflict.
        foreign_service_account = None
    listeners = check_listeners(gateway)
    waypoint, waypoint_problem = waypoint_for(gateway, gateway_class)
    warnings = [(WaypointEvent.INVALID_WAYPOINT_FOR, waypoint_problem)] if waypoint_problem else []
    class_name = str(_spec(gateway).get("gatewayClassName", ""))
    settings: Settings | None = None
    scaling = Scaling()
    accepted: Verdict
    valid = [listener for listener in listeners if listener.valid]
    problem = name_problem(gateway, names)
    account_problem = service_account_problem(names)
    if problem:
        accepted = Verdict(GatewayCondition.ACCEPTED, "False", GatewayReason.INVALID, problem)
    elif account_problem:
        accepted = Verdict(
            GatewayCondition.ACCEPTED, "False", GatewayReason.INVALID_PARAMETERS, account_problem
        )
    elif _spec(gateway).get("addresses"):
        accepted = Verdict(
            GatewayCondition.ACCEPTED,
            "False",
            GatewayReason.UNSUPPORTED_ADDRESS,
            "spec.addresses is not supported: a waypoint's address is its Service's, "
            "assigned by the cluster",
        )
    else:
        infra = _spec(gateway).get("infrastructure") or {}
        gateway_namespace = str(_meta(gateway).get("namespace") or "")
        try:
            layers = [
                _layer(
                    _spec(gateway_class).get("parametersRef"),
                    None,
                    spec.namespace,
                    config_maps,
                    "GatewayClass",
                ),
                _layer(
                    infra.get("parametersRef"),
                    gateway_namespace,
                    gateway_namespace,
                    config_maps,
                    "Gateway",
                ),
            ]
            refused = policy_problem(spec, gateway, layers, names, foreign_service_account)
            if refused:
                raise ParametersError(refused)
            settings = effective_settings(
                spec, [layer.parameters if layer else None for layer in layers]
            )
            scaling = scaling_of(layers)
        except ParametersError as exc:
            accepted = Verdict(
                GatewayCondition.ACCEPTED, "False", GatewayReason.INVALID_PARAMETERS, str(exc)
            )
        else:
            if not valid:
                accepted = Verdict(
                    GatewayCondition.ACCEPTED,
                    "False",
                    GatewayReason.LISTENERS_NOT_VALID,
                    f"no valid listener: a waypoint needs one with protocol "
                    f"{c.PROTOCOL_HBONE} on port {c.PORT_HBONE}",
                )
            else:
                serving = waypoint or "service"
                accepted = Verdict(
                    GatewayCondition.ACCEPTED,
                    "True",
                    GatewayReason.ACCEPTED,
                    f"waypoint for {serving} traffic; {len(valid)} of {len(listeners)} "
                    "listener(s) valid; pods run on Linux nodes only",
                )
    objects: tuple[dict[str, Any], ...] = ()
    replicas = 0
    if accepted.status == "True" and settings is not None:
        replicas = scaling.min_replicas if scaling.autoscaler is not None else settings.replicas
        for where in scaling.replicas_ignored:
            warnings.append(
                (
                    WaypointEvent.REPLICAS_LEFT_TO_AUTOSCALER,
                    f"{where} key replicas is ignored: the waypoint has a "
                    "HorizontalPodAutoscaler, which sets the Deployment's replicas",
                )
            )
        if settings.dropped:
            warnings.append(
                (
                    WaypointEvent.WINDOWS_PLACEMENT_IGNORED,
                    "a waypoint runs on Linux nodes only; ignored " + ", ".join(settings.dropped),
                )
            )
        objects = _objects(
            spec,
            gateway,
            class_name,
            names,
            listeners,
            settings,
            waypoint,
            own_service_account=foreign_service_account is None,
            scaling=scaling,
        )
    return WaypointRender(
        names,
        listeners,
        accepted,
        objects,
        replicas,
        waypoint,
        tuple(warnings),
        autoscaled=scaling.autoscaler is not None,
    )


def render_gateway_class(spec: AmbientMeshSpec) -> dict[str, Any]:
    """The GatewayClass this operator keeps for its waypoints."""
    return render_object(
        "gatewayclass.yaml.j2",
        name=spec.waypoints.class_name,
        controller_name=spec.waypoints.controller_name,
        labels={c.LABEL_PART_OF: c.PART_OF, c.LABEL_COMPONENT: COMPONENT},
        description=CLASS_DESCRIPTION,
    )


def class_verdict(
    gateway_class: Mapping[str, Any],
    config_maps: Mapping[tuple[str, str], Mapping[str, Any] | None],
    class_namespace: str = CLASS_PARAMETERS_NAMESPACE,
) -> Verdict:
    """Accepted of a GatewayClass of our controller: only its parametersRef can fail.

    Its parameters are read from `class_namespace` (the AmbientMesh's
    spec.namespace) only.
    """
    try:
        layer = _layer(
            _spec(gateway_class).get("parametersRef"),
            None,
            class_namespace,
            config_maps,
            "GatewayClass",
        )
        # An autoscaler or budget the class alone gets wrong fails every Gateway of it.
        scaling_of([layer])
    except ParametersError as exc:
        return Verdict(
            GatewayCondition.ACCEPTED, "False", GatewayReason.INVALID_PARAMETERS, str(exc)
        )
    return Verdict(
        GatewayCondition.ACCEPTED,
        "True",
        GatewayReason.ACCEPTED,
        "ambient-operator deploys this class's Gateways as waypoints on Linux nodes",
    )


# -- istiod's defaults for the istio-waypoint class -------------------------------


def pin_class_defaults(text: str | None) -> tuple[str | None, str | None]:
    """Merge a Linux pin into istiod's `deployment` overlay YAML.

    Returns (new text, None) when the overlay must change, (None, None) when
    it already pins Linux, and (None, problem) when it cannot be read as a
    mapping (then it is left alone). The merge only adds
    `spec.template.spec.nodeSelector["kubernetes.io/os"] = linux` and drops
    node-selector keys that can only match Windows; every other key the user
    wrote is kept. YAML comments do not survive a rewrite.
    """
    try:
        overlay = yaml.safe_load(text) if text and text.strip() else {}
    except yaml.YAMLError as exc:
        # Not the parser's text: it quotes the offending line, and the
        # message becomes an Event.
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return None, f"the deployment overlay is not valid YAML{at}"
    if overlay is None:
        overlay = {}
    if not isinstance(overlay, dict):
        return None, "the deployment overlay is not a YAML mapping"
    node: dict[str, Any] = overlay
    for key in ("spec", "template", "spec"):
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return None, f"the deployment overlay's {key} is not a mapping"
        node = child
    selector = node.get("nodeSelector")
    if selector is None:
        selector = {}
    if not isinstance(selector, dict):
        return None, "the deployment overlay's nodeSelector is not a mapping"
    pinned, _, _ = pin_linux({str(k): str(v) for k, v in selector.items()}, [])
    if selector == pinned:
        return None, None
    node["nodeSelector"] = pinned
    return yaml.safe_dump(overlay, sort_keys=False, default_flow_style=False), None


def render_class_defaults(name: str, namespace: str, deployment: str) -> dict[str, Any]:
    """Only our fields of the istio-waypoint class-defaults ConfigMap."""
    return render_object(
        "waypoint-class-defaults.yaml.j2",
        name=name,
        namespace=namespace,
        labels={c.LABEL_DEFAULTS_FOR_CLASS: c.ISTIO_WAYPOINT_CLASS},
        deployment=deployment,
    )
