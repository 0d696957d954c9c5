"""Wiring of the waypoint controller: its kopf watches and its loop, on the operator's registry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import kopf

from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.cluster.state import ClusterState
from ambient_operator.controllers.waypoints import WaypointController
from ambient_operator.kube.client import Kube
from ambient_operator.render import waypoints as wr
from ambient_operator.status.events import EventRecorder


def register(
    reg: kopf.OperatorRegistry,
    state: ClusterState,
    kube: Kube,
    events: EventRecorder,
    leading: Callable[[], bool],
    resync_seconds: float,
) -> WaypointController:
    """Create the waypoint controller and register its watches on `reg`.

    The runner calls `reconcile()` of the returned controller in its loop;
    `leading` says whether this replica may write.
    """
    ctl = WaypointController(state, kube, events, resync_seconds=resync_seconds)
    ours = {LABEL_CONTROLLER: wr.CONTROLLER}

    @kopf.on.startup(registry=reg, id="waypoints-prime", backoff=2)
    async def prime(memo: kopf.Memo, **_: Any) -> None:
        await ctl.prime()
        memo["waypoints"] = asyncio.create_task(ctl.run(leading), name="waypoints-loop")

    @kopf.on.cleanup(registry=reg, id="waypoints-stop")
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("waypoints")
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ctl.close()

    @kopf.on.event(
        "gateway.networking.k8s.io", "v1", "gateways", registry=reg, id="waypoints-gateways"
    )
    async def gateway_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        ctl.on_gateway(type, body)

    @kopf.on.event(
        "gateway.networking.k8s.io",
        "v1",
        "gatewayclasses",
        registry=reg,
        id="waypoints-gatewayclasses",
    )
    async def gateway_class_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        ctl.on_gateway_class(type, body)

    for group, version, plural in (
        ("apps", "v1", "deployments"),
        ("", "v1", "services"),
        ("", "v1", "serviceaccounts"),
    ):

        @kopf.on.event(
            group, version, plural, labels=ours, registry=reg, id=f"waypoints-owned-{plural}"
        )
        async def owned_event(type: str | None, body: kopf.Body, **_: Any) -> None:
            ctl.on_owned(type, body)

    def wanted_config_map(name: str, namespace: str | None, labels: kopf.Labels, **_: Any) -> bool:
        return ctl.wants_config_map(name, namespace or "", labels)

    @kopf.on.event(
        "", "v1", "configmaps", when=wanted_config_map, registry=reg, id="waypoints-configmaps"
    )
    async def config_map_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        ctl.on_config_map(type, body)

    # Pods reach `place_pod` from the operator's pod informer (ambient_operator.cluster.pods).

    @kopf.on.event("", "v1", "services", registry=reg, id="waypoints-services")
    async def service_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        ctl.on_service(type, body)

    return ctl
