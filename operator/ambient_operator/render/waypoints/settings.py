"""Effective waypoint settings, autoscaler and disruption budget after every layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.render.placement import pin_linux
from ambient_operator.render.waypoints.parameters import Layer, ParametersError, WaypointParameters


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


def default_image(spec: AmbientMeshSpec) -> str:
    """The proxyv2 image waypoints run unless told otherwise."""
    # istiod's own proxy image carries the variant as well.
    variant = f"-{spec.images.variant}" if spec.images.variant else ""
    return spec.waypoints.image or f"{spec.images.hub}/proxyv2:{spec.images.tag}{variant}"


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
