"""What the caches keep, and what they let pass (cluster/watches.py, kube/resources.py), offline.

Nodes as kwok and a kubelet send them, written out here: a heartbeat moves
only the conditions' lastHeartbeatTime and the resourceVersion; anything
else a node reports is a change the caches must take.
"""

from __future__ import annotations

import copy
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.app.watches import KindFeed
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import Watched, heartbeat_only, state_watches

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "linux-1",
        "uid": "u-1",
        "resourceVersion": "100",
        "labels": {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
        "managedFields": [
            {"manager": "kwok", "operation": "Update", "time": "2026-12-07T07:00:00Z"}
        ],
    },
    "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
    "status": {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "lastHeartbeatTime": "2026-12-07T07:00:00Z",
                "lastTransitionTime": "2026-12-07T06:00:00Z",
            }
        ],
        "nodeInfo": {"operatingSystem": "linux", "architecture": "amd64"},
    },
}


def _beat(node: dict[str, Any], version: str, at: str) -> dict[str, Any]:
    out = copy.deepcopy(node)
    out["metadata"]["resourceVersion"] = version
    out["metadata"]["managedFields"][0]["time"] = at
    out["status"]["conditions"][0]["lastHeartbeatTime"] = at
    return out


def test_a_heartbeat_is_told_from_a_change() -> None:
    beat = _beat(NODE, "101", "2026-12-07T07:05:00Z")
    assert heartbeat_only(NODE, beat)
    not_ready = copy.deepcopy(beat)
    not_ready["status"]["conditions"][0]["status"] = "False"
    assert not heartbeat_only(NODE, not_ready)
    relabelled = copy.deepcopy(beat)
    relabelled["metadata"]["labels"]["team"] = "a"
    assert not heartbeat_only(NODE, relabelled)
    untainted = copy.deepcopy(beat)
    untainted["spec"]["taints"] = []
    assert not heartbeat_only(NODE, untainted)
    rebuilt = copy.deepcopy(beat)
    rebuilt["status"]["nodeInfo"]["kernelVersion"] = "6.18"
    assert not heartbeat_only(NODE, rebuilt)
    replaced = copy.deepcopy(beat)
    replaced["metadata"]["uid"] = "u-2"
    assert not heartbeat_only(NODE, replaced)


def _rows(state: ClusterState) -> dict[str, Any]:
    return {row.id: row for row in state_watches(state, [("v1", "ServiceAccount")])}


def test_a_heartbeat_keeps_the_cached_node_and_wakes_nothing() -> None:
    state = ClusterState()
    record = _rows(state)["nodes"].record
    record("ADDED", NODE)
    first = state.nodes["linux-1"]
    state.trigger.clear()
    record("MODIFIED", _beat(NODE, "101", "2026-12-07T07:05:00Z"))
    assert state.nodes["linux-1"] is first
    assert not state.trigger.is_set()
    changed = _beat(NODE, "102", "2026-12-07T07:10:00Z")
    changed["metadata"]["labels"]["team"] = "a"
    record("MODIFIED", changed)
    assert state.nodes["linux-1"] is not first
    assert state.nodes["linux-1"]["metadata"]["labels"]["team"] == "a"
    assert state.trigger.is_set()


def test_the_node_watch_drops_a_heartbeat_before_it_reaches_the_loop() -> None:
    """What the nodes' informer asks on its own thread (app/watches.KindFeed.unchanged)."""
    state = ClusterState()
    rows = [row for row in state_watches(state, []) if row.kind.kind == "Node"]
    feed = KindFeed(rows[0].kind, rows)
    beat = _beat(NODE, "101", "2026-12-07T07:05:00Z")
    # A node the cache does not hold yet is news.
    assert not feed.unchanged(beat)
    rows[0].record("ADDED", NODE)
    assert feed.unchanged(beat)
    relabelled = copy.deepcopy(beat)
    relabelled["metadata"]["labels"]["team"] = "a"
    assert not feed.unchanged(relabelled)
    # A row of the kind that cannot answer, and selects the node, gets every event.
    deaf = Watched("deaf", rows[0].kind, lambda _e, _b: None)
    assert not KindFeed(rows[0].kind, [*rows, deaf]).unchanged(beat)
    # One that does not select it has no say.
    elsewhere = Watched("elsewhere", rows[0].kind, lambda _e, _b: None, labels={"team": "b"})
    assert KindFeed(rows[0].kind, [*rows, elsewhere]).unchanged(beat)


def test_the_data_planes_rows_keep_only_its_own_objects() -> None:
    row = _rows(ClusterState())["owned-serviceaccounts"]
    assert row.labels == {
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_CONTROLLER: "dataplane",
    }
