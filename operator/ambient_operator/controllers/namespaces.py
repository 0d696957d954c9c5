"""Namespace enrollment checks: warn, on the Namespace, about labels that cannot work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.cluster.enrollment import carries_ambient_labels, namespace_problems
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.render.waypoints.listeners import is_waypoint
from ambient_operator.status.events import EventRecorder

GatewayKey = tuple[str, str]


class _Waypoints(Mapping[GatewayKey, bool]):
    """Each cached Gateway's key -> whether it is a waypoint, judged when asked.

    What namespace_problems reads: one Gateway per namespace that names one,
    so a check does not judge every Gateway of the cluster.
    """

    def __init__(self, gateways: Mapping[GatewayKey, Mapping[str, Any]]) -> None:
        self._gateways = gateways

    def __getitem__(self, key: GatewayKey) -> bool:
        return is_waypoint(self._gateways[key])

    def __iter__(self) -> Iterator[GatewayKey]:
        return iter(self._gateways)

    def __len__(self) -> int:
        return len(self._gateways)


class NamespaceChecker:
    """Posts a Warning Event per problem; Events are deduplicated, so re-checks are free."""

    def __init__(self, state: ClusterState, kube: Kube, events: EventRecorder) -> None:
        self.state = state
        self.kube = kube
        self.events = events
        # The namespaces whose use-waypoint label looks in each namespace: a
        # Gateway's change there may change what is wrong with them.
        self._looking_in: dict[str, set[str]] = {}
        self._looks_in: dict[str, str] = {}
        # Namespaces judged, for tests that count the work.
        self.judged = 0

    async def check(self) -> None:
        """Check the namespaces changed since the last check, or all of them after a resync.

        Changed means its labels changed, or a Gateway changed in the namespace
        its use-waypoint label looks in. Only namespaces carrying an ambient
        label, or a near miss of one, are judged. Near misses count:
        `data-plane-mode: ambient` enrolls nothing, and without a word from us
        nothing says so.
        """
        state = self.state
        changed, gateways = state.changed_namespaces, state.changed_gateways
        state.changed_namespaces, state.changed_gateways = set(), set()
        if changed is None:
            names = sorted(state.namespaces)
            self._looking_in.clear()
            self._looks_in.clear()
        else:
            for gw_namespace in {ns for ns, _ in gateways}:
                changed |= self._looking_in.get(gw_namespace, set())
            names = sorted(changed)
        waypoints = _Waypoints(state.gateways)
        for i, name in enumerate(names):
            try:
                await self._check(name, waypoints)
            except BaseException:
                # What was not checked is checked on the next pass.
                if state.changed_namespaces is not None:
                    state.changed_namespaces.update(names[i:])
                raise

    async def _check(self, name: str, waypoints: Mapping[GatewayKey, bool]) -> None:
        looked = self._looks_in.pop(name, None)
        if looked is not None:
            self._looking_in[looked].discard(name)
            if not self._looking_in[looked]:
                del self._looking_in[looked]
        ns = self.state.namespaces.get(name)
        labels = (ns or {}).get("labels") or {}
        if ns is None or not carries_ambient_labels(labels):
            return
        # As namespace_problems reads it.
        looks_in = labels.get(c.LABEL_USE_WAYPOINT_NAMESPACE) or name
        self._looks_in[name] = looks_in
        self._looking_in.setdefault(looks_in, set()).add(name)
        self.judged += 1
        for reason, message in namespace_problems(name, labels, waypoints, enrollment=True):
            if not self.events.told(ns, reason, message):
                await asyncio.to_thread(self.events.post, ns, "Warning", reason, message)
