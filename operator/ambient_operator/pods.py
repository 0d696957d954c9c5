"""What the operator keeps of each pod, and who is told.

Three parts of the operator follow pods: enrollment counts (a PodSummary in
the cluster state), the webhook's misses (a trimmed copy of pods it may have
missed) and the waypoint controller (where each Gateway's pods run). One
informer (kube/informer.py) reads the pod stream for all three; `record_of`
takes what each needs from a pod on the informer's thread, and `PodFeed`
hands it to them on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.kube.client import Kube
from ambient_operator.kube.informer import Change, Informer
from ambient_operator.kube.resources import KINDS
from ambient_operator.state import ClusterState, PodSummary
from ambient_operator.waypoints.controller import WaypointController, placement_of
from ambient_operator.webhook.misses import MissTracker

POD = KINDS[("v1", "Pod")]


@dataclass(frozen=True)
class PodRecord:
    """Everything any part of the operator keeps of one pod."""

    summary: PodSummary
    suspect: dict[str, Any] | None  # for the webhook's misses
    placement: tuple[str, str] | None  # (Gateway, node) of a waypoint pod


def record_of(pod: Mapping[str, Any]) -> PodRecord:
    """Take from a whole pod what the operator keeps. Pure."""
    return PodRecord(PodSummary.of(pod), MissTracker.suspect_of(pod), placement_of(pod))


class PodFeed:
    """Applies pod changes to the state, the misses and the waypoints, on the event loop."""

    def __init__(
        self,
        state: ClusterState,
        misses: MissTracker | None,
        waypoints: WaypointController | None,
    ) -> None:
        self.state = state
        self.misses = misses
        self.waypoints = waypoints

    def apply(self, changes: list[Change[PodRecord]]) -> None:
        """One batch from the informer."""
        pods = self.state.pods
        changed = False
        for change in changes:
            record = change.record
            if record is None:
                changed = pods.pop(change.key, None) is not None or changed
            elif pods.get(change.key) != record.summary:
                pods[change.key] = record.summary
                changed = True
            if self.misses is not None:
                self.misses.remember(change.key, record.suspect if record else None)
            if self.waypoints is not None:
                self.waypoints.place_pod(change.key, record.placement if record else None)
        if changed:
            # Pods only move status along: not urgent.
            self.state.poke(urgent=False)

    def informer(self, kube: Kube, loop: asyncio.AbstractEventLoop) -> Informer[PodRecord]:
        """An informer over every pod of the cluster feeding this."""
        return Informer(kube, POD, record_of, self.apply, loop)
