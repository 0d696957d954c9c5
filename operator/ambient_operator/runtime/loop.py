"""The one reconcile loop: wake on a change, fold a burst into one pass, run it while leading.

The data plane (with the namespace checks and the webhook's miss counts)
and the waypoints each run one of these over their own trigger; how soon a
pass follows a change is `runtime/pacing.py`'s decision, the pass itself is
the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ambient_operator.api import metrics
from ambient_operator.runtime.pacing import Pacer

log = logging.getLogger(__name__)


class Trigger(Protocol):
    """What a loop waits on: an event set by watch handlers, and whether the news is urgent."""

    trigger: asyncio.Event
    urgent: bool
    # Whether a pending change alters what is written for one key (runtime/pacing.py).
    keyed: bool


@dataclass(frozen=True)
class Timing:
    """How a loop folds changes into passes."""

    # Between events of one burst (busy loop) and when the loop was idle.
    debounce: float
    idle_debounce: float
    # No urgent change waits longer than this for its burst to end...
    max_delay: float
    # ...and no status-only change longer than this.
    status_delay: float
    # A pass without any change after this long; None waits for changes only.
    resync: float | None = None
    # Whether passes under sustained churn leave growing gaps (runtime/pacing.py).
    # The waypoint loop does not: its passes are incremental, a burst costs little.
    space_out: bool = True
    # After a pass raised, wait this long and go again.
    retry: float = 1.0


@dataclass
class ReconcileLoop:
    """Runs `work` soon after each change on `source`, while `leading()` says we may write."""

    name: str
    source: Trigger
    work: Callable[[], Awaitable[None]]
    leading: Callable[[], bool]
    timing: Timing
    # One log line per pass when given: what the pass covered (counts of the caches).
    describe: Callable[[], str] | None = None
    # Called when the resync, not a change, is what woke the loop: the caller's
    # passes may otherwise look only at what changed.
    resynced: Callable[[], None] | None = None
    pacer: Pacer = field(init=False)

    def __post_init__(self) -> None:
        self.pacer = Pacer(debounce=self.timing.debounce, idle_debounce=self.timing.idle_debounce)

    async def run(self) -> None:
        """Loop until cancelled; a pass that raises is logged and tried again."""
        loop = asyncio.get_running_loop()
        while True:
            # A timeout here is the periodic resync.
            try:
                await asyncio.wait_for(self.source.trigger.wait(), timeout=self.timing.resync)
            except TimeoutError:
                if self.resynced is not None:
                    self.resynced()
            woke = loop.time()
            if self.timing.space_out:
                await self._space_out()
            else:
                self.pacer.idle_until(woke)
            await self._settle()
            urgent, self.source.urgent = self.source.urgent, False
            keyed, self.source.keyed = self.source.keyed, False
            if not self.leading():
                continue  # the elector pokes the loop when this replica takes over
            started = loop.time()
            # Counted as it begins: a test reads what a pass did (an Event, a
            # status line) while it runs, and knows which passes had begun.
            metrics.LOOP_PASSES.labels(loop=self.name, keyed=str(keyed).lower()).inc()
            try:
                await self.work()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The loop is the operator: one bad pass must not end it.
                log.exception("%s pass failed; retrying", self.name)
                await asyncio.sleep(self.timing.retry)
                self.source.trigger.set()
            ended = loop.time()
            self.pacer.ended(ended, urgent)
            if self.describe is not None:
                # One line per pass (passes are spaced out under churn): when a
                # change seems ignored, this tells whether a pass ran, and what
                # it waited for.
                log.info(
                    "%s pass: urgent=%s waited=%.3fs took=%.3fs keyed=%s %s",
                    self.name,
                    urgent,
                    started - woke,
                    ended - started,
                    keyed,
                    self.describe(),
                )

    async def _settle(self) -> None:
        """Wait for a quiet moment (or the max delay) so a burst is one pass."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            self.source.trigger.clear()
            urgent = self.source.urgent
            limit = self.timing.max_delay if urgent else self.timing.status_delay
            now = loop.time()
            left = started + limit - now
            if left <= 0:
                return
            # Picked again on every change: an urgent one arriving while status
            # news settles must not wait the longer debounce, nor a keyed one
            # arriving while a burst of others does.
            debounce = self.pacer.debounce_for(now, urgent, self.source.keyed)
            try:
                await asyncio.wait_for(self.source.trigger.wait(), timeout=min(debounce, left))
            except TimeoutError:
                return

    async def _space_out(self) -> None:
        """Under sustained churn, leave growing gaps between passes.

        A wait built up by status churn ends early when an urgent change
        arrives that may go at once.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self.pacer.woke(now, self.source.urgent, self.source.keyed)
        while True:
            now = loop.time()
            if now >= deadline or self.pacer.urgent_goes_now(
                now, self.source.urgent, self.source.keyed
            ):
                return
            self.source.trigger.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.source.trigger.wait(), timeout=deadline - now)
