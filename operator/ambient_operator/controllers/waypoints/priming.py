"""Priming and sweeps: the first listing of everything watched, the sweep targets,
and whether the API server serves Gateway API at all."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.controllers.waypoints.cache import WaypointCache
from ambient_operator.controllers.waypoints.common import (
    CONFIG_MAP,
    GATEWAY,
    GATEWAY_API_RECHECK_SECONDS,
    GATEWAY_CLASS,
    SERVICE_ACCOUNT,
    GatewayKey,
    _labels,
)
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import KINDS, Kind
from ambient_operator.kube.sweep import Target
from ambient_operator.render import waypoints as wr


class WaypointPriming(WaypointCache):
    """Fills the caches at start-up and hands them to kube/sweep.py."""

    def sweep_targets(self) -> list[Target]:
        """This controller's caches, for kube/sweep.py: what a watch may never report deleted."""
        ours = f"{LABEL_CONTROLLER}={wr.CONTROLLER}"

        def stub(kind: Kind, key: GatewayKey) -> dict[str, Any]:
            meta = {"name": key[1], **({"namespace": key[0]} if key[0] else {})}
            return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}

        def owned(kind: Kind) -> dict[GatewayKey, dict[str, Any]]:
            return {
                (okey[2], okey[3]): obj
                for objects in self.objects.values()
                for okey, obj in objects.items()
                if okey[0] == kind.api_version and okey[1] == kind.kind
            }

        def owned_target(kind: Kind) -> Target:
            def forget(key: GatewayKey) -> None:
                obj = owned(kind).get(key)
                if obj is not None:
                    self.on_owned("DELETED", obj)

            return Target(kind, lambda: owned(kind), forget, label_selector=ours)

        targets = [
            Target(
                GATEWAY_CLASS,
                lambda: {("", name): cls for name, cls in self.classes.items()},
                lambda key: self.on_gateway_class("DELETED", stub(GATEWAY_CLASS, key)),
            ),
            Target(
                GATEWAY,
                lambda: dict(self.gateways),
                lambda key: self.on_gateway("DELETED", stub(GATEWAY, key)),
            ),
            Target(
                KINDS[("v1", "Service")],
                lambda: dict(self.services),
                lambda key: self.on_service("DELETED", stub(KINDS[("v1", "Service")], key)),
                label_selector=c.LABEL_USE_WAYPOINT,
            ),
            Target(
                CONFIG_MAP,
                lambda: {
                    key: cm
                    for key, cm in self.config_maps.items()
                    if cm is not None
                    and _labels(cm).get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS
                },
                # The cached copy: its labels say whether it held the class defaults.
                lambda key: self.on_config_map(
                    "DELETED", self.config_maps.get(key) or stub(CONFIG_MAP, key)
                ),
                label_selector=f"{c.LABEL_DEFAULTS_FOR_CLASS}={c.ISTIO_WAYPOINT_CLASS}",
            ),
        ]
        owned_kinds = (KINDS[("apps/v1", "Deployment")], KINDS[("v1", "Service")], SERVICE_ACCOUNT)
        targets += [owned_target(kind) for kind in owned_kinds]
        return targets

    # -- start-up ----------------------------------------------------------------
    def _list_all(self) -> list[tuple[Callable[[str | None, Mapping[str, Any]], None], Any]]:
        """Everything the watches will keep current, listed once (runs in a thread)."""
        ours = f"{LABEL_CONTROLLER}={wr.CONTROLLER}"
        listings: list[tuple[Callable[[str | None, Mapping[str, Any]], None], Any]] = []
        for kind, selector, handler in (
            (GATEWAY_CLASS, None, self.on_gateway_class),
            (GATEWAY, None, self.on_gateway),
            (KINDS[("apps/v1", "Deployment")], ours, self.on_owned),
            (KINDS[("v1", "Service")], ours, self.on_owned),
            (SERVICE_ACCOUNT, ours, self.on_owned),
            (
                CONFIG_MAP,
                f"{c.LABEL_DEFAULTS_FOR_CLASS}={c.ISTIO_WAYPOINT_CLASS}",
                self.on_config_map,
            ),
            (KINDS[("v1", "Pod")], c.LABEL_GATEWAY_NAME, self.on_pod),
            (KINDS[("v1", "Service")], c.LABEL_USE_WAYPOINT, self.on_service),
        ):
            try:
                items = self.kube.list(kind, label_selector=selector)
            except KubeError as exc:
                if exc.status == 404:  # Gateway API not installed yet: nothing to know
                    continue
                raise
            listings.append((handler, items))
        return listings

    def _serves_gateway_api(self) -> bool:
        try:
            found = self.kube.request("GET", f"/apis/{c.GATEWAY_API_VERSION}")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == "gatewayclasses" for r in found.get("resources") or [])

    async def _check_gateway_api(self) -> bool:
        """Whether Gateway API is installed; without it there is nothing to do, quietly."""
        if self.gateway_api:
            return True
        now = time.monotonic()
        if now - self._api_checked < GATEWAY_API_RECHECK_SECONDS:
            return False
        self._api_checked = now
        self.gateway_api = await self._call(self._serves_gateway_api)
        if not self.gateway_api:
            self._retry_later("classes", GATEWAY_API_RECHECK_SECONDS)
            return False
        self.mark_all()
        return True

    async def prime(self) -> None:
        """Fill the caches before the first pass; the watches keep them current after."""
        for handler, items in await self._call(self._list_all):
            for obj in items:
                handler("ADDED", obj)
        self.primed = True
        self._poke()
