"""One Gateway's reconcile: render its waypoint, write its objects all or nothing,
prune what it no longer needs, and write its status."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import metrics
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.ownership import applies_field, conflict
from ambient_operator.apply.plan import Owner, plan, prepare
from ambient_operator.apply.writer import NameConflictError, hand_over, write
from ambient_operator.cluster.revisions import (
    RevisionChoice,
    waypoint_revision,
    with_revision,
)
from ambient_operator.controllers.waypoints.classes import WaypointClasses
from ambient_operator.controllers.waypoints.common import (
    GATEWAY,
    NAMESPACE,
    SERVICE_ACCOUNT,
    STATUS_ATTEMPTS,
    GatewayKey,
    log,
)
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import ObjectKey, cached_copy, key_of, kind_of
from ambient_operator.render.waypoints.names import (
    CONTROLLER,
    Names,
    class_is_ours,
    names_of,
    service_account_problem,
)
from ambient_operator.render.waypoints.parameters import parameter_refs, refusal
from ambient_operator.render.waypoints.verdicts import WaypointRender, render_waypoint
from ambient_operator.status import waypoints as ws
from ambient_operator.status.writer import write_status


class WaypointGateways(WaypointClasses):
    """Deploys each Gateway of our class and reports on it in its status."""

    # -- one Gateway ------------------------------------------------------------------
    async def _foreign_service_account(
        self, key: GatewayKey, gateway: Mapping[str, Any], owner: Owner, names: Names
    ) -> dict[str, Any] | None:
        """The ServiceAccount named by annotation, when it exists and is not the Gateway's own.

        Such an account may carry a cloud identity or RBAC of its own: the
        policy decides whether the waypoint may run as it, and it is never
        written (an owner reference would delete it with the Gateway).
        Without the annotation the account is the Gateway's own, as upstream.
        """
        if not names.named_account:
            return None
        if service_account_problem(names):
            return None  # render refuses the name; it must not reach an API path
        name = names.service_account
        cached = self.objects.get(key, {}).get(("v1", "ServiceAccount", key[0], name))
        if cached is not None and conflict(cached, owner) is None:
            return None
        live = await self._call(self.kube.get, SERVICE_ACCOUNT, name, key[0])
        if live is None or conflict(live, owner) is None:
            return None
        return live

    async def _reconcile_gateway(self, spec: AmbientMeshSpec, key: GatewayKey) -> bool:
        """Objects and status of one Gateway; False when something must be retried."""
        gateway = self.gateways.get(key)
        if gateway is None or gateway["metadata"].get("deletionTimestamp"):
            return True  # garbage collection removes what the Gateway owned
        if key in self.vanished and not await self._still_there(key, gateway):
            return True
        namespace = self.state.namespaces.get(key[0])
        # Nothing can be created in a namespace that is going or gone: a write
        # (say, restoring the ServiceAccount the namespace controller just
        # deleted) is refused, again on every retry. A Gateway can outlive its
        # namespace when that controller fails (seen in the suite: 404 on every
        # write for minutes), so one the cache does not know is looked up; a
        # namespace made a moment before its Gateway is one too (its event is
        # still behind the Gateway's), so the lookup goes alongside the reads
        # below, not before them.
        if namespace is not None and namespace.get("terminating"):
            return True
        lookup = (
            asyncio.ensure_future(self._call(self.kube.get, NAMESPACE, key[0]))
            if namespace is None
            else None
        )
        try:
            return await self._reconcile_in(spec, key, gateway, lookup)
        finally:
            if lookup is not None and not lookup.done():
                lookup.cancel()

    async def _still_there(self, key: GatewayKey, gateway: Mapping[str, Any]) -> bool:
        """Whether a Gateway whose objects went away still exists, asked of the API server.

        Its objects go when it is deleted, and the watches are separate
        streams: their deletions can come before the Gateway's own (and after
        a relist, each kind is listed when its watch expires). Put back from
        a cache that has not seen the Gateway go, they would be orphans for
        the garbage collector, made by us (seen in tests/test_chaos_compaction.py).
        """
        live = await self._call(self.kube.get, GATEWAY, key[1], key[0])
        self.vanished.discard(key)
        if live is not None and live["metadata"].get("uid") == gateway["metadata"].get("uid"):
            return True
        metrics.forgotten_ghost("Gateway", "/".join(key))  # as a list would (app/watches.py)
        self.on_gateway("DELETED", gateway)
        return False

    @staticmethod
    async def _namespace_usable(lookup: asyncio.Future[dict[str, Any] | None] | None) -> bool:
        """Whether the looked-up namespace exists and is not being deleted."""
        if lookup is None:
            return True
        live = await lookup
        return live is not None and not live["metadata"].get("deletionTimestamp")

    async def _reconcile_in(
        self,
        spec: AmbientMeshSpec,
        key: GatewayKey,
        gateway: dict[str, Any],
        lookup: asyncio.Future[dict[str, Any] | None] | None,
    ) -> bool:
        owner = Owner.of(gateway)
        # What this Gateway controls: an object that merely carries our labels
        # is neither updated, pruned nor read for status.
        owned = self._owned(key, owner)
        gateway_class = self.classes.get(str((gateway.get("spec") or {}).get("gatewayClassName")))
        if not class_is_ours(gateway_class, spec.waypoints.controller_name):
            if not await self._namespace_usable(lookup):
                return True
            ok = True
            for obj in owned.values():
                ok = await self._prune(obj, owner, key[0]) and ok
            return ok
        await self._load_config_maps(
            parameter_refs(gateway, gateway_class, spec.namespace), f"gw:{key[0]}/{key[1]}"
        )
        names = names_of(gateway)
        foreign = await self._foreign_service_account(key, gateway, owner, names)
        revision = self.revision_of(spec, gateway)
        result = render_waypoint(
            with_revision(spec, revision),
            gateway,
            gateway_class,
            self._config_data(),
            foreign_service_account=foreign,
        )
        errors: list[str] = []
        conflicts: list[str] = []
        if result.accepted.status != "True" and not await self._namespace_usable(lookup):
            return True
        if result.accepted.status == "True":
            prepared = [prepare(obj, owner, CONTROLLER) for obj in result.objects]
            todo = plan(prepared, owned)
            current, usable = await asyncio.gather(
                self._current(todo.apply, owned, owner, conflicts, errors),
                self._namespace_usable(lookup),
            )
            if not usable:
                return True  # gone or going; its Gateways go with it, nothing to retry
            # All or nothing: a waypoint short of one object serves nobody, and
            # the others would sit under names somebody else may want back.
            if not (conflicts or errors):
                await self._release_replicas(todo.apply, current, owner, errors)
            if not (conflicts or errors):
                await self._write_all(todo.apply, current, owner, conflicts, errors)
            if not (conflicts or errors):
                for obj in todo.prune:
                    if not await self._prune(obj, owner, key[0]):
                        errors.append(f"could not delete {obj['kind']} {obj['metadata']['name']}")
        for reason, message in result.warnings:
            await self._call(self.events.post, gateway, "Warning", reason, message)
        ok = await self._write_status(
            spec, key, result, "; ".join(errors) or None, "; ".join(conflicts) or None
        )
        # A conflict is retried with backoff too: the name may be freed.
        return ok and not errors and not conflicts

    def revision_of(self, spec: AmbientMeshSpec, gateway: Mapping[str, Any]) -> RevisionChoice:
        """The istiod revision a Gateway's waypoint talks to (cluster/revisions.py)."""
        meta = gateway.get("metadata") or {}
        namespace = self.state.namespaces.get(str(meta.get("namespace"))) or {}
        return waypoint_revision(
            meta.get("labels") or {},
            namespace.get("labels") or {},
            spec.istiod.revision,
            self.tags,
        )

    def _owned(self, key: GatewayKey, owner: Owner) -> dict[ObjectKey, dict[str, Any]]:
        return {
            okey: obj
            for okey, obj in self.objects.get(key, {}).items()
            if conflict(obj, owner) is None
        }

    async def _current(
        self,
        objects: Iterable[Mapping[str, Any]],
        owned: Mapping[ObjectKey, dict[str, Any]],
        owner: Owner,
        conflicts: list[str],
        errors: list[str],
    ) -> dict[ObjectKey, dict[str, Any] | None]:
        """What the API server holds under each name we are about to write.

        Our caches keep only objects with our labels, but the informers of
        these kinds see every object (`every_name` in priming.py): when none
        of the names outside this Gateway's own is taken, nothing is asked
        and a new waypoint's first write is its first request; the POST
        refuses a name taken since (apply/writer.write). Otherwise every such
        name is asked for, so the status names each conflict, not the first.
        """
        current: dict[ObjectKey, dict[str, Any] | None] = {}
        others = [obj for obj in objects if key_of(obj) not in owned]
        if all(self.seen(kind_of(dict(obj)), key_of(obj)[2:]) is False for obj in others):
            return {key_of(obj): owned.get(key_of(obj)) for obj in objects}

        async def one(obj: Mapping[str, Any]) -> None:
            okey = key_of(obj)
            live = owned.get(okey)
            if live is None:
                meta = obj["metadata"]
                try:
                    live = await self._call(
                        self.kube.get, kind_of(dict(obj)), meta["name"], meta.get("namespace")
                    )
                except KubeError as exc:
                    errors.append(f"{obj['kind']} {meta['name']}: {exc.message}")
                    return
            why = conflict(live, owner)
            if why is not None:
                conflicts.append(why)
            current[okey] = live

        # Asked together: one round trip before a new waypoint's first write, not three.
        await asyncio.gather(*(one(obj) for obj in objects))
        return current

    async def _release_replicas(
        self,
        objects: Iterable[Mapping[str, Any]],
        current: dict[ObjectKey, dict[str, Any] | None],
        owner: Owner,
        errors: list[str],
    ) -> None:
        """Before a Deployment's replicas are left to its autoscaler, hand them over.

        Dropped from our apply while we alone hold them, they would be reset to 1.
        """
        for obj in objects:
            if obj["kind"] != "Deployment" or "replicas" in (obj.get("spec") or {}):
                continue
            okey = key_of(obj)
            live = current.get(okey)
            if live is None or not applies_field(live, ("spec", "replicas")):
                continue
            held = {"spec": {"replicas": (live.get("spec") or {}).get("replicas", 1)}}
            try:
                current[okey] = await self._call(hand_over, self.kube, live, owner, held)
            except (KubeError, NameConflictError) as exc:
                errors.append(f"Deployment {obj['metadata']['name']}: {exc.message}")

    async def _write_all(
        self,
        objects: list[dict[str, Any]],
        current: Mapping[ObjectKey, dict[str, Any] | None],
        owner: Owner,
        conflicts: list[str],
        errors: list[str],
    ) -> None:
        async def one(obj: dict[str, Any]) -> None:
            was = current.get(key_of(obj))
            try:
                live = await self._call(write, self.kube, obj, was, owner)
            except NameConflictError as exc:
                conflicts.append(exc.message)  # taken meanwhile; nothing was written
                return
            except KubeError as exc:
                log.warning("%s %s/%s: %s", obj["kind"], *key_of(obj)[2:], exc)
                errors.append(refusal(obj, exc.status, exc.message))
                return
            self.on_owned("MODIFIED", live)
            metrics.OBJECTS_APPLIED.labels(kind=obj["kind"]).inc()

        # The ServiceAccount first: a pod naming a missing one is refused,
        # and the ReplicaSet controller backs off. The rest go together,
        # unless its name turned out taken (nothing else is written then).
        for obj in (o for o in objects if o["kind"] == "ServiceAccount"):
            await one(obj)
        if conflicts or errors:
            return
        await asyncio.gather(*(one(o) for o in objects if o["kind"] != "ServiceAccount"))

    def _live(self, key: GatewayKey, kind: str, name: str, owner: Owner) -> dict[str, Any] | None:
        api = "apps/v1" if kind == "Deployment" else "v1"
        obj = self.objects.get(key, {}).get((api, kind, key[0], name))
        # Another party's Service must never lend the Gateway its address.
        return obj if obj is not None and conflict(obj, owner) is None else None

    async def _write_status(
        self,
        spec: AmbientMeshSpec,
        key: GatewayKey,
        result: WaypointRender,
        error: str | None,
        name_conflict: str | None = None,
    ) -> bool:
        for _ in range(STATUS_ATTEMPTS):
            gateway = self.gateways.get(key)
            if gateway is None:
                return True
            owner = Owner.of(gateway)
            deployment = self._live(key, "Deployment", result.names.deployment, owner)
            service = self._live(key, "Service", result.names.service, owner)
            replicas = result.replicas
            if result.autoscaled and deployment is not None:
                # The autoscaler's count, not one we asked for.
                replicas = int((deployment.get("spec") or {}).get("replicas", replicas))
            programmed = ws.programmed_verdict(
                result.accepted, replicas, deployment, service, error, name_conflict
            )
            desired = ws.gateway_status(
                gateway,
                result.accepted,
                programmed,
                result.listeners,
                service,
                spec.cluster_domain,
                self.clock(),
            )
            if not ws.gateway_status_changed(desired, gateway.get("status")):
                return True
            try:
                # A precondition: addresses are kept from what we last saw, so
                # a stale copy must not overwrite newer ones.
                wrote = await self._call(
                    write_status, self.kube, gateway, desired, precondition=True
                )
            except KubeError as exc:
                log.warning("Gateway %s/%s status: %s", *key, exc)
                return False
            if not wrote.written:
                fresh = wrote.live
                if fresh is None:
                    return True  # deleted meanwhile
                self.gateways[key] = cached_copy(fresh)
                if (fresh.get("metadata") or {}).get("generation") != gateway["metadata"].get(
                    "generation"
                ):
                    self.dirty.add(key)  # the spec changed too: render again
                    self._poke()
                    return True
                continue
            assert wrote.live is not None
            self.gateways[key] = cached_copy(wrote.live)
            return True
        return False
