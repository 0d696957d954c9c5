"""The waypoint caches: what the watches report, and what changed since the last pass.

The on_* handlers run on the event loop; each records what it saw, marks
what must be reconciled again (the dirty flags) and wakes the loop.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ambient_operator.api import constants as c
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import desired_part
from ambient_operator.controllers.waypoints.common import (
    CONCURRENCY,
    GATEWAY_API_RECHECK_SECONDS,
    GatewayKey,
    Seen,
    _key,
    _labels,
    unseen,
)
from ambient_operator.kube.client import Kube
from ambient_operator.kube.resources import ObjectKey, cached_copy, key_of, resource_version
from ambient_operator.status.events import EventRecorder, now_rfc3339

T = TypeVar("T")


class WaypointCache:
    """The caches and dirty flags of the waypoint controller, and its pool of API threads."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        events: EventRecorder,
        *,
        resync_seconds: float = 300.0,
        clock: Callable[[], str] = now_rfc3339,
        seen: Seen = unseen,
    ) -> None:
        self.state = state
        self.seen = seen
        self.kube = kube
        self.events = events
        self.resync_seconds = resync_seconds
        self.clock = clock
        # The one Gateway cache: the namespace checks read it too. This
        # controller's watch is the only one that fills it.
        self.gateways: dict[GatewayKey, dict[str, Any]] = state.gateways
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
        # Gateways some of whose objects went away: confirmed to exist before
        # those are made again (see gateways.py).
        self.vanished: set[GatewayKey] = set()
        self._spec_seen: Any = None
        self._windows_seen: bool | None = None
        self._revisions_seen: Any = None
        # ClusterState.revision_changes when the revision inputs were last read.
        self._revision_count = -1
        # istiod's revision tags (tag -> revision), read once per pass.
        self.tags: dict[str, str] = {}
        self._last_full = time.monotonic()
        self._failures: dict[GatewayKey, int] = {}
        self._awaiting_namespace: str | None = None
        # No pass before the caches hold what exists: a pass over half-loaded
        # caches would re-apply objects it has not seen yet.
        self.primed = False
        # What the loop (runtime/loop.py) waits on; every change here is one a
        # user waits for (a Gateway, its objects), so every poke is urgent. One
        # that alters what is written for a Gateway (it is new, changed or
        # gone, or one of its objects drifted) is keyed too: it goes at once
        # however busy the loop (runtime/pacing.py); status news (a
        # Deployment's replicas, a Gateway's status) is batched when busy.
        self.trigger = asyncio.Event()
        self.urgent = False
        self.keyed = False
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
    def _poke(self, keyed: bool = True) -> None:
        self.urgent = True
        self.keyed = self.keyed or keyed
        self.trigger.set()

    def on_gateway(self, event: str | None, body: Mapping[str, Any]) -> None:
        """A Gateway was listed, changed or deleted."""
        self.gateway_api = True
        key = _key(body)
        if event == "DELETED":
            self.vanished.discard(key)
            if self.gateways.pop(key, None) is not None:
                self._drop_reader(f"gw:{key[0]}/{key[1]}")
                self.dirty.discard(key)
                self.services_dirty = True
                self._poke()
                # Namespaces naming it as their waypoint, and status.revisions.
                self.state.gateway_changed(key)
            return
        old = self.gateways.get(key)
        if old is not None and resource_version(old) >= resource_version(body):
            return  # our own write came back, or an event older than an apply response
        self.gateways[key] = cached_copy(body)
        # A status change is this Gateway's alone: the operator's pass (its
        # namespace checks and status.revisions) reads Gateways' spec and labels.
        changed = old is None or desired_part(old) != desired_part(body)
        if changed:
            self.state.gateway_changed(key)
        if old is None:
            self.services_dirty = True
            # Pods seen before their Gateway are judged now.
            self.pods_unchecked |= {
                pod for pod, (name, _) in self.pods.items() if pod[0] == key[0] and name == key[1]
            }
        self.dirty.add(key)
        self._poke(keyed=changed)

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
            self.classes[name] = cached_copy(body)
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
        # A rollout moving along is status; an edit or a deletion is drift.
        drift = True
        if event == "DELETED":
            if objects.pop(obj_key, None) is not None:
                self.vanished.add(key)
        else:
            old = objects.get(obj_key)
            if old is not None and resource_version(old) >= resource_version(body):
                return
            drift = old is None or desired_part(old) != desired_part(body)
            objects[obj_key] = cached_copy(body)
        if not objects:
            self.objects.pop(key, None)
        if key in self.gateways:
            self.dirty.add(key)
            self._poke(keyed=drift)

    def forget_pruned(self, body: Mapping[str, Any]) -> None:
        """Drop an object we just deleted: its deletion's event is then no news.

        Only a deletion we did not make marks its Gateway `vanished`, to be
        read again before its objects are put back.
        """
        gateway = _labels(body).get(c.LABEL_GATEWAY_NAME)
        key = (_key(body)[0], str(gateway))
        objects = self.objects.get(key)
        if gateway is None or objects is None:
            return
        objects.pop(key_of(body), None)
        if not objects:
            self.objects.pop(key, None)

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
            self.config_maps[key] = cached_copy(body)
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

    def place_pod(self, key: GatewayKey, placement: tuple[str, str] | None) -> None:
        """Record (Gateway name, node) of a pod; None when it is gone or is no Gateway's."""
        if placement is None:
            if self.pods.pop(key, None) is not None:
                self.pods_unchecked.discard(key)
            return
        if self.pods.get(key) != placement:
            self.pods[key] = placement
            self.pods_unchecked.add(key)
            self._poke(keyed=False)  # what is said of the pod, not what is written

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
                self._poke(keyed=False)  # Services are judged, not written
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
            self._poke(keyed=False)

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
