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
  back), and while the loop is not spacing passes yet and fewer than
  `URGENT_BURST` urgent passes ran (one unrelated change just before does
  not hold it back either).

Pure bookkeeping over times the caller passes in, so it is tested without
a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

IDLE_AFTER_SECONDS = 2.0
MIN_GAP_SECONDS = 0.5
MAX_GAP_SECONDS = 5.0
# Urgent passes allowed back to back before the spacing applies to them too.
URGENT_BURST = 3


@dataclass
class Pacer:
    """A loop's memory of its recent passes."""

    debounce: float
    idle_debounce: float
    last_end: float = float("-inf")
    gap: float = 0.0
    urgent_ends: deque[float] = field(default_factory=lambda: deque(maxlen=URGENT_BURST))

    def urgent_goes_now(self, now: float, urgent: bool) -> bool:
        """Whether a pending change is urgent and may skip the spacing.

        It may when no urgent pass ran lately (any gap is status churn's), or
        when the loop is not spacing passes yet and only a few urgent ones ran.
        """
        if not urgent:
            return False
        recent = sum(1 for end in self.urgent_ends if now - end < IDLE_AFTER_SECONDS)
        return recent == 0 or (self.gap == 0.0 and recent < URGENT_BURST)

    def woke(self, now: float, urgent: bool) -> float:
        """The loop woke for a change at `now`: seconds to wait before the pass.

        Called once per wake-up, since it grows the gap; while waiting, the
        caller asks `urgent_goes_now` again when another change arrives.
        """
        since = now - self.last_end
        if since >= IDLE_AFTER_SECONDS:
            self.gap = 0.0
            return 0.0
        if self.urgent_goes_now(now, urgent):
            return 0.0
        self.gap = min(max(self.gap * 2, MIN_GAP_SECONDS), MAX_GAP_SECONDS)
        return max(self.gap - since, 0.0)

    def debounce_for(self, now: float, urgent: bool) -> float:
        """How long the loop waits for companions of the latest change."""
        return self.idle_debounce if self.urgent_goes_now(now, urgent) else self.debounce

    def ended(self, now: float, urgent: bool) -> None:
        """A pass ended at `now`; `urgent` tells whether it answered an urgent change."""
        self.last_end = now
        if urgent:
            self.urgent_ends.append(now)
