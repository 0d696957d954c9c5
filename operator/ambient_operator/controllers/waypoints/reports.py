"""The reporters: Warning Events for waypoint pods on Windows nodes and for
Services whose istio.io/use-waypoint names no waypoint. They write no object."""

from __future__ import annotations

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import WaypointEvent
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.enrollment import namespace_problems
from ambient_operator.cluster.facts import node_os
from ambient_operator.controllers.waypoints.gateways import WaypointGateways
from ambient_operator.render.waypoints.listeners import is_waypoint
from ambient_operator.render.waypoints.names import class_is_ours


class WaypointReports(WaypointGateways):
    """Says, in Events, what keeps a waypoint from working."""

    # -- reports ------------------------------------------------------------------
    async def _check_pods(self, spec: AmbientMeshSpec) -> None:
        """A waypoint pod on a Windows node cannot run Envoy: say so on its Gateway."""
        for key in sorted(self.pods_unchecked):
            gateway_name, node = self.pods.get(key, ("", ""))
            os_name = node_os(self.state.nodes.get(node))
            gateway = self.gateways.get((key[0], gateway_name))
            if os_name is None:
                continue  # its node is not listed yet
            self.pods_unchecked.discard(key)
            if gateway is None:
                continue  # judged again if its Gateway appears
            if os_name != "windows":
                continue
            gateway_class = self.classes.get(
                str((gateway.get("spec") or {}).get("gatewayClassName"))
            )
            if not (
                is_waypoint(gateway) or class_is_ours(gateway_class, spec.waypoints.controller_name)
            ):
                continue
            await self._call(
                self.events.post,
                gateway,
                "Warning",
                WaypointEvent.WAYPOINT_ON_WINDOWS,
                f"waypoint pod {key[1]} runs on Windows node {node}; Envoy has no Windows "
                "build, so this waypoint cannot serve traffic. Pin it to Linux (nodeSelector "
                f"{c.LABEL_OS}: linux), or use class {spec.waypoints.class_name}",
            )

    async def _check_services(self) -> None:
        """Services whose istio.io/use-waypoint names no waypoint get a Warning Event."""
        waypoints = {key: is_waypoint(gw) for key, gw in self.gateways.items()}
        for (namespace, _), service in sorted(self.services.items()):
            for reason, message in namespace_problems(
                namespace, service["labels"], waypoints, enrollment=False
            ):
                await self._call(self.events.post, service, "Warning", reason, message)
