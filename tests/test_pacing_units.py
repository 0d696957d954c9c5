"""The reconcile loop's pacing over times given by the test (no clock), then the loop itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from ambient_operator.runtime.loop import ReconcileLoop, Timing
from ambient_operator.runtime.pacing import MAX_GAP_SECONDS, URGENT_BURST, Pacer


def _pacer() -> Pacer:
    return Pacer(debounce=0.2, idle_debounce=0.005)


def test_an_isolated_change_goes_at_once_with_the_short_debounce() -> None:
    p = _pacer()
    assert p.woke(100.0, urgent=True) == 0.0
    assert p.debounce_for(100.0, urgent=True) == 0.005
    # Status news alone is never hurried.
    assert p.woke(100.0, urgent=False) == 0.0
    assert p.debounce_for(100.0, urgent=False) == 0.2


def test_a_stream_of_urgent_changes_gets_a_few_quick_passes_then_doubling_gaps() -> None:
    p = _pacer()
    now, waits = 0.0, []
    for _ in range(URGENT_BURST + 7):
        wait = p.woke(now, urgent=True)
        waits.append(wait)
        now += wait + 0.1  # the pass takes 0.1 s
        p.ended(now, urgent=True)
        now += 0.05  # the next node event arrives right after
    assert waits[:URGENT_BURST] == [0.0] * URGENT_BURST
    gaps = [round(w + 0.05, 6) for w in waits[URGENT_BURST:]]
    assert gaps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert max(waits) <= MAX_GAP_SECONDS
    # Inside the stream every change waits the longer debounce.
    assert p.debounce_for(now, urgent=True) == 0.2


def test_a_quiet_spell_resets_the_gap() -> None:
    p = _pacer()
    p.ended(0.0, urgent=False)
    assert p.woke(0.1, urgent=False) == pytest.approx(0.4)
    p.ended(1.0, urgent=False)
    assert p.woke(1.1, urgent=False) == pytest.approx(0.9)  # doubled to 1 s
    p.ended(2.0, urgent=False)
    assert p.woke(4.5, urgent=False) == 0.0
    assert p.gap == 0.0
    # After the quiet spell, churn starts again from the smallest gap.
    p.ended(4.6, urgent=False)
    assert p.woke(4.7, urgent=False) == pytest.approx(0.4)


def test_status_churn_does_not_delay_an_urgent_change() -> None:
    p = _pacer()
    now = 0.0
    # Pods moving along: a status pass every 0.3 s builds up the gap.
    for _ in range(6):
        now += p.woke(now, urgent=False)
        now += 0.05
        p.ended(now, urgent=False)
        now += 0.3
    assert p.woke(now, urgent=False) > 1.0
    # A namespace label arriving now is not held behind that gap,
    assert p.urgent_goes_now(now, urgent=True)
    assert p.woke(now, urgent=True) == 0.0
    assert p.debounce_for(now, urgent=True) == 0.005


def test_an_unrelated_change_just_before_does_not_delay_the_next() -> None:
    # One urgent pass ended 20 ms ago (someone else's label): the next change
    # still goes at once, it does not wait for the first gap.
    p = _pacer()
    p.woke(10.0, urgent=True)
    p.ended(10.03, urgent=True)
    assert p.woke(10.05, urgent=True) == 0.0
    assert p.debounce_for(10.05, urgent=True) == 0.005


def test_status_news_first_does_not_hold_back_an_urgent_change_after_it() -> None:
    # Seen in bench/reaction_latency.py: a pod's status poke woke the loop
    # first and set a gap; the node that joined right after waited it out.
    p = _pacer()
    p.woke(50.0, urgent=True)
    p.ended(50.02, urgent=True)
    assert p.woke(50.03, urgent=False) > 0  # status news: spaced
    assert p.urgent_goes_now(50.04, urgent=True)  # the node: at once
    assert p.debounce_for(50.04, urgent=True) == 0.005


def test_an_idle_spell_starts_a_new_busy_period() -> None:
    p = _pacer()
    now = 0.0
    for _ in range(URGENT_BURST):
        p.ended(now, urgent=True)
        now += 0.1
    assert not p.urgent_goes_now(now, urgent=True)
    assert not p.idle_until(now)
    assert p.idle_until(now + 2.5)
    p.ended(now + 2.6, urgent=True)
    # Another urgent pass just ran, but the busy period is new: still at once.
    assert p.urgent_goes_now(now + 2.7, urgent=True)


def test_a_keyed_change_goes_at_once_however_busy_the_loop() -> None:
    # The waypoints' loop in a busy cluster (bench/istiod_race.py --busy):
    # urgent passes back to back while the last trial's namespace goes away.
    p = _pacer()
    now = 0.0
    for _ in range(URGENT_BURST + 3):
        p.ended(now, urgent=True)
        now += 0.05
    # Status news (a Deployment's replicas) is batched by the debounce...
    assert p.debounce_for(now, urgent=True) == 0.2
    assert p.debounce_for(now, urgent=False) == 0.2
    # ...a new or changed Gateway is not, nor is it spaced out.
    assert p.debounce_for(now, urgent=True, keyed=True) == 0.005
    assert p.debounce_for(now, urgent=False, keyed=True) == 0.005
    assert p.woke(now, urgent=True) > 0
    assert p.woke(now, urgent=True, keyed=True) == 0.0


# -- the loop that uses the pacing (runtime/loop.py), on a real event loop ---------


class _Source:
    """A Trigger as the caches are: an event and the urgency of what is pending."""

    def __init__(self) -> None:
        self.trigger = asyncio.Event()
        self.urgent = False
        self.keyed = False

    def poke(self, urgent: bool = True, keyed: bool = False) -> None:
        self.urgent = self.urgent or urgent
        self.keyed = self.keyed or keyed
        self.trigger.set()


_TIMING = Timing(debounce=0.01, idle_debounce=0.001, max_delay=0.05, status_delay=0.05)
_DEADLINE = 10.0  # seconds any pass may take to happen on a loaded machine


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), _DEADLINE * 3))


def test_the_loop_passes_after_a_poke_and_only_while_leading() -> None:
    async def body() -> None:
        source, passes, leader = _Source(), asyncio.Queue[bool](), [False]
        asked = asyncio.Event()

        def leading() -> bool:
            asked.set()
            return leader[0]

        async def work() -> None:
            await passes.put(source.urgent)

        loop = ReconcileLoop("test", source, work, leading, _TIMING)
        task = asyncio.create_task(loop.run())
        source.poke()
        # Not leading: the loop took the change (and its urgency) and ran no pass.
        await asyncio.wait_for(asked.wait(), _DEADLINE)
        assert passes.empty()
        assert not source.urgent
        leader[0] = True
        source.poke()
        # The pass sees the urgency already consumed by the loop (it is the loop's to tell).
        assert await asyncio.wait_for(passes.get(), _DEADLINE) is False
        assert loop.pacer.last_urgent_end > float("-inf")
        await _stop(task)

    _run(body)


def test_a_pass_that_raises_is_tried_again_without_a_new_change() -> None:
    async def body() -> None:
        source, calls = _Source(), asyncio.Queue[int]()
        count = [0]

        async def work() -> None:
            count[0] += 1
            await calls.put(count[0])
            if count[0] == 1:
                raise RuntimeError("boom")

        timing = Timing(
            debounce=0.01, idle_debounce=0.001, max_delay=0.05, status_delay=0.05, retry=0.0
        )
        task = asyncio.create_task(ReconcileLoop("test", source, work, lambda: True, timing).run())
        source.poke()
        assert await asyncio.wait_for(calls.get(), _DEADLINE) == 1
        assert await asyncio.wait_for(calls.get(), _DEADLINE) == 2
        await _stop(task)

    _run(body)


def test_resync_runs_a_pass_with_no_change_at_all() -> None:
    async def body() -> None:
        source, calls = _Source(), asyncio.Queue[None]()

        async def work() -> None:
            await calls.put(None)

        timing = Timing(
            debounce=0.01, idle_debounce=0.001, max_delay=0.05, status_delay=0.05, resync=0.01
        )
        task = asyncio.create_task(ReconcileLoop("test", source, work, lambda: True, timing).run())
        await asyncio.wait_for(calls.get(), _DEADLINE)
        await asyncio.wait_for(calls.get(), _DEADLINE)
        assert not source.trigger.is_set()
        await _stop(task)

    _run(body)


def test_a_keyed_change_ends_a_busy_loops_wait_for_companions() -> None:
    async def body() -> None:
        source, passes = _Source(), asyncio.Queue[None]()

        async def work() -> None:
            await passes.put(None)

        # A debounce far longer than the deadline: only a keyed change can
        # make the pass come in time.
        slow = Timing(
            debounce=60.0, idle_debounce=0.0, max_delay=60.0, status_delay=60.0, space_out=False
        )
        loop = ReconcileLoop("test", source, work, lambda: True, slow)
        task = asyncio.create_task(loop.run())
        now = asyncio.get_running_loop().time()
        for _ in range(URGENT_BURST):
            loop.pacer.ended(now, urgent=True)  # busy: urgent passes just ran
        source.poke()  # status news: waits for companions, up to 60 s
        source.poke(keyed=True)  # a new Gateway
        await asyncio.wait_for(passes.get(), _DEADLINE)
        assert not source.keyed
        await _stop(task)

    _run(body)
