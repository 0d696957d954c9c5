"""The class reconcilers: our GatewayClass (objects and status) and istiod's
istio-waypoint class defaults; with the ConfigMaps they read and the prune
that the Gateways' reconcile (gateways.py) uses too."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import WaypointEvent
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.ownership import conflict
from ambient_operator.apply.plan import Owner, plan, prepare
from ambient_operator.apply.writer import NameConflictError, prune, write
from ambient_operator.controllers.waypoints.common import (
    CONFIG_MAP,
    RETRY_SECONDS,
    GatewayKey,
    _key,
    _labels,
    log,
)
from ambient_operator.controllers.waypoints.priming import WaypointPriming
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import key_of
from ambient_operator.render.waypoints.class_defaults import (
    CLASS_DEFAULTS_NAME,
    pin_class_defaults,
    render_class_defaults,
)
from ambient_operator.render.waypoints.names import CLASS_CONTROLLER, class_is_ours
from ambient_operator.render.waypoints.objects import render_gateway_class
from ambient_operator.render.waypoints.parameters import parameter_refs
from ambient_operator.render.waypoints.verdicts import class_verdict
from ambient_operator.status import waypoints as ws
from ambient_operator.status.writer import write_status


class WaypointClasses(WaypointPriming):
    """Keeps our GatewayClass and istiod's istio-waypoint class defaults."""

    # -- ConfigMaps ----------------------------------------------------------------
    async def _load_config_maps(self, targets: Iterable[GatewayKey], reader: str) -> None:
        targets = list(targets)
        self._set_reads(reader, targets)
        for target in targets:
            if target in self.config_maps:
                continue
            namespace, name = target
            obj = await self._call(self.kube.get, CONFIG_MAP, name, namespace)
            self.config_maps[target] = obj

    def _config_data(self) -> dict[GatewayKey, Mapping[str, Any] | None]:
        return {
            key: (obj.get("data") or {}) if obj is not None else None
            for key, obj in self.config_maps.items()
        }

    # -- GatewayClasses ----------------------------------------------------------------
    async def _reconcile_classes(self, mesh: dict[str, Any], spec: AmbientMeshSpec) -> None:
        owner = Owner.of(mesh)
        desired = prepare(render_gateway_class(spec), owner, CLASS_CONTROLLER)
        live = {
            key_of(obj): obj
            for obj in self.classes.values()
            if _labels(obj).get(LABEL_CONTROLLER) == CLASS_CONTROLLER
            and conflict(obj, owner) is None
        }
        todo = plan([desired], live)
        failed = False
        for obj in todo.apply:
            name = obj["metadata"]["name"]
            try:
                result = await self._call(write, self.kube, obj, self.classes.get(name), owner)
            except (KubeError, NameConflictError) as exc:
                failed = True
                reason = (
                    WaypointEvent.NAME_CONFLICT
                    if isinstance(exc, NameConflictError)
                    else WaypointEvent.GATEWAY_CLASS_NOT_APPLIED
                )
                log.warning("GatewayClass %s: %s", name, exc)
                await self._call(
                    self.events.post,
                    mesh,
                    "Warning",
                    reason,
                    f"GatewayClass {name}: {exc.message}",
                )
                self._retry_later("classes", RETRY_SECONDS[-1])
                continue
            self.on_gateway_class("MODIFIED", result)
            metrics.OBJECTS_APPLIED.labels(kind="GatewayClass").inc()
        if not failed:
            for obj in todo.prune:
                await self._prune(obj, owner, None)
        now = self.clock()
        for name, gateway_class in sorted(self.classes.items()):
            if not class_is_ours(gateway_class, spec.waypoints.controller_name):
                continue
            refs = parameter_refs({}, gateway_class, spec.namespace)
            await self._load_config_maps(refs, f"class:{name}")
            verdict = class_verdict(gateway_class, self._config_data(), spec.namespace)
            desired_status = ws.class_status(gateway_class, verdict, now)
            if not ws.class_status_changed(desired_status, gateway_class.get("status")):
                continue
            try:
                wrote = await self._call(
                    write_status, self.kube, gateway_class, desired_status, precondition=True
                )
            except KubeError as exc:
                log.info("GatewayClass %s status: %s", name, exc)
                self._retry_later("classes", RETRY_SECONDS[0])
                continue
            if not wrote.written:
                # Our copy was old (or the class is gone); the newer one is on its way.
                log.info("GatewayClass %s status: changed meanwhile", name)
                self._retry_later("classes", RETRY_SECONDS[0])
                continue
            assert wrote.live is not None
            self.on_gateway_class("MODIFIED", wrote.live)

    # -- istiod's istio-waypoint class defaults ------------------------------------------
    async def _reconcile_class_defaults(self, spec: AmbientMeshSpec, windows: bool) -> None:
        """Pin istio-waypoint waypoints to Linux through istiod's per-class defaults.

        Only while Windows nodes exist; once written the pin stays (it is
        harmless on Linux-only clusters and removing it on a node flap would
        churn every istio-waypoint Deployment).
        """
        if not windows:
            return
        if spec.namespace not in self.state.namespaces:
            self._awaiting_namespace = spec.namespace  # istiod is not installed yet
            return
        self._awaiting_namespace = None
        targets = [
            obj
            for key, obj in sorted(self.config_maps.items())
            if obj is not None
            and key[0] == spec.namespace
            and _labels(obj).get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS
        ]
        if not targets:
            # The watch may not have listed them yet (start-up): ask, so a
            # user's own defaults ConfigMap is merged into, never doubled.
            selector = f"{c.LABEL_DEFAULTS_FOR_CLASS}={c.ISTIO_WAYPOINT_CLASS}"
            targets = await self._call(self.kube.list, CONFIG_MAP, spec.namespace, selector)
            for found in targets:
                self.on_config_map("MODIFIED", found)
        if not targets:
            existing = await self._call(
                self.kube.get, CONFIG_MAP, CLASS_DEFAULTS_NAME, spec.namespace
            )
            targets = [
                existing or {"metadata": {"name": CLASS_DEFAULTS_NAME, "namespace": spec.namespace}}
            ]
        for cm in targets:
            meta = cm["metadata"]
            text = (cm.get("data") or {}).get("deployment")
            merged, problem = pin_class_defaults(text)
            if problem:
                await self._call(
                    self.events.post,
                    cm | {"apiVersion": "v1", "kind": "ConfigMap"},
                    "Warning",
                    WaypointEvent.CLASS_DEFAULTS_UNREADABLE,
                    f"{problem}; istio-waypoint waypoints are not pinned to Linux and may "
                    "land on Windows nodes",
                )
                continue
            labelled = _labels(cm).get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS
            if merged is None and labelled:
                continue
            obj = render_class_defaults(
                meta["name"], meta["namespace"], merged if merged is not None else text or ""
            )
            # The stand-in for a ConfigMap that does not exist has no uid.
            live = cm if meta.get("uid") else None
            try:
                result = await self._call(write, self.kube, obj, live, None)
            except NameConflictError as exc:
                # Someone else's (Helm's, say, from istiod's gatewayClasses
                # value): its owner must add the pin; an edit of ours would
                # be theirs to fight.
                await self._call(
                    self.events.post,
                    cm | {"apiVersion": "v1", "kind": "ConfigMap"},
                    "Warning",
                    WaypointEvent.CLASS_DEFAULTS_NOT_PINNED,
                    f"{exc.message}; istiod reads its istio-waypoint deployment overlay from "
                    f"here and the operator changes only ConfigMaps it created. Add nodeSelector "
                    f"{c.LABEL_OS}: linux under spec.template.spec of its deployment key, or "
                    "istio-waypoint waypoints may land on Windows nodes",
                )
                continue
            except KubeError as exc:
                log.warning("istio-waypoint class defaults: %s", exc)
                self._retry_later("defaults", RETRY_SECONDS[-2])
                continue
            self.on_config_map("MODIFIED", result)
            metrics.OBJECTS_APPLIED.labels(kind="ConfigMap").inc()
            log.info("pinned istio-waypoint waypoints to Linux in %s/%s", *_key(result))

    # -- deleting (GatewayClasses here, Gateways' objects in gateways.py) ----------
    async def _prune(
        self, obj: Mapping[str, Any], owner: Owner | None, namespace: str | None
    ) -> bool:
        """Delete `obj` if writer.prune finds it ours; False only when a delete failed.

        `namespace` is the one the owner writes to (None for cluster-scoped).
        """
        scope = None if namespace is None else {namespace}
        try:
            deleted = await self._call(prune, self.kube, obj, owner, scope)
        except KubeError as exc:
            log.warning("delete %s %s: %s", obj.get("kind"), obj["metadata"]["name"], exc)
            return False
        if deleted:
            self.forget_pruned(obj)
            metrics.OBJECTS_PRUNED.labels(kind=str(obj.get("kind"))).inc()
        return True
