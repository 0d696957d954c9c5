"""The parametersRef ConfigMaps of a Gateway and its class: where they may be, what they hold.

A ConfigMap may hold anything, secrets included, and what is said about it
goes into status, which more people read than may read the ConfigMap: every
message here names a key, never a value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ambient_operator.api.types import ApiModel, ImageRef, LabelMap
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, Resources, Toleration, Tolerations
from ambient_operator.kube.resources import NameRule, shown, why_not_a_name
from ambient_operator.render.waypoints.fields import meta_of, spec_of

# Where a GatewayClass's parametersRef may point when the caller does not say:
# the AmbientMesh's default spec.namespace (istiod's, the agents').
CLASS_PARAMETERS_NAMESPACE: str = AmbientMeshSpec.model_fields["namespace"].default


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
    gateway_namespace = str(meta_of(gateway).get("namespace") or "")
    for ref, namespace, allowed in (
        (spec_of(gateway_class).get("parametersRef"), None, class_namespace),
        (
            (spec_of(gateway).get("infrastructure") or {}).get("parametersRef"),
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


def read_layer(
    ref: Any,
    default_namespace: str | None,
    allowed_namespace: str,
    config_maps: Mapping[tuple[str, str], Mapping[str, Any] | None],
    owner: str,
) -> Layer | None:
    """One parametersRef's layer, named after its `owner` kind; None without a reference.

    Raises ParametersError when the reference or the ConfigMap cannot be used.
    """
    target = config_map_ref(ref, default_namespace, allowed_namespace)
    if target is None:
        return None
    where = f"{owner} parametersRef ConfigMap {target[0]}/{target[1]}"
    return Layer(where, parse_parameters(config_maps.get(target), where))


def gateway_layers(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    gateway_class: Mapping[str, Any] | None,
    config_maps: Mapping[tuple[str, str], Mapping[str, Any] | None],
) -> list[Layer | None]:
    """The class's layer, then the Gateway's (None where there is no parametersRef).

    Raises ParametersError for a reference or a ConfigMap that cannot be used.
    """
    gateway_namespace = str(meta_of(gateway).get("namespace") or "")
    infra = spec_of(gateway).get("infrastructure") or {}
    return [
        read_layer(
            spec_of(gateway_class).get("parametersRef"),
            None,
            spec.namespace,
            config_maps,
            "GatewayClass",
        ),
        read_layer(
            infra.get("parametersRef"),
            gateway_namespace,
            gateway_namespace,
            config_maps,
            "Gateway",
        ),
    ]


# The kinds whose spec carries a parameters key's content as written
# (metrics, behavior), for the API server alone to check.
_FROM_OVERLAY = {"HorizontalPodAutoscaler": HPA_KEY, "PodDisruptionBudget": PDB_KEY}


def refusal(obj: Mapping[str, Any], status: int, message: str) -> str:
    """What the Gateway's status says when the API server refused one of its objects.

    A refusal of an autoscaler or budget may quote a value from the ConfigMap,
    which status must never hold: it names the key instead.
    """
    kind, name = str(obj.get("kind")), str(meta_of(obj).get("name"))
    key = _FROM_OVERLAY.get(kind)
    if key is not None and status == 422:
        return (
            f"{kind} {name}: the API server refused the spec made from parameters key {key} "
            "(its answer, which may quote the ConfigMap, is in the operator's log)"
        )
    return f"{kind} {name}: {message}"
