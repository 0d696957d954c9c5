"""Namespace enrollment checks: warn, on the Namespace, about labels that cannot work."""

from __future__ import annotations

import asyncio

from ambient_operator.cluster.enrollment import carries_ambient_labels, namespace_problems
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.render.waypoints.listeners import is_waypoint
from ambient_operator.status.events import EventRecorder


class NamespaceChecker:
    """Posts a Warning Event per problem; Events are deduplicated, so re-checks are free."""

    def __init__(self, state: ClusterState, kube: Kube, events: EventRecorder) -> None:
        self.state = state
        self.kube = kube
        self.events = events

    async def check_all(self) -> None:
        """Check every namespace that carries an ambient label, or a near miss of one.

        Near misses count: `data-plane-mode: ambient` enrolls nothing, and
        without a word from us nothing says so.
        """
        waypoints = {key: is_waypoint(gw) for key, gw in self.state.gateways.items()}
        for name, ns in sorted(self.state.namespaces.items()):
            labels = ns.get("labels") or {}
            if not carries_ambient_labels(labels):
                continue
            for reason, message in namespace_problems(name, labels, waypoints, enrollment=True):
                if not self.events.told(ns, reason, message):
                    await asyncio.to_thread(self.events.post, ns, "Warning", reason, message)
