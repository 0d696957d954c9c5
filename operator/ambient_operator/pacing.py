"""When the reconcile loop makes its next pass: at once when idle, spaced out under churn.

Two kinds of change reach the loop. An urgent one can alter what the
operator writes (a node, the spec, drift on one of our objects); the other
only moves status along (pods starting, a rollout progressing). Both are
folded into passes, but differently:

- A stream of changes (200 nodes joining, a rollout) is folded into a
  handful of passes: each pass that follows the previous one within
  `IDLE_AFTER_SECONDS` doubles the gap before the next, up to 5 s.
- An urgent change after `IDLE_AFTER_SECONDS` without an urgent pass is
  isolated news a user is waiting for: it does not wait behind a gap that
  status churn built up, and only events arriving within the short idle
  debounce of it are folded with it.

Pure bookkeeping over times the caller passes in, so it is tested without
a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_AFTER_SECONDS = 2.0
MIN_GAP_SECONDS = 0.5
MAX_GAP_SECONDS = 5.0


@dataclass
class Pacer:
    """The loop's memory of its recent passes."""

    debounce: float
    idle_debounce: float
    last_end: float = float("-inf")
    last_urgent_end: float = float("-inf")
    gap: float = 0.0

    def urgent_is_isolated(self, now: float, urgent: bool) -> bool:
        """Whether a pending change is urgent and no urgent pass ran lately."""
        return urgent and now - self.last_urgent_end >= IDLE_AFTER_SECONDS

    def woke(self, now: float, urgent: bool) -> float:
        """The loop woke for a change at `now`: seconds to wait before the pass.

        Called once per wake-up, since it grows the gap; while waiting, the
        caller asks `urgent_is_isolated` again when another change arrives.
        """
        if self.urgent_is_isolated(now, urgent):
            return 0.0
        since = now - self.last_end
        if since < IDLE_AFTER_SECONDS:
            self.gap = min(max(self.gap * 2, MIN_GAP_SECONDS), MAX_GAP_SECONDS)
        else:
            self.gap = 0.0
        return max(self.gap - since, 0.0)

    def debounce_for(self, now: float, urgent: bool) -> float:
        """How long the loop waits for companions of the latest change."""
        return self.idle_debounce if self.urgent_is_isolated(now, urgent) else self.debounce

    def ended(self, now: float, urgent: bool) -> None:
        """A pass ended at `now`; `urgent` tells whether it answered an urgent change."""
        self.last_end = now
        if urgent:
            self.last_urgent_end = now
