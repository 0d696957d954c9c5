"""Waypoints from Gateway API resources: watches feed caches, one pass reconciles.

Thin on purpose: render.py decides, apply/writer.py writes (and only what is ours),
status/components.py judges. This module keeps the caches the watches fill, knows which
Gateways changed since the last pass (only those are reconciled), and talks
to the API server.

Handlers are coroutines so they run on the event loop, like the reconcile
that reads what they write; nothing here is touched from a thread.

The operator's loop calls `reconcile()` (and so resyncs it), but a Gateway
should not wait for the data plane: under churn that loop spaces its passes
out by seconds, since a data-plane pass renders everything. A waypoint pass
only touches what changed, so the controller also runs its own short loop,
woken by its own watches, debounced by a fraction of a second. A lock keeps
the two from running a pass at the same time.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import ErrorReason, WaypointEvent
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.ownership import conflict
from ambient_operator.apply.plan import Owner, plan, prepare
from ambient_operator.apply.writer import NameConflictError, prune, write
from ambient_operator.cluster.enrollment import namespace_problems
from ambient_operator.cluster.facts import node_os
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import (
    KINDS,
    Kind,
    ObjectKey,
    key_of,
    kind_of,
    resource_version,
)
from ambient_operator.kube.sweep import Target
from ambient_operator.render import waypoints as wr
from ambient_operator.runtime.pacing import Pacer
from ambient_operator.status import waypoints as ws
from ambient_operator.status.events import EventRecorder, now_rfc3339
from ambient_operator.status.writer import write_status

log = logging.getLogger(__name__)
METRICS_NAME = "waypoints"
GATEWAY = KINDS[(c.GATEWAY_API_VERSION, "Gateway")]
GATEWAY_CLASS = KINDS[(c.GATEWAY_API_VERSION, "GatewayClass")]
CONFIG_MAP = KINDS[("v1", "ConfigMap")]
SERVICE_ACCOUNT = KINDS[("v1", "ServiceAccount")]
NAMESPACE = KINDS[("v1", "Namespace")]
# Gateways reconciled at once; each makes a few API calls from a thread.
CONCURRENCY = 16
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
STATUS_ATTEMPTS = 3
GATEWAY_API_RECHECK_SECONDS = 30.0
# The own loop: a burst of events within DEBOUNCE of each other is one pass,
# and no change waits longer than MAX_DELAY.
DEBOUNCE_SECONDS = 0.1
MAX_DELAY_SECONDS = 1.0
# A change to a loop that made few passes lately is handled at once (only
# events delivered together fold; see runtime/pacing.py); passes are incremental, so
# a burst costs little more.
IDLE_DEBOUNCE_SECONDS = 0.005

GatewayKey = tuple[str, str]
T = TypeVar("T")


def placement_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(Gateway name, node) of a scheduled Gateway pod (any class), else None. Pure."""
    gateway = ((pod.get("metadata") or {}).get("labels") or {}).get(c.LABEL_GATEWAY_NAME)
    node = (pod.get("spec") or {}).get("nodeName")
    return (str(gateway), str(node)) if gateway and node else None


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _key(obj: Mapping[str, Any]) -> GatewayKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class WaypointController:
    """Deploys Gateways of our class, keeps our GatewayClass and istiod's class defaults."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        events: EventRecorder,
        *,
        resync_seconds: float = 300.0,
        clock: Callable[[], str] = now_rfc3339,
    ) -> None:
        self.state = state
        self.kube = kube
        self.events = events
        self.resync_seconds = resync_seconds
        self.clock = clock
        self.gateways: dict[GatewayKey, dict[str, Any]] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        # Our objects per Gateway (namespace, gateway-name label).
        self.objects: dict[GatewayKey, dict[ObjectKey, dict[str, Any]]] = {}
        # ConfigMaps we read: parametersRef targets and istio-waypoint defaults;
        # None records one known not to exist.
        self.config_maps: dict[GatewayKey, dict[str, Any] | None] = {}
        # Which Gateways (or "class:<name>") read each ConfigMap.
        self.readers: dict[GatewayKey, set[str]] = {}
        self.pods: dict[GatewayKey, tuple[str, str]] = {}
        self.services: dict[GatewayKey, dict[str, Any]] = {}
        self.dirty: set[GatewayKey] = set()
        self.classes_dirty = True
        self.defaults_dirty = True
        self.services_dirty = False
        self.pods_unchecked: set[GatewayKey] = set()
        self._spec_seen: Any = None
        self._windows_seen: bool | None = None
        self._last_full = time.monotonic()
        self._failures: dict[GatewayKey, int] = {}
        self._awaiting_namespace: str | None = None
        # No pass before the caches hold what exists: a pass over half-loaded
        # caches would re-apply objects it has not seen yet.
        self.primed = False
        self.wake = asyncio.Event()
        self._lock = asyncio.Lock()
        # Whether the API server serves Gateway API; asked again until it does.
        self.gateway_api = False
        self._api_checked = -GATEWAY_API_RECHECK_SECONDS
        # API calls block; a pool of our own lets a burst of Gateways use as
        # many connections as CONCURRENCY, whatever the default pool's size.
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="waypoints")

    def close(self) -> None:
        """Let the API-call threads go (at shutdown)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    # -- watch events (called on the event loop) ---------------------------------
    def _poke(self) -> None:
        self.wake.set()

    def on_gateway(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A Gateway was listed, changed or deleted."""
        self.gateway_api = True
        key = _key(body)
        if event == "DELETED":
            if self.gateways.pop(key, None) is not None:
                self._drop_reader(f"gw:{key[0]}/{key[1]}")
                self.dirty.discard(key)
                self.services_dirty = True
                self._poke()
            return
        old = self.gateways.get(key)
        if old is not None and resource_version(old) >= resource_version(body):
            return  # our own write came back, or an event older than an apply response
        self.gateways[key] = copy.deepcopy(dict(body))
        if old is None:
            self.services_dirty = True
            # Pods seen before their Gateway are judged now.
            self.pods_unchecked |= {
                pod for pod, (name, _) in self.pods.items() if pod[0] == key[0] and name == key[1]
            }
        self.dirty.add(key)
        self._poke()

    def on_gateway_class(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A GatewayClass changed: its Gateways may have become ours, or stopped being ours."""
        self.gateway_api = True
        name = str((body.get("metadata") or {}).get("name") or "")
        if event == "DELETED":
            self.classes.pop(name, None)
        else:
            old = self.classes.get(name)
            if old is not None and resource_version(old) >= resource_version(body):
                return
            self.classes[name] = copy.deepcopy(dict(body))
        self.classes_dirty = True
        self.dirty |= {
            key
            for key, gw in self.gateways.items()
            if (gw.get("spec") or {}).get("gatewayClassName") == name
        }
        self._poke()

    def on_owned(self, event: str | None, body: Mapping[str, Any]) -> None:
        """One of our waypoint objects changed (a Deployment's status, usually)."""
        gateway = _labels(body).get(c.LABEL_GATEWAY_NAME)
        if gateway is None:
            return
        key = (_key(body)[0], gateway)
        objects = self.objects.setdefault(key, {})
        obj_key = key_of(body)
        if event == "DELETED":
            objects.pop(obj_key, None)
        else:
            old = objects.get(obj_key)
            if old is not None and resource_version(old) >= resource_version(body):
                return
            objects[obj_key] = copy.deepcopy(dict(body))
        if not objects:
            self.objects.pop(key, None)
        if key in self.gateways:
            self.dirty.add(key)
            self._poke()

    def wants_config_map(self, name: str, namespace: str, labels: Mapping[str, str]) -> bool:
        """Watch filter: class defaults for istio-waypoint, or a ConfigMap a Gateway reads."""
        if labels.get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS:
            return True
        return (namespace, name) in self.readers

    def on_config_map(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A ConfigMap we read changed."""
        key = _key(body)
        if event == "DELETED":
            self.config_maps[key] = None
        else:
            old = self.config_maps.get(key)
            if old is not None and resource_version(old) >= resource_version(body):
                return
            self.config_maps[key] = copy.deepcopy(dict(body))
        for reader in self.readers.get(key, ()):
            if reader.startswith("class:"):
                self.on_class_reader(reader.removeprefix("class:"))
            else:
                namespace, _, name = reader.removeprefix("gw:").partition("/")
                self.dirty.add((namespace, name))
        if _labels(body).get(c.LABEL_DEFAULTS_FOR_CLASS) == c.ISTIO_WAYPOINT_CLASS:
            self.defaults_dirty = True
        self._poke()

    def on_class_reader(self, class_name: str) -> None:
        """The parameters of a class changed: the class and its Gateways are re-judged."""
        self.classes_dirty = True
        self.dirty |= {
            key
            for key, gw in self.gateways.items()
            if (gw.get("spec") or {}).get("gatewayClassName") == class_name
        }

    def on_pod(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A pod of some Gateway (any class): remember where it runs."""
        self.place_pod(_key(body), None if event == "DELETED" else placement_of(body))

    def place_pod(self, key: GatewayKey, placement: tuple[str, str] | None) -> None:
        """Record (Gateway name, node) of a pod; None when it is gone or is no Gateway's."""
        if placement is None:
            if self.pods.pop(key, None) is not None:
                self.pods_unchecked.discard(key)
            return
        if self.pods.get(key) != placement:
            self.pods[key] = placement
            self.pods_unchecked.add(key)
            self._poke()

    def on_service(self, event: str | None, body: Mapping[str, Any]) -> None:
        """Remember Services that name a waypoint (istio.io/use-waypoint)."""
        key = _key(body)
        labels = _labels(body)
        relevant = {
            k: v
            for k, v in labels.items()
            if k in (c.LABEL_USE_WAYPOINT, c.LABEL_USE_WAYPOINT_NAMESPACE)
        }
        if event == "DELETED" or c.LABEL_USE_WAYPOINT not in relevant:
            if self.services.pop(key, None) is not None:
                self._poke()
            return
        meta = body.get("metadata") or {}
        old = self.services.get(key)
        # The version is kept for kube/sweep.py; it is no change by itself.
        self.services[key] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": key[1],
                "namespace": key[0],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "labels": relevant,
        }
        if old is None or old["labels"] != relevant or old["metadata"]["uid"] != meta.get("uid"):
            self.services_dirty = True
            self._poke()

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

    def _drop_reader(self, reader: str) -> None:
        self._set_reads(reader, ())

    def _set_reads(self, reader: str, targets: Iterable[GatewayKey]) -> None:
        """Record which ConfigMaps a reader uses; forget those nobody reads any more.

        A forgotten ConfigMap is no longer watched, so its cached copy would
        go stale: it is dropped and read afresh if someone refers to it again.
        """
        wanted = set(targets)
        for key in [k for k, readers in self.readers.items() if reader in readers]:
            if key in wanted:
                continue
            self.readers[key].discard(reader)
            if not self.readers[key]:
                del self.readers[key]
                cached = self.config_maps.get(key)
                if cached is None or _labels(cached).get(c.LABEL_DEFAULTS_FOR_CLASS) != (
                    c.ISTIO_WAYPOINT_CLASS
                ):
                    self.config_maps.pop(key, None)
        for key in wanted:
            self.readers.setdefault(key, set()).add(reader)

    def _retry(self, key: GatewayKey) -> None:
        self.dirty.add(key)
        self._poke()

    def _retry_later(self, what: str, delay: float) -> None:
        """Re-run the class or class-defaults step after a failure, not on every pass."""

        def again() -> None:
            if what == "classes":
                self.classes_dirty = True
            else:
                self.defaults_dirty = True
            self._poke()

        asyncio.get_running_loop().call_later(delay, again)

    def mark_all(self) -> None:
        """Re-judge everything on the next pass (spec change or periodic resync)."""
        self.dirty |= set(self.gateways)
        self.classes_dirty = True
        self.defaults_dirty = True
        self.services_dirty = True
        self.pods_unchecked |= set(self.pods)

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

    # -- the loops ----------------------------------------------------------------
    async def run(self, leading: Callable[[], bool]) -> None:
        """Reconcile soon after each change, while `leading()` says we may write."""
        loop = asyncio.get_running_loop()
        # Every change here is one a user waits for (a Gateway, its objects).
        pacer = Pacer(debounce=DEBOUNCE_SECONDS, idle_debounce=IDLE_DEBOUNCE_SECONDS)
        while True:
            await self.wake.wait()
            pacer.idle_until(loop.time())
            deadline = loop.time() + MAX_DELAY_SECONDS
            while True:
                self.wake.clear()
                now = loop.time()
                left = deadline - now
                if left <= 0:
                    break
                debounce = pacer.debounce_for(now, urgent=True)
                try:
                    await asyncio.wait_for(self.wake.wait(), min(debounce, left))
                except TimeoutError:
                    break
            if not leading():
                continue  # the operator's loop takes over with us when we lead
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("waypoint pass failed; retrying")
                await asyncio.sleep(RETRY_SECONDS[0])
                self.wake.set()
            pacer.ended(loop.time(), urgent=True)

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
        windows = any(node_os(node) == "windows" for node in list(self.state.nodes.values()))
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
        desired = prepare(wr.render_gateway_class(spec), owner, wr.CLASS_CONTROLLER)
        live = {
            key_of(obj): obj
            for obj in self.classes.values()
            if _labels(obj).get(LABEL_CONTROLLER) == wr.CLASS_CONTROLLER
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
            if not wr.class_is_ours(gateway_class, spec.waypoints.controller_name):
                continue
            refs = wr.parameter_refs({}, gateway_class, spec.namespace)
            await self._load_config_maps(refs, f"class:{name}")
            verdict = wr.class_verdict(gateway_class, self._config_data(), spec.namespace)
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
                self.kube.get, CONFIG_MAP, wr.CLASS_DEFAULTS_NAME, spec.namespace
            )
            targets = [
                existing
                or {"metadata": {"name": wr.CLASS_DEFAULTS_NAME, "namespace": spec.namespace}}
            ]
        for cm in targets:
            meta = cm["metadata"]
            text = (cm.get("data") or {}).get("deployment")
            merged, problem = wr.pin_class_defaults(text)
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
            obj = wr.render_class_defaults(
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

    # -- one Gateway ------------------------------------------------------------------
    async def _foreign_service_account(
        self, key: GatewayKey, gateway: Mapping[str, Any], owner: Owner, names: wr.Names
    ) -> dict[str, Any] | None:
        """The ServiceAccount named by annotation, when it exists and is not the Gateway's own.

        Such an account may carry a cloud identity or RBAC of its own: the
        policy decides whether the waypoint may run as it, and it is never
        written (an owner reference would delete it with the Gateway).
        Without the annotation the account is the Gateway's own, as upstream.
        """
        annotations = (gateway.get("metadata") or {}).get("annotations") or {}
        if c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT not in annotations:
            return None
        if wr.service_account_problem(names):
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
        namespace = self.state.namespaces.get(key[0])
        # Nothing can be created in a namespace that is going or gone: a write
        # (say, restoring the ServiceAccount the namespace controller just
        # deleted) is refused, again on every retry. A Gateway can outlive its
        # namespace when that controller fails (seen in the suite: 404 on every
        # write for minutes), so one the cache does not know is looked up.
        if namespace is None:
            live = await self._call(self.kube.get, NAMESPACE, key[0])
            if live is None:
                return True  # gone; its Gateways go with it, nothing to retry
            # There, but its event is still behind the Gateway's.
            if live["metadata"].get("deletionTimestamp"):
                return True
        elif namespace.get("terminating"):
            return True
        owner = Owner.of(gateway)
        # What this Gateway controls: an object that merely carries our labels
        # is neither updated, pruned nor read for status.
        owned = self._owned(key, owner)
        gateway_class = self.classes.get(str((gateway.get("spec") or {}).get("gatewayClassName")))
        if not wr.class_is_ours(gateway_class, spec.waypoints.controller_name):
            ok = True
            for obj in owned.values():
                ok = await self._prune(obj, owner, key[0]) and ok
            return ok
        await self._load_config_maps(
            wr.parameter_refs(gateway, gateway_class, spec.namespace), f"gw:{key[0]}/{key[1]}"
        )
        names = wr.names_of(gateway)
        foreign = await self._foreign_service_account(key, gateway, owner, names)
        result = wr.render_waypoint(
            spec, gateway, gateway_class, self._config_data(), foreign_service_account=foreign
        )
        errors: list[str] = []
        conflicts: list[str] = []
        if result.accepted.status == "True":
            prepared = [prepare(obj, owner, wr.CONTROLLER) for obj in result.objects]
            todo = plan(prepared, owned)
            current = await self._current(todo.apply, owned, owner, conflicts, errors)
            # All or nothing: a waypoint short of one object serves nobody, and
            # the others would sit under names somebody else may want back.
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

        Our caches see only objects with our labels, so a name not among
        this Gateway's own is asked for; whatever is not ours is a conflict.
        """
        current: dict[ObjectKey, dict[str, Any] | None] = {}
        for obj in objects:
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
                    continue
            why = conflict(live, owner)
            if why is not None:
                conflicts.append(why)
            current[okey] = live
        return current

    async def _write_all(
        self,
        objects: list[dict[str, Any]],
        current: Mapping[ObjectKey, dict[str, Any] | None],
        owner: Owner,
        conflicts: list[str],
        errors: list[str],
    ) -> None:
        async def one(obj: dict[str, Any]) -> None:
            try:
                live = await self._call(write, self.kube, obj, current.get(key_of(obj)), owner)
            except NameConflictError as exc:
                conflicts.append(exc.message)  # taken meanwhile; nothing was written
                return
            except KubeError as exc:
                errors.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
                return
            self.on_owned("MODIFIED", live)
            metrics.OBJECTS_APPLIED.labels(kind=obj["kind"]).inc()

        # The ServiceAccount first: a pod naming a missing one is refused,
        # and the ReplicaSet controller backs off. The rest go together.
        for obj in (o for o in objects if o["kind"] == "ServiceAccount"):
            await one(obj)
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
        result: wr.WaypointRender,
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
            programmed = ws.programmed_verdict(
                result.accepted, result.replicas, deployment, service, error, name_conflict
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
                self.gateways[key] = fresh
                if (fresh.get("metadata") or {}).get("generation") != gateway["metadata"].get(
                    "generation"
                ):
                    self.dirty.add(key)  # the spec changed too: render again
                    self._poke()
                    return True
                continue
            assert wrote.live is not None
            self.gateways[key] = wrote.live
            return True
        return False

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
            metrics.OBJECTS_PRUNED.labels(kind=str(obj.get("kind"))).inc()
        return True

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
                wr.is_waypoint(gateway)
                or wr.class_is_ours(gateway_class, spec.waypoints.controller_name)
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
        waypoints = {key: wr.is_waypoint(gw) for key, gw in self.gateways.items()}
        for (namespace, _), service in sorted(self.services.items()):
            for reason, message in namespace_problems(namespace, service["labels"], waypoints):
                await self._call(self.events.post, service, "Warning", reason, message)
