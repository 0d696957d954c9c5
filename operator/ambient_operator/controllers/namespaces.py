"""Namespace enrollment checks: warn, on the Namespace, about labels that cannot work."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.cluster.enrollment import namespace_problems
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.status.events import EventRecorder


def is_waypoint(gateway: Mapping[str, Any]) -> bool:
    """A Gateway that can carry mesh traffic: an HBONE listener on 15008."""
    return any(
        listener.get("port") == c.PORT_HBONE and listener.get("protocol") == "HBONE"
        for listener in (gateway.get("spec") or {}).get("listeners") or []
    )


class NamespaceChecker:
    """Posts a Warning Event per problem; Events are deduplicated, so re-checks are free."""

    def __init__(self, state: ClusterState, kube: Kube, events: EventRecorder) -> None:
        self.state = state
        self.kube = kube
        self.events = events

    async def check_all(self) -> None:
        """Check every namespace that carries an ambient label."""
        waypoints = {key: is_waypoint(gw) for key, gw in self.state.gateways.items()}
        relevant = (c.LABEL_DATAPLANE_MODE, c.LABEL_USE_WAYPOINT)
        for name, ns in sorted(self.state.namespaces.items()):
            labels = ns.get("labels") or {}
            if not any(label in labels for label in relevant):
                continue
            for reason, message in namespace_problems(name, labels, waypoints):
                if not self.events.told(ns, reason, message):
                    await asyncio.to_thread(self.events.post, ns, "Warning", reason, message)
