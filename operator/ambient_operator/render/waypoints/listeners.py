"""Which of a Gateway's listeners a waypoint serves, and the ports of its Service."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.render.waypoints.fields import spec_of

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


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


def is_waypoint(gateway: Mapping[str, Any]) -> bool:
    """A Gateway meant to carry mesh traffic: it has the HBONE listener on 15008."""
    return any(
        listener.get("port") == c.PORT_HBONE and listener.get("protocol") == c.PROTOCOL_HBONE
        for listener in spec_of(gateway).get("listeners") or []
        if isinstance(listener, Mapping)
    )


def check_listeners(gateway: Mapping[str, Any]) -> tuple[ListenerCheck, ...]:
    """Judge each listener: a waypoint serves only HBONE on port 15008."""
    checks: list[ListenerCheck] = []
    for listener in spec_of(gateway).get("listeners") or []:
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


def service_ports(listeners: Sequence[ListenerCheck]) -> list[dict[str, Any]]:
    """The Service's ports: status-port 15021, then one per valid listener's port."""
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
