"""Judging a Gateway of our class, and our GatewayClass: Accepted, and what to deploy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import (
    GatewayCondition,
    GatewayReason,
    Verdict,
    WaypointEvent,
)
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.render.waypoints.fields import spec_of
from ambient_operator.render.waypoints.listeners import ListenerCheck, check_listeners
from ambient_operator.render.waypoints.names import (
    Names,
    name_problem,
    names_of,
    service_account_problem,
    waypoint_for,
)
from ambient_operator.render.waypoints.objects import waypoint_objects
from ambient_operator.render.waypoints.parameters import (
    CLASS_PARAMETERS_NAMESPACE,
    ParametersError,
    gateway_layers,
    read_layer,
)
from ambient_operator.render.waypoints.policy import policy_problem
from ambient_operator.render.waypoints.settings import (
    Scaling,
    Settings,
    effective_settings,
    scaling_of,
)


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
    class_name = str(spec_of(gateway).get("gatewayClassName", ""))
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
    elif spec_of(gateway).get("addresses"):
        accepted = Verdict(
            GatewayCondition.ACCEPTED,
            "False",
            GatewayReason.UNSUPPORTED_ADDRESS,
            "spec.addresses is not supported: a waypoint's address is its Service's, "
            "assigned by the cluster",
        )
    else:
        try:
            layers = gateway_layers(spec, gateway, gateway_class, config_maps)
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
        objects = waypoint_objects(
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
        layer = read_layer(
            spec_of(gateway_class).get("parametersRef"),
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
