"""The waypoint controller: its loop's timing, the pass, and the steps of a pass.

The operator's loop calls `reconcile()` too; a lock keeps the two from
running a pass at the same time. What each step does is in the modules
below this one (see the package's docstring).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import metrics
from ambient_operator.api.conditions import ErrorReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.revisions import revision_inputs, revision_tags
from ambient_operator.controllers.waypoints.common import (
    CONCURRENCY,
    METRICS_NAME,
    RETRY_SECONDS,
    GatewayKey,
    log,
)
from ambient_operator.controllers.waypoints.reports import WaypointReports
from ambient_operator.runtime.loop import ReconcileLoop, Timing

# A burst of events within 100 ms of each other is one pass, and no change
# waits longer than 1 s. A change to a loop that made few passes lately is
# handled at once, without waiting for companions, and so is a new, changed or
# deleted Gateway however busy the loop (keyed: see runtime/pacing.py and
# cache.py); passes are incremental, so a burst costs little more and needs no
# spacing out.
IDLE_DEBOUNCE_SECONDS = 0.0
TIMING = Timing(
    debounce=0.1,
    idle_debounce=IDLE_DEBOUNCE_SECONDS,
    max_delay=1.0,
    status_delay=1.0,
    space_out=False,
    retry=RETRY_SECONDS[0],
)


class WaypointController(WaypointReports):
    """Deploys Gateways of our class, keeps our GatewayClass and istiod's class defaults."""

    def loop(self, leading: Callable[[], bool]) -> ReconcileLoop:
        """The waypoints' own loop: a pass soon after each change, while `leading()`."""
        return ReconcileLoop("waypoints", self, self.reconcile, leading, TIMING)

    async def reconcile(self) -> None:
        """Reconcile what changed since the last pass; with nothing changed, no request."""
        async with self._lock:
            await self._pass()

    async def _pass(self) -> None:
        if not self.primed:
            return
        mesh = self.state.mesh
        if mesh is None or (mesh.get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            spec = AmbientMeshSpec.model_validate(mesh.get("spec") or {})
        except ValidationError:
            return  # the data-plane controller reports InvalidSpec on the AmbientMesh
        if spec.namespace == self.state.refused_namespace or spec.namespace not in (
            self.state.namespaces
        ):
            # A spec.namespace that does not exist (a typo) or that the operator
            # may not write to changes nothing: waypoints keep the istiod
            # address they have, and no class defaults go there. The
            # data-plane controller reports why on the AmbientMesh; what is
            # marked dirty stays so, for the pass after the namespace appears.
            return
        seen = (mesh["metadata"].get("uid"), spec)
        if seen != self._spec_seen:
            self._spec_seen = seen
            self.mark_all()
        if time.monotonic() - self._last_full >= self.resync_seconds:
            self._last_full = time.monotonic()
            self.mark_all()
        if self.revisions_moved():
            self.mark_all()
        windows = self.state.tally.nodes_of("windows") > 0
        if windows != self._windows_seen:
            self._windows_seen = windows
            self.defaults_dirty = True
        if self._awaiting_namespace and self._awaiting_namespace in self.state.namespaces:
            self.defaults_dirty = True
        if not (
            self.dirty
            or self.classes_dirty
            or self.defaults_dirty
            or self.services_dirty
            or self.pods_unchecked
        ):
            return
        started = time.monotonic()
        metrics.RECONCILES.labels(controller=METRICS_NAME).inc()
        try:
            if not await self._check_gateway_api():
                return
            if self.classes_dirty:
                self.classes_dirty = False
                await self._step("classes", self._reconcile_classes(mesh, spec))
            if self.defaults_dirty:
                self.defaults_dirty = False
                await self._step("defaults", self._reconcile_class_defaults(spec, windows))
            if self.dirty:
                batch, self.dirty = sorted(self.dirty), set()
                gate = asyncio.Semaphore(CONCURRENCY)
                await asyncio.gather(*(self._guarded(gate, spec, key) for key in batch))
            if self.pods_unchecked:
                await self._check_pods(spec)
            if self.services_dirty:
                self.services_dirty = False
                await self._check_services()
        finally:
            metrics.RECONCILE_SECONDS.labels(controller=METRICS_NAME).observe(
                time.monotonic() - started
            )

    def revisions_moved(self) -> bool:
        """Whether a tag or a namespace's istio.io/rev moved since the last call: any
        waypoint may talk to another istiod now (cluster/revisions.py).

        The watches count those changes (ClusterState.revision_changes); while
        the count stands the inputs do too, so a pass under churn does not walk
        every namespace.
        """
        if self.state.revision_changes == self._revision_count:
            return False
        self._revision_count = self.state.revision_changes
        self.tags = revision_tags(self.state.revision_tags.values())
        revisions = revision_inputs(self.tags, self.state.namespaces)
        if revisions == self._revisions_seen:
            return False
        self._revisions_seen = revisions
        return True

    async def _step(self, what: str, work: Coroutine[Any, Any, None]) -> None:
        """Run the class or class-defaults step; a failure is retried later, not lost."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("waypoints: %s step failed", what)
            metrics.RECONCILE_ERRORS.labels(
                controller=METRICS_NAME, reason=ErrorReason.EXCEPTION
            ).inc()
            self._retry_later(what, RETRY_SECONDS[1])

    async def _guarded(
        self, gate: asyncio.Semaphore, spec: AmbientMeshSpec, key: GatewayKey
    ) -> None:
        async with gate:
            try:
                ok = await self._reconcile_gateway(spec, key)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("waypoint %s/%s: reconcile failed", *key)
                metrics.RECONCILE_ERRORS.labels(
                    controller=METRICS_NAME, reason=ErrorReason.EXCEPTION
                ).inc()
                ok = False
        if ok:
            self._failures.pop(key, None)
            return
        # Retry with backoff; a watch event may well come sooner.
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
        asyncio.get_running_loop().call_later(delay, self._retry, key)
