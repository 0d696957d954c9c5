"""ClusterState.poke wakes the reconcile loop from any thread.

asyncio.Event is not thread-safe: set from another thread, it may leave the
loop asleep until unrelated I/O wakes it (seconds, in a quiet cluster). The
operator's start-up listing and the webhook's run in threads and poke.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ambient_operator.cluster.facts import NodeFacts, node_os
from ambient_operator.cluster.state import ClusterState


def test_poke_from_another_thread_wakes_the_loop() -> None:
    async def scenario() -> bool:
        state = ClusterState()
        state.loop = asyncio.get_running_loop()
        waiter = asyncio.create_task(state.trigger.wait())
        await asyncio.sleep(0)  # the waiter is parked on the event
        threading.Thread(target=state.poke, kwargs={"urgent": False}).start()
        # Nothing else happens on this loop: only the poke can wake it.
        await asyncio.wait_for(waiter, timeout=10)
        return state.urgent

    assert asyncio.run(scenario(), debug=True) is False


def test_poke_on_the_loop_sets_the_trigger_at_once() -> None:
    async def scenario() -> tuple[bool, bool]:
        state = ClusterState()
        state.loop = asyncio.get_running_loop()
        state.poke()
        return state.trigger.is_set(), state.urgent

    assert asyncio.run(scenario()) == (True, True)


def test_poke_before_the_loop_is_known() -> None:
    state = ClusterState()
    state.poke(urgent=False)
    assert state.trigger.is_set() and not state.urgent


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"metadata": {"labels": {"kubernetes.io/os": "windows"}}}, "windows"),
        # The label wins over the kubelet's report: it is what DaemonSets select on.
        (
            {
                "metadata": {"labels": {"kubernetes.io/os": "linux"}},
                "status": {"nodeInfo": {"operatingSystem": "windows"}},
            },
            "linux",
        ),
        ({"metadata": {}, "status": {"nodeInfo": {"operatingSystem": "windows"}}}, "windows"),
        ({"metadata": {"labels": {}}}, None),
        ({"metadata": "garbage", "status": ["not", "a", "mapping"]}, None),
        (None, None),
    ],
)
def test_one_reading_of_a_nodes_os(node: Any, expected: str | None) -> None:
    assert node_os(node) == expected
    if isinstance(node, dict) and isinstance(node.get("metadata"), dict):
        # render's facts read it the same way
        whole = {"status": {}, "spec": {}, **node, "metadata": {"name": "n", **node["metadata"]}}
        assert NodeFacts.from_node(whole).os == expected
