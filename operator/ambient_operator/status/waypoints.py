"""Gateway and GatewayClass status from what the cluster reports. Pure functions.

Gateway API's vocabulary, and one reason of our own (GatewayCondition and
GatewayReason in api/conditions.py):
- Gateway Accepted: True/Accepted, or False with Invalid, InvalidParameters,
  UnsupportedAddress, ListenersNotValid (decided by render).
- Gateway Programmed: True/Programmed, or False with Invalid (not accepted, or
  the objects could not be applied), NoResources (zero replicas asked for),
  AddressNotAssigned (the Service has no cluster IP yet), Pending (pods not
  available yet), and one reason of our own, NameConflict (see below).
- Listener Accepted (False: UnsupportedProtocol), Programmed, ResolvedRefs
  (False: InvalidRouteKinds).
An address once reported is kept: the ambient data plane ignores a waypoint
whose status.addresses is empty, so losing one would silently bypass it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import GatewayCondition, GatewayReason, Verdict
from ambient_operator.render.waypoints.listeners import ListenerCheck

GATEWAY_CONDITIONS = (GatewayCondition.ACCEPTED, GatewayCondition.PROGRAMMED)
# NameConflict: another party's object holds a name the waypoint needs.
# Gateway API lets a controller raise Programmed "with other reasons" when
# none of its own fits, and none does: the Gateway is valid (so Accepted
# stays True and Invalid would point at the wrong object), resources are not
# short (NoResources), no address is pending (AddressNotAssigned, Pending
# would promise progress). istiod skips such an object silently (canManage)
# and reports nothing.
# Gateway API caps status.addresses at 16 entries.
MAX_ADDRESSES = 16


def _conditions_by_type(conditions: Any) -> dict[str, Mapping[str, Any]]:
    if not isinstance(conditions, list):
        return {}
    return {
        str(cond.get("type")): cond
        for cond in conditions
        if isinstance(cond, Mapping) and cond.get("type")
    }


def conditions(
    previous: Any, verdicts: Iterable[Verdict], generation: int, now: str
) -> list[dict[str, Any]]:
    """metav1.Conditions; the transition time moves only when the status does."""
    before = _conditions_by_type(previous)
    out = []
    for v in verdicts:
        old = before.get(v.type)
        since = (
            str(old.get("lastTransitionTime"))
            if old is not None and old.get("status") == v.status and old.get("lastTransitionTime")
            else now
        )
        out.append(
            {
                "type": v.type,
                "status": v.status,
                "reason": v.reason,
                "message": v.message[:32768],
                "observedGeneration": generation,
                "lastTransitionTime": since,
            }
        )
    return out


def service_addresses(
    service: Mapping[str, Any] | None, cluster_domain: str
) -> list[dict[str, str]]:
    """The addresses a ready waypoint Service offers: its cluster IPs, then its DNS name."""
    if service is None:
        return []
    spec = service.get("spec") or {}
    ips = [ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None"]
    if not ips:
        return []
    meta = service.get("metadata") or {}
    hostname = f"{meta.get('name')}.{meta.get('namespace')}.svc.{cluster_domain}"
    return [
        *({"type": "IPAddress", "value": ip} for ip in ips),
        {"type": "Hostname", "value": hostname},
    ]


def merge_addresses(previous: Any, current: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """Previously reported addresses, in order, then new ones; nothing is dropped.

    Only the schema's limit of 16 can force one out: then the oldest
    previous entries give way to the current ones.
    """
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for entry in [*(previous if isinstance(previous, list) else []), *current]:
        if not isinstance(entry, Mapping) or not entry.get("value"):
            continue
        item = {"type": str(entry.get("type") or "IPAddress"), "value": str(entry["value"])}
        key = (item["type"], item["value"])
        if key not in seen:
            seen.add(key)
            out.append(item)
    if len(out) > MAX_ADDRESSES:
        keep = {(a["type"], a["value"]) for a in current}
        extra = len(out) - MAX_ADDRESSES
        trimmed = []
        for item in out:
            if extra and (item["type"], item["value"]) not in keep:
                extra -= 1
                continue
            trimmed.append(item)
        out = trimmed[:MAX_ADDRESSES]
    return out


def programmed_verdict(
    accepted: Verdict,
    replicas: int,
    deployment: Mapping[str, Any] | None,
    service: Mapping[str, Any] | None,
    apply_error: str | None,
    name_conflict: str | None = None,
) -> Verdict:
    """Programmed is True only while the Deployment has available pods and the Service an IP."""
    if accepted.status != "True":
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.INVALID,
            f"not accepted: {accepted.message}",
        )
    if name_conflict:
        also = f"; and could not check or apply: {apply_error}" if apply_error else ""
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.NAME_CONFLICT,
            f"{name_conflict}; nothing is written for this Gateway while a name it needs is "
            f"taken (rename it, or set annotation {c.ANNOTATION_GATEWAY_NAME_OVERRIDE}){also}",
        )
    if apply_error:
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.INVALID,
            f"could not apply: {apply_error}",
        )
    if replicas == 0:
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.NO_RESOURCES,
            "0 replicas requested: no waypoint pod serves this Gateway",
        )
    if deployment is None or service is None:
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.PENDING,
            "creating the waypoint Deployment and Service",
        )
    spec = service.get("spec") or {}
    if not spec.get("clusterIP") or spec.get("clusterIP") == "None":
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.ADDRESS_NOT_ASSIGNED,
            "the waypoint Service has no cluster IP yet",
        )
    st = deployment.get("status") or {}
    available = int(st.get("availableReplicas") or 0)
    if available < 1:
        return Verdict(
            GatewayCondition.PROGRAMMED,
            "False",
            GatewayReason.PENDING,
            f"0/{replicas} waypoint pod(s) available",
        )
    return Verdict(
        GatewayCondition.PROGRAMMED,
        "True",
        GatewayReason.PROGRAMMED,
        f"{available}/{replicas} waypoint pod(s) available behind {spec.get('clusterIP')}",
    )


def listener_statuses(
    listeners: Sequence[ListenerCheck],
    programmed: Verdict,
    previous: Any,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """status.listeners, one per spec listener, in spec order."""
    before = {
        str(item.get("name")): item
        for item in (previous if isinstance(previous, list) else [])
        if isinstance(item, Mapping)
    }
    out = []
    for listener in listeners:
        if listener.valid:
            accepted = Verdict(
                GatewayCondition.ACCEPTED, "True", GatewayReason.ACCEPTED, listener.message
            )
            if programmed.status == "True":
                prog = Verdict(
                    GatewayCondition.PROGRAMMED,
                    "True",
                    GatewayReason.PROGRAMMED,
                    programmed.message,
                )
            else:
                reason = (
                    GatewayReason.INVALID
                    if programmed.reason == GatewayReason.INVALID
                    else GatewayReason.PENDING
                )
                prog = Verdict(GatewayCondition.PROGRAMMED, "False", reason, programmed.message)
        else:
            accepted = Verdict(
                GatewayCondition.ACCEPTED,
                "False",
                GatewayReason.UNSUPPORTED_PROTOCOL,
                listener.message,
            )
            prog = Verdict(
                GatewayCondition.PROGRAMMED, "False", GatewayReason.INVALID, listener.message
            )
        if listener.invalid_kinds:
            resolved = Verdict(
                GatewayCondition.RESOLVED_REFS,
                "False",
                GatewayReason.INVALID_ROUTE_KINDS,
                f"route kinds {', '.join(listener.invalid_kinds)} cannot attach to a waypoint "
                "listener; attach routes to the Services that use the waypoint",
            )
        else:
            resolved = Verdict(
                GatewayCondition.RESOLVED_REFS,
                "True",
                GatewayReason.RESOLVED_REFS,
                "no references to resolve",
            )
        old = before.get(listener.name) or {}
        out.append(
            {
                "name": listener.name,
                # Routes reach a waypoint through Services, so none attach here.
                "supportedKinds": [],
                "attachedRoutes": 0,
                "conditions": conditions(
                    old.get("conditions"), (accepted, prog, resolved), generation, now
                ),
            }
        )
    return out


def gateway_status(
    gateway: Mapping[str, Any],
    accepted: Verdict,
    programmed: Verdict,
    listeners: Sequence[ListenerCheck],
    service: Mapping[str, Any] | None,
    cluster_domain: str,
    now: str,
) -> dict[str, Any]:
    """The status fields we own on a Gateway of our class."""
    generation = int((gateway.get("metadata") or {}).get("generation") or 0)
    previous = gateway.get("status") or {}
    current = service_addresses(service, cluster_domain) if programmed.status == "True" else []
    status: dict[str, Any] = {
        "conditions": conditions(
            previous.get("conditions"), (accepted, programmed), generation, now
        ),
        "listeners": listener_statuses(
            listeners, programmed, previous.get("listeners"), generation, now
        ),
    }
    addresses = merge_addresses(previous.get("addresses"), current)
    if addresses:
        status["addresses"] = addresses
    return status


def _strip_times(conds: Any, types: Iterable[str] | None = None) -> list[tuple[Any, ...]]:
    wanted = set(types) if types is not None else None
    out = []
    for cond in conds if isinstance(conds, list) else []:
        if not isinstance(cond, Mapping):
            continue
        if wanted is not None and cond.get("type") not in wanted:
            continue
        out.append(
            (
                cond.get("type"),
                cond.get("status"),
                cond.get("reason"),
                cond.get("message"),
                cond.get("observedGeneration"),
            )
        )
    return sorted(out, key=lambda t: str(t[0]))


def _listener_key(items: Any) -> list[tuple[Any, ...]]:
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        kinds = sorted(
            (str(k.get("group", "gateway.networking.k8s.io")), str(k.get("kind")))
            for k in item.get("supportedKinds") or []
        )
        out.append(
            (
                item.get("name"),
                tuple(kinds),
                item.get("attachedRoutes"),
                tuple(_strip_times(item.get("conditions"))),
            )
        )
    return out


def gateway_status_changed(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Whether writing `desired` would change what the Gateway reports.

    Transition times are carried over by `conditions`, so they are left out;
    conditions of types we do not write are someone else's.
    """
    live = live or {}
    if _strip_times(desired.get("conditions"), GATEWAY_CONDITIONS) != _strip_times(
        live.get("conditions"), GATEWAY_CONDITIONS
    ):
        return True
    if _listener_key(desired.get("listeners")) != _listener_key(live.get("listeners")):
        return True
    return list(desired.get("addresses") or []) != [
        {"type": str(a.get("type") or "IPAddress"), "value": a.get("value")}
        for a in live.get("addresses") or []
        if isinstance(a, Mapping)
    ]


def class_status(gateway_class: Mapping[str, Any], accepted: Verdict, now: str) -> dict[str, Any]:
    """The status fields we own on a GatewayClass of our controller."""
    generation = int((gateway_class.get("metadata") or {}).get("generation") or 0)
    previous = (gateway_class.get("status") or {}).get("conditions")
    return {"conditions": conditions(previous, (accepted,), generation, now)}


def class_status_changed(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Whether writing `desired` would change the GatewayClass's Accepted condition."""
    accepted = (GatewayCondition.ACCEPTED,)
    return _strip_times(desired.get("conditions"), accepted) != _strip_times(
        (live or {}).get("conditions"), accepted
    )
