"""Which GatewayClasses are ours, what a Gateway's objects are called, what it serves."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.kube.resources import shown, why_not_a_name
from ambient_operator.render.waypoints.fields import meta_of, spec_of, str_map

# Prune sets (apply.LABEL_CONTROLLER): one per Gateway, selected together with
# the gateway-name label, and one for the GatewayClass we keep.
CONTROLLER = "waypoint"
CLASS_CONTROLLER = "waypoint-class"
COMPONENT = "waypoint"
# Gateway metadata that steers istiod-style deployment, not infrastructure.
NOT_COPIED_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        c.ANNOTATION_GATEWAY_NAME_OVERRIDE,
        c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT,
        "gateway.istio.io/controller-version",
    }
)
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Names:
    """Names of a Gateway's objects (istiod's annotations can override them)."""

    deployment: str
    service: str
    service_account: str
    # The service-account annotation names the account: a value, not an empty
    # one, which names nothing (the account is then the Gateway's own).
    named_account: bool = False


def class_is_ours(gateway_class: Mapping[str, Any] | None, controller_name: str) -> bool:
    """Whether a GatewayClass names our controller (Gateway API's ownership rule)."""
    return spec_of(gateway_class).get("controllerName") == controller_name


def names_of(gateway: Mapping[str, Any]) -> Names:
    """Deployment/Service and ServiceAccount names, after istiod's override annotations."""
    meta = meta_of(gateway)
    annotations = str_map(meta.get("annotations"))
    base = annotations.get(c.ANNOTATION_GATEWAY_NAME_OVERRIDE) or str(meta.get("name", ""))
    named = annotations.get(c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT)
    return Names(
        deployment=base, service=base, service_account=named or base, named_account=bool(named)
    )


def name_problem(gateway: Mapping[str, Any], names: Names) -> str | None:
    """Why these names cannot be used, if they cannot."""
    gateway_name = str(meta_of(gateway).get("name", ""))
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


def waypoint_for(
    gateway: Mapping[str, Any], gateway_class: Mapping[str, Any] | None
) -> tuple[str | None, str | None]:
    """(effective istio.io/waypoint-for, problem): the Gateway's label beats its class's."""
    for source, obj in (("Gateway", gateway), ("GatewayClass", gateway_class)):
        value = str_map(meta_of(obj or {}).get("labels")).get(c.LABEL_WAYPOINT_FOR)
        if value is None:
            continue
        if value not in c.WAYPOINT_FOR_VALUES:
            allowed = ", ".join(c.WAYPOINT_FOR_VALUES)
            return None, f"{source} label {c.LABEL_WAYPOINT_FOR}={value!r} is not one of {allowed}"
        return value, None
    return None, None
