"""Leader election on a coordination.k8s.io Lease, so that of several replicas one acts.

Every replica keeps its watches (and so its caches) warm; only the leader
reconciles. A standby takes over once the leader's lease has not been
renewed for `lease_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ambient_operator.apply.writer import create_new, replace
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS

log = logging.getLogger(__name__)
LEASE = KINDS[("coordination.k8s.io/v1", "Lease")]


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderElector:
    """Acquire and renew one Lease; `leading` says whether we hold it."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = 15.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.retry_seconds = max(lease_seconds / 3, 0.5)
        self.clock = clock
        self.leading = False

    def _body(self, now: datetime, acquired: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(int(self.lease_seconds), 1),
            "acquireTime": _stamp(acquired),
            "renewTime": _stamp(now),
            "leaseTransitions": transitions,
        }

    def ensure(self) -> bool:
        """Try once to acquire or renew; returns whether we lead now."""
        now = self.clock()
        try:
            lease = self.kube.get(LEASE, self.name, self.namespace)
            if lease is None:
                create_new(
                    self.kube,
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": self._body(now, now, 0),
                    },
                )
                return self._set(True)
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = _parse(spec.get("renewTime")) or datetime.min.replace(tzinfo=UTC)
            duration = timedelta(seconds=float(spec.get("leaseDurationSeconds") or 0))
            if holder not in (self.identity, None, "") and renewed + duration > now:
                return self._set(False)
            mine = holder == self.identity
            acquired = (_parse(spec.get("acquireTime")) or now) if mine else now
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            lease["spec"] = self._body(now, acquired, transitions)
            # PUT with the resourceVersion we read: of two standbys, one wins.
            replace(self.kube, lease)
            return self._set(True)
        except KubeError as exc:
            if exc.status != 409:
                log.warning("leader election: %s", exc)
            return self._set(False)

    def _set(self, leading: bool) -> bool:
        if leading != self.leading:
            state = "now leading" if leading else "standing by"
            log.info("leader election: %s as %s", state, self.identity)
        self.leading = leading
        return leading

    async def run(self, on_change: Callable[[bool], None]) -> None:
        """Renew forever; call `on_change` when leadership flips."""
        while True:
            before = self.leading
            now_leading = await asyncio.to_thread(self.ensure)
            if now_leading != before:
                on_change(now_leading)
            await asyncio.sleep(self.retry_seconds)

    def release(self) -> None:
        """Give the lease up on a clean shutdown so a standby need not wait."""
        if not self.leading:
            return
        try:
            lease = self.kube.get(LEASE, self.name, self.namespace)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                replace(self.kube, lease)
        except KubeError as exc:
            log.warning("leader election: could not release: %s", exc)
        self.leading = False
