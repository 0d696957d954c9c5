"""Wiring of the waypoint controller on the operator's registry.

Its watches are rows of the watch table (`WaypointController.watches`),
registered with the cluster state's by app/watches.py; app/operator.py
primes it and starts its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf

from ambient_operator.cluster.state import ClusterState
from ambient_operator.controllers.waypoints import WaypointController
from ambient_operator.controllers.waypoints.common import Seen
from ambient_operator.kube.client import Kube
from ambient_operator.status.events import EventRecorder


def register(
    reg: kopf.OperatorRegistry,
    state: ClusterState,
    kube: Kube,
    events: EventRecorder,
    resync_seconds: float,
    seen: Seen,
) -> WaypointController:
    """Create the waypoint controller, and its clean-up on `reg`."""
    ctl = WaypointController(state, kube, events, resync_seconds=resync_seconds, seen=seen)

    @kopf.on.cleanup(registry=reg, id="waypoints-stop")
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("waypoints")
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctl.close()

    return ctl
