"""This controller's rows of the watch table (cluster/watches.py), and whether the
API server serves Gateway API at all."""

from __future__ import annotations

import time
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.cluster.watches import Watched
from ambient_operator.controllers.waypoints.cache import WaypointCache
from ambient_operator.controllers.waypoints.common import (
    AUTOSCALER,
    CONFIG_MAP,
    DISRUPTION_BUDGET,
    GATEWAY,
    GATEWAY_API_RECHECK_SECONDS,
    GATEWAY_CLASS,
    SERVICE_ACCOUNT,
    GatewayKey,
    _labels,
)
from ambient_operator.kube.resources import KINDS, Kind
from ambient_operator.render.waypoints.names import CONTROLLER


class WaypointPriming(WaypointCache):
    """This controller's rows of the watch table, and whether Gateway API is served."""

    def watches(self) -> list[Watched]:
        """The caches of this controller as rows of cluster/watches.py's table.

        The app layer lists and watches them with the rows of the cluster
        state; `mark_primed` is called once they are listed.
        """
        ours: dict[str, str | None] = {LABEL_CONTROLLER: CONTROLLER}
        service = KINDS[("v1", "Service")]

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

        def owned_row(kind: Kind) -> Watched:
            def forget(key: GatewayKey) -> None:
                obj = owned(kind).get(key)
                if obj is not None:
                    self.on_owned("DELETED", obj)

            return Watched(
                f"waypoints-owned-{kind.plural}",
                kind,
                self.on_owned,
                labels=ours,
                cached=lambda: owned(kind),
                forget=forget,
                # A new Gateway's names are known free or taken without a GET.
                every_name=True,
            )

        def class_defaults() -> dict[GatewayKey, dict[str, Any]]:
            return {
                key: cm
                for key, cm in self.config_maps.items()
                if cm is not None
                and _labels(cm).get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS
            }

        return [
            Watched(
                "waypoints-gatewayclasses",
                GATEWAY_CLASS,
                self.on_gateway_class,
                cached=lambda: {("", name): cls for name, cls in self.classes.items()},
                forget=lambda key: self.on_gateway_class("DELETED", stub(GATEWAY_CLASS, key)),
            ),
            Watched(
                "waypoints-gateways",
                GATEWAY,
                self.on_gateway,
                cached=lambda: dict(self.gateways),
                forget=lambda key: self.on_gateway("DELETED", stub(GATEWAY, key)),
            ),
            *(owned_row(kind) for kind in (KINDS[("apps/v1", "Deployment")], service)),
            owned_row(SERVICE_ACCOUNT),
            # Asked for by the parameters' horizontalPodAutoscaler and
            # podDisruptionBudget keys; watched so that a removed key prunes them.
            owned_row(AUTOSCALER),
            owned_row(DISRUPTION_BUDGET),
            Watched(
                "waypoints-configmaps",
                CONFIG_MAP,
                self.on_config_map,
                # Class defaults, and whatever a Gateway's parametersRef names (only
                # those are kept; the rest of the cluster's ConfigMaps never are).
                when=self.wants_config_map,
                cached=class_defaults,
                # The cached copy: its labels say whether it held the class defaults.
                forget=lambda key: self.on_config_map(
                    "DELETED", self.config_maps.get(key) or stub(CONFIG_MAP, key)
                ),
            ),
            # Pods reach `place_pod` from the operator's pod informer (cluster/pods.py).
            # Every Service is watched, to see istio.io/use-waypoint being removed;
            # only those carrying it are kept.
            Watched(
                "waypoints-services",
                service,
                self.on_service,
                cached=lambda: dict(self.services),
                forget=lambda key: self.on_service("DELETED", stub(service, key)),
            ),
        ]

    async def _check_gateway_api(self) -> bool:
        """Whether Gateway API is installed; without it there is nothing to do, quietly."""
        if self.gateway_api:
            return True
        now = time.monotonic()
        if now - self._api_checked < GATEWAY_API_RECHECK_SECONDS:
            return False
        self._api_checked = now
        self.gateway_api = await self._call(self.kube.serves, GATEWAY_CLASS)
        if not self.gateway_api:
            self._retry_later("classes", GATEWAY_API_RECHECK_SECONDS)
            return False
        self.mark_all()
        return True

    def mark_primed(self) -> None:
        """The rows are listed: passes may begin (none before, see WaypointCache)."""
        self.primed = True
        self._poke()
