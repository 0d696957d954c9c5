"""Leader election on a coordination.k8s.io Lease, so that of several replicas one acts.

Every replica keeps its watches (and so its caches) warm; only the leader
reconciles. A standby takes over once the leader's lease has not been
renewed for `lease_seconds`.

The leader stops acting by its own clock before that: `leading` is true
only until `RENEW_DEADLINE` of the lease has passed since the start of its
last successful renewal, whether or not the API server answers. A renewal
that hangs (the server frozen, a network partition) would otherwise leave a
leader that still believes it leads while a standby, the moment the server
answers again, rightly takes over: two replicas writing. The time is taken
before the request, so a renewal answered late extends nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ambient_operator.apply.writer import create_new, replace
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS

log = logging.getLogger(__name__)
LEASE = KINDS[("coordination.k8s.io/v1", "Lease")]
# Share of the lease a leader may act on after its last renewal began; the
# rest is the margin before a standby may take over (client-go's defaults
# are 10 s of 15 s).
RENEW_DEADLINE = 2 / 3


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.retry_seconds = max(lease_seconds / 3, 0.5)
        self.clock = clock
        self.monotonic = monotonic
        self._leading = False
        # Monotonic time until which this replica may act on its last renewal.
        self._valid_until = float("-inf")

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease and its last renewal is recent enough."""
        return self._leading and self.monotonic() < self._valid_until

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
        started = self.monotonic()
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
                return self._set(True, started)
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
            return self._set(True, started)
        except KubeError as exc:
            if exc.status != 409:
                log.warning("leader election: %s", exc)
            return self._set(False)

    def _set(self, leading: bool, started: float | None = None) -> bool:
        was = self.leading
        self._leading = leading
        if leading and started is not None:
            self._valid_until = started + self.lease_seconds * RENEW_DEADLINE
        now = self.leading
        if now != was:
            state = "now leading" if now else "standing by"
            log.info("leader election: %s as %s", state, self.identity)
        return now

    def _expired(self) -> bool:
        """Leading ran out by our own clock while a renewal hangs: say so once."""
        if self._leading and not self.leading:
            self._leading = False
            log.info(
                "leader election: standing by as %s: the lease was not renewed within %.1fs",
                self.identity,
                self.lease_seconds * RENEW_DEADLINE,
            )
            return True
        return False

    async def run(self, on_change: Callable[[bool], None]) -> None:
        """Renew forever; call `on_change` when leadership flips.

        While a renewal hangs, leading still ends on time: the wait for the
        request is cut into pieces no longer than what is left of it.
        """
        while True:
            before = self.leading
            attempt = asyncio.ensure_future(asyncio.to_thread(self.ensure))
            while not attempt.done():
                left = self._valid_until - self.monotonic() if self.leading else None
                await asyncio.wait({attempt}, timeout=None if left is None else max(left, 0.0))
                if not attempt.done() and self._expired():
                    on_change(False)
                    before = False
            now_leading = attempt.result()
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
        self._leading = False
