"""Kubernetes Events for what a user should see in `kubectl describe`.

Each Event has a name derived from its object, reason and message, so the
same news is told once: a restarted operator lists the Events it posted
before (one read, `load`) and does not post them again (no write). Posting
is then a single create; an Event another replica posted meanwhile answers
409, which counts as told.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ambient_operator.api import metrics
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS
from ambient_operator.status.writer import create_event

log = logging.getLogger(__name__)
EVENT = KINDS[("v1", "Event")]
COMPONENT = "ambient-operator"
# Events of cluster-scoped objects live here; `kubectl describe` finds them.
CLUSTER_EVENTS_NAMESPACE = "default"


def now_rfc3339() -> str:
    """The current time as the API server writes it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Posts each (object, reason, message) at most once."""

    def __init__(self, kube: Kube, instance: str = COMPONENT) -> None:
        self.kube = kube
        self.instance = instance
        self._told: set[str] = set()
        # Until `load` ran, each post looks for its Event first.
        self._loaded = False

    def load(self) -> None:
        """Learn which Events this operator posted before (in any replica or run)."""
        try:
            told = {
                event["metadata"]["name"]
                for event in self.kube.iter_list(EVENT, field_selector=f"source={COMPONENT}")
            }
        except KubeError as exc:
            # Posting still works, a read per Event slower.
            log.warning("could not list earlier events (%s); checking each one instead", exc)
            return
        self._told |= told
        self._loaded = True

    @staticmethod
    def name_for(obj: Mapping[str, Any], reason: str, message: str) -> str:
        """Deterministic Event name for this news about this object."""
        meta = obj.get("metadata", {})
        digest = hashlib.sha256(f"{meta.get('uid')}|{reason}|{message}".encode()).hexdigest()[:16]
        return f"{meta.get('name')}.{digest}"[:253]

    def told(self, obj: Mapping[str, Any], reason: str, message: str) -> bool:
        """True when this news was posted already (no API call; safe on the event loop)."""
        return self.name_for(obj, reason, message) in self._told

    def post(self, obj: Mapping[str, Any], kind_type: str, reason: str, message: str) -> bool:
        """Post an Event about `obj` unless it was told already; True when posted."""
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") or CLUSTER_EVENTS_NAMESPACE
        name = self.name_for(obj, reason, message)
        if name in self._told:
            return False
        try:
            if not self._loaded and self.kube.get(EVENT, name, namespace) is not None:
                self._told.add(name)
                return False
            stamp = now_rfc3339()
            create_event(
                self.kube,
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": namespace},
                    "involvedObject": {
                        "apiVersion": obj.get("apiVersion"),
                        "kind": obj.get("kind"),
                        "name": meta.get("name"),
                        "namespace": meta.get("namespace", ""),
                        "uid": meta.get("uid"),
                    },
                    "type": kind_type,
                    "reason": reason,
                    "message": message[:1024],
                    "source": {"component": COMPONENT},
                    "reportingComponent": COMPONENT,
                    "reportingInstance": self.instance,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                },
            )
        except KubeError as exc:
            if exc.status == 409:  # another replica, or a run before `load`, told it
                self._told.add(name)
                return False
            # An Event is news, not state: losing one must not fail a reconcile.
            log.warning("could not post event %s: %s", reason, exc)
            return False
        self._told.add(name)
        metrics.EVENTS_POSTED.labels(type=kind_type, reason=reason).inc()
        return True
