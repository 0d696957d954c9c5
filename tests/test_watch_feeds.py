"""The watch table on the operator's informers (app/watches.py), against the real API server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from prometheus_client import REGISTRY

from ambient_devcluster import LocalCluster
from ambient_operator.app.watches import Watches, server_selector
from ambient_operator.cluster.watches import Watched
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.informer import not_listed
from ambient_operator.kube.resources import KINDS
from conftest import wait_for
from test_informer import loop

__all__ = ["loop"]  # the event loop fixture, reused
CONFIG_MAP = KINDS[("v1", "ConfigMap")]


class Seen:
    """A row's record function: every (event, name) it was given."""

    def __init__(self) -> None:
        self.events: list[tuple[str | None, str]] = []
        self._lock = threading.Lock()

    def __call__(self, event: str | None, body: Mapping[str, Any]) -> None:
        with self._lock:
            self.events.append((event, str(body["metadata"]["name"])))

    def names(self, event: str = "ADDED") -> set[str]:
        with self._lock:
            return {name for seen, name in self.events if seen == event}


def test_the_server_filters_only_what_every_row_of_a_kind_asks_for() -> None:
    def row(labels: dict[str, str | None] | None, every_name: bool = False) -> Watched:
        return Watched("r", CONFIG_MAP, lambda _e, _b: None, labels=labels, every_name=every_name)

    assert server_selector([row({"a": "1", "b": None}), row({"a": "1"})]) == "a=1"
    assert server_selector([row({"a": "1", "b": None}), row({"b": None, "c": "2"})]) == "b"
    assert server_selector([row({"a": "1"}), row(None)]) is None  # one row sees everything
    assert server_selector([row({"a": "1"}), row({"a": "2"})]) is None
    # A row that must know every name of the kind (a waypoint's objects) is not filtered.
    assert server_selector([row({"a": "1"}), row({"a": "1"}, every_name=True)]) is None


def test_rows_of_one_kind_share_one_watch_and_see_what_their_filters_pass(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    core = client.CoreV1Api(k8s)
    ours = {"feed-test": namespace}
    for name, labels in [
        ("plain", {}),
        ("labelled", ours),
        ("tiered", {**ours, "tier": "x"}),
        ("b-named", {}),
    ]:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": labels}})
    labelled, tiered, named = Seen(), Seen(), Seen()

    def in_test(name: str, ns: str, _labels: Mapping[str, str]) -> bool:
        return ns == namespace and name.startswith("b-")

    table = [
        Watched("labelled", CONFIG_MAP, labelled, labels=dict(ours)),
        Watched("tiered", CONFIG_MAP, tiered, labels={**ours, "tier": None}),
        Watched("named", CONFIG_MAP, named, when=in_test),
    ]
    watches = Watches(Kube(load_credentials(str(cluster.kubeconfig))), table)
    watches.start(loop)
    try:
        assert not_listed(watches.informers, 30) == []
        assert len(watches.informers) == 1  # one list and one watch for the kind
        assert labelled.names() == {"labelled", "tiered"}
        assert tiered.names() == {"tiered"}
        assert named.names() == {"b-named"}
        core.delete_namespaced_config_map("tiered", namespace)
        wait_for(lambda: "tiered" in tiered.names("DELETED"), 30, "the deletion")
        assert labelled.names("DELETED") == {"tiered"}
        assert named.names("DELETED") == set()
    finally:
        watches.stop()


def _ghosts_counted() -> float:
    return (
        REGISTRY.get_sample_value("ambient_operator_cache_ghosts_total", {"kind": "ConfigMap"})
        or 0.0
    )


def test_a_list_forgets_what_a_cache_holds_and_the_cluster_no_longer_does(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """What a write's response put in a cache, deleted before any event told of it."""
    core = client.CoreV1Api(k8s)
    label = {"feed-test": namespace}
    kept = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "kept", "labels": label}}
    )
    gone = core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "gone", "labels": label}}
    )
    core.delete_namespaced_config_map("gone", namespace)
    cache: dict[tuple[str, str], dict[str, Any]] = {
        (namespace, "gone"): {"metadata": {"resourceVersion": gone.metadata.resource_version}},
        # Seen after any list this test takes: not the list's to judge.
        (namespace, "future"): {"metadata": {"resourceVersion": str(10**15)}},
    }
    forgotten: list[tuple[str, str]] = []

    def record(event: str | None, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event == "DELETED":
            cache.pop(key, None)
        else:
            cache[key] = {"metadata": {"resourceVersion": meta["resourceVersion"]}}

    def forget(key: tuple[str, str]) -> None:
        forgotten.append(key)
        cache.pop(key)

    row = Watched(
        "cms",
        CONFIG_MAP,
        record,
        labels=dict(label),
        cached=lambda: dict(cache),
        forget=forget,
    )
    before = _ghosts_counted()
    watches = Watches(Kube(load_credentials(str(cluster.kubeconfig))), [row])
    watches.start(loop)
    try:
        assert not_listed(watches.informers, 30) == []
        wait_for(lambda: forgotten == [(namespace, "gone")], 30, "the ghost forgotten")
        assert set(cache) == {(namespace, "kept"), (namespace, "future")}
        assert cache[(namespace, "kept")]["metadata"]["resourceVersion"] == (
            kept.metadata.resource_version
        )
        assert _ghosts_counted() == before + 1
    finally:
        watches.stop()


def test_a_kind_watched_whole_tells_which_names_are_taken(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """`seen`: True or False for a kind whose informer sees every object, else None."""
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "theirs"}})
    ours = {"feed-test": namespace}
    secret = KINDS[("v1", "Secret")]
    table = [
        Watched("cms", CONFIG_MAP, Seen(), labels=dict(ours), every_name=True),
        Watched("secrets", secret, Seen(), labels=dict(ours)),  # filtered by the server
    ]
    watches = Watches(Kube(load_credentials(str(cluster.kubeconfig))), table)
    # Before the lists nothing is known.
    assert watches.seen(CONFIG_MAP, (namespace, "theirs")) is None
    watches.start(loop)
    try:
        assert not_listed(watches.informers, 30) == []
        assert watches.seen(CONFIG_MAP, (namespace, "theirs")) is True  # no label of ours
        assert watches.seen(CONFIG_MAP, (namespace, "free")) is False
        assert watches.seen(secret, (namespace, "anything")) is None
        assert watches.seen(KINDS[("v1", "Node")], ("", "anything")) is None  # not watched
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "free"}})
        wait_for(
            lambda: watches.seen(CONFIG_MAP, (namespace, "free")), 30, "the new name seen taken"
        )
        core.delete_namespaced_config_map("theirs", namespace)
        wait_for(
            lambda: watches.seen(CONFIG_MAP, (namespace, "theirs")) is False,
            30,
            "the deleted name seen free",
        )
    finally:
        watches.stop()
