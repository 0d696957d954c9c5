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
from ambient_operator.cluster.pods import PodFeed
from ambient_operator.cluster.state import KEY_QUIET_SECONDS, ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.kube.informer import Change


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


# -- which changes are keyed (runtime/pacing.py: they go at once, however busy) --------


def _rows(state: ClusterState) -> dict[str, Any]:
    return {row.id: row.record for row in state_watches(state, [])}


def _taken(state: ClusterState) -> tuple[bool, bool, bool]:
    """(urgent, keyed, full pass due) since the last call, cleared as the loop and a pass do."""
    seen = (state.urgent, state.keyed, state.full_pass_due)
    state.urgent = state.keyed = state.full_pass_due = False
    return seen


def _namespace(name: str, version: str, **labels: str) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "resourceVersion": version, "labels": labels}
    return {"metadata": meta}


def _node(name: str, os_name: str, build: str | None = None, beat: str = "1") -> dict[str, Any]:
    labels = {"kubernetes.io/os": os_name}
    if build:
        labels["node.kubernetes.io/windows-build"] = build
    info = {"operatingSystem": os_name, "kernelVersion": f"{build}.1" if build else "6.8.0"}
    return {
        "metadata": {"name": name, "labels": labels, "resourceVersion": beat},
        "status": {
            "nodeInfo": info,
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}],
        },
    }


def test_a_namespace_label_change_is_keyed_by_its_namespace() -> None:
    state = ClusterState()
    record = _rows(state)["namespaces"]
    _taken(state)
    # No full pass: the data plane's writes do not read an app's namespace.
    record(None, _namespace("shop", "1", **{"istio.io/dataplane-mode": "ambient"}))
    assert _taken(state) == (True, True, False)
    record(None, _namespace("shop", "2", **{"istio.io/dataplane-mode": "ambient"}))
    assert _taken(state) == (False, False, False)  # nothing but its resourceVersion
    # The same namespace again at once: folded by the spacing like other changes.
    record(None, _namespace("shop", "3", **{"istio.io/dataplane-mode": "ambinet"}))
    assert _taken(state) == (True, False, False)
    # Another namespace is a key of its own.
    record(None, _namespace("web", "4", **{"istio.io/dataplane-mode": "ambient"}))
    assert _taken(state) == (True, True, False)
    record("DELETED", _namespace("batch", "5"))
    assert _taken(state) == (True, True, False)


def test_a_full_pass_answers_the_agents_namespaces_alone() -> None:
    state = ClusterState()
    record = _rows(state)["namespaces"]
    _taken(state)
    # spec.namespace, its default while no mesh is known: whether the agents may go there.
    record(None, _namespace("istio-system", "1"))
    assert _taken(state) == (True, True, True)
    state.mesh = {"metadata": {"name": "default"}, "spec": {"namespace": "mesh-agents"}}
    record(None, _namespace("istio-system", "2", team="a"))
    assert _taken(state)[2] is False
    record(None, _namespace("mesh-agents", "3"))
    assert _taken(state)[2] is True
    # A namespace holding one of our objects (the agents a move leaves behind).
    state.owned[("v1", "ServiceAccount", "old-agents", "ztunnel")] = {}
    record(None, _namespace("old-agents", "4"))
    assert _taken(state)[2] is True
    # The namespace the last pass refused.
    state.refused_namespace = "typo-system"
    record(None, _namespace("typo-system", "5"))
    assert _taken(state)[2] is True
    record(None, _namespace("shop", "6"))
    assert _taken(state)[2] is False


def test_a_node_change_is_keyed_by_its_platform() -> None:
    state = ClusterState()
    record = _rows(state)["nodes"]
    _taken(state)
    record(None, _node("linux-1", "linux"))
    assert _taken(state) == (True, True, True)
    # A second Linux node at once: the same platform, folded like a burst.
    record(None, _node("linux-2", "linux"))
    assert _taken(state) == (True, False, True)
    # Each Windows build is a platform of its own; the label or the kernel tells it.
    record(None, _node("ws2025-1", "windows", "10.0.26100"))
    assert _taken(state) == (True, True, True)
    ws2022 = _node("ws2022-1", "windows", "10.0.20348")
    del ws2022["metadata"]["labels"]["node.kubernetes.io/windows-build"]
    record(None, ws2022)
    assert _taken(state) == (True, True, True)
    assert sorted(state.keyed_at) == [
        "platform/linux/",
        "platform/windows/10.0.20348",
        "platform/windows/10.0.26100",
    ]
    # A heartbeat changes nothing render reads: no pass at all.
    record(None, _node("linux-1", "linux", beat="2"))
    assert _taken(state) == (False, False, False)
    # A departure is its platform's news too (here within that platform's quiet span).
    record("DELETED", {"metadata": {"name": "ws2025-1"}})
    assert _taken(state) == (True, False, True)
    assert "ws2025-1" not in state.nodes


def test_a_key_goes_at_once_again_only_after_its_quiet_span() -> None:
    state = ClusterState()
    assert state.key_goes_now("namespace/shop", 100.0)
    assert not state.key_goes_now("namespace/shop", 101.9)
    assert state.key_goes_now("namespace/web", 101.9)
    assert state.key_goes_now("namespace/shop", 102.0)  # KEY_QUIET_SECONDS after the last
    assert KEY_QUIET_SECONDS == 2.0


def test_pods_are_status_news_and_never_keyed() -> None:
    state = ClusterState()
    _taken(state)
    feed = PodFeed(state, [])
    body = {
        "metadata": {"namespace": "shop", "name": "p", "labels": {}},
        "spec": {"nodeName": "linux-1", "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running"},
    }
    feed.apply([Change("ADDED", ("shop", "p"), feed.record_of(body))])
    assert _taken(state) == (False, False, False)
    assert state.trigger.is_set()
