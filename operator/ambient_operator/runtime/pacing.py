"""When a reconcile loop makes its next pass: at once when idle, spaced out under churn.

Two kinds of change reach the loop. An urgent one can alter what the
operator writes (a node, the spec, a label, drift on one of our objects);
the other only moves status along (pods starting, a rollout progressing).
Both are folded into passes, but differently:

- A stream of changes (200 nodes joining, a rollout) is folded into a
  handful of passes: once the loop is busy, each pass that follows the
  previous one within `IDLE_AFTER_SECONDS` doubles the gap before the next,
  up to 5 s.
- An urgent change is news a user is waiting for. It goes at once, with
  only the short idle debounce, when no urgent pass ran in the last
  `IDLE_AFTER_SECONDS` (a gap built up by status churn does not hold it
  back), and while fewer than `URGENT_BURST` urgent passes ran since the
  loop was last idle (a change or two just before does not hold it back
  either).
- A keyed change alters what is written for one key (a new or changed
  Gateway, in the waypoints' loop, whose passes touch only the keys that
  changed). Like a work queue's key it goes at once, with the short idle
  debounce, however busy the loop: no burst of other changes holds it back.

Pure bookkeeping over times the caller passes in, so it is tested without
a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_AFTER_SECONDS = 2.0
MIN_GAP_SECONDS = 0.5
MAX_GAP_SECONDS = 5.0
# Urgent passes allowed back to back before the spacing applies to them too:
# a node joining alone is two changes (created, then its kubelet's status).
URGENT_BURST = 5


@dataclass
class Pacer:
    """A loop's memory of its recent passes."""

    debounce: float
    idle_debounce: float
    last_end: float = float("-inf")
    last_urgent_end: float = float("-inf")
    gap: float = 0.0
    # Urgent passes since the loop was last idle (IDLE_AFTER_SECONDS without a pass).
    busy_urgent: int = 0

    def urgent_goes_now(self, now: float, urgent: bool, keyed: bool = False) -> bool:
        """Whether a pending change is urgent and may skip the spacing.

        It may when no urgent pass ran lately (any gap is status churn's), or
        while only a few urgent passes ran since the loop was last idle; a
        keyed change always may.
        """
        if keyed:
            return True
        if not urgent:
            return False
        return now - self.last_urgent_end >= IDLE_AFTER_SECONDS or (self.busy_urgent < URGENT_BURST)

    def woke(self, now: float, urgent: bool, keyed: bool = False) -> float:
        """The loop woke for a change at `now`: seconds to wait before the pass.

        Called once per wake-up, since it grows the gap; while waiting, the
        caller asks `urgent_goes_now` again when another change arrives.
        """
        since = now - self.last_end
        if self.idle_until(now):
            return 0.0
        if self.urgent_goes_now(now, urgent, keyed):
            return 0.0
        self.gap = min(max(self.gap * 2, MIN_GAP_SECONDS), MAX_GAP_SECONDS)
        return max(self.gap - since, 0.0)

    def idle_until(self, now: float) -> bool:
        """Whether the loop was idle until `now`; if so, a new busy period starts.

        `woke` calls it; a loop that does not space its passes calls it on waking.
        """
        if now - self.last_end < IDLE_AFTER_SECONDS:
            return False
        self.gap = 0.0
        self.busy_urgent = 0
        return True

    def debounce_for(self, now: float, urgent: bool, keyed: bool = False) -> float:
        """How long the loop waits for companions of the latest change."""
        if self.urgent_goes_now(now, urgent, keyed):
            return self.idle_debounce
        return self.debounce

    def ended(self, now: float, urgent: bool) -> None:
        """A pass ended at `now`; `urgent` tells whether it answered an urgent change."""
        self.last_end = now
        if urgent:
            self.last_urgent_end = now
            self.busy_urgent += 1
