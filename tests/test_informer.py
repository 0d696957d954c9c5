"""The operator's own list-and-watch (kube/informer.py) against the real API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster, api_client_for
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.informer import Change, Informer, Listed, ghosts, key_of, not_listed
from ambient_operator.kube.resources import KINDS, Kind
from conftest import unique_name, wait_for

CONFIG_MAP = KINDS[("v1", "ConfigMap")]


class Store:
    """A consumer: what the informer said exists, and every batch it delivered."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], str] = {}
        self.deleted: list[tuple[str, str]] = []
        self.last_states: list[str | None] = []  # of each deletion, None when unseen
        self.lists: list[Listed] = []
        self.on_loop = True
        self._lock = threading.Lock()

    def deliver(self, changes: list[Change[str]]) -> None:
        # The informer promises delivery on the event loop, never on its own thread.
        self.on_loop = self.on_loop and threading.current_thread().name == "test-loop"
        with self._lock:
            for change in changes:
                if change.type == "DELETED":
                    self.items.pop(change.key, None)
                    self.deleted.append(change.key)
                    self.last_states.append(change.record)
                else:
                    self.items[change.key] = change.record

    def listed(self, listed: Listed) -> None:
        self.lists.append(listed)

    def snapshot(self) -> dict[tuple[str, str], str]:
        with self._lock:
            return dict(self.items)


def _record(obj: Mapping[str, Any]) -> str:
    return str((obj.get("data") or {}).get("v"))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, name="test-loop", daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def _informer(
    cluster: LocalCluster,
    label: str,
    deliver: Callable[[list[Change[str]]], None],
    loop: asyncio.AbstractEventLoop,
    *,
    record: Callable[[Mapping[str, Any]], str] = _record,
    **options: Any,
) -> Informer[str]:
    """An informer of the ConfigMaps under `label`, to the test's consumer."""
    return Informer(
        Kube(load_credentials(str(cluster.kubeconfig))),
        CONFIG_MAP,
        record,
        deliver,
        loop,
        label_selector=f"informer-test={label}",
        **options,
    )


def _config_map(name: str, label: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"informer-test": label}}, "data": {"v": value}}


def _five_config_maps(core: client.CoreV1Api, namespace: str) -> str:
    """cm-0 to cm-4, data v = their number, under a label of their own; the label."""
    label = unique_name("inf")
    for i in range(5):
        core.create_namespaced_config_map(namespace, _config_map(f"cm-{i}", label, str(i)))
    return label


def test_lists_in_pages_then_follows_changes(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    core = client.CoreV1Api(k8s)
    label = _five_config_maps(core, namespace)
    store = Store()
    informer = Informer(
        Kube(load_credentials(str(cluster.kubeconfig))),
        CONFIG_MAP,
        _record,
        store.deliver,
        loop,
        label_selector=f"informer-test={label}",
        page_size=2,  # three pages
        listed=store.listed,
    )
    informer.start()
    try:
        assert informer.wait_synced(30), "the first list never reached the consumer"
        assert store.snapshot() == {(namespace, f"cm-{i}"): str(i) for i in range(5)}
        # The end of the list, after its changes: every key, at the list's version.
        first = core.list_namespaced_config_map(namespace).metadata.resource_version
        [listed] = store.lists
        assert listed.keys == {(namespace, f"cm-{i}") for i in range(5)}
        assert 0 < listed.version <= int(first)

        core.create_namespaced_config_map(namespace, _config_map("cm-new", label, "new"))
        core.patch_namespaced_config_map("cm-0", namespace, {"data": {"v": "changed"}})
        core.delete_namespaced_config_map("cm-1", namespace)
        # Outside the selector: never delivered.
        core.create_namespaced_config_map(namespace, _config_map("other", "nope", "x"))
        want = {(namespace, f"cm-{i}"): str(i) for i in range(2, 5)}
        want |= {(namespace, "cm-0"): "changed", (namespace, "cm-new"): "new"}
        wait_for(lambda: store.snapshot() == want, 30, f"the store to become {want}")
        assert (namespace, "cm-1") in store.deleted
        # A deletion the watch reported comes with the object's last state.
        assert store.last_states == ["1"]
        assert store.on_loop
        assert informer.lists == 1
    finally:
        informer.stop()
    assert informer._thread is not None and not informer._thread.is_alive()


def test_a_relist_forgets_what_vanished_unseen(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """Deletions missed while not watching come out of the next list as deletions."""
    core = client.CoreV1Api(k8s)
    label = unique_name("inf")
    core.create_namespaced_config_map(namespace, _config_map("kept", label, "1"))
    store = Store()
    kube = Kube(load_credentials(str(cluster.kubeconfig)))
    informer = Informer(
        kube, CONFIG_MAP, _record, store.deliver, loop, label_selector=f"informer-test={label}"
    )
    # As if an earlier list had seen an object that was deleted while the watch was down.
    informer._known = {(namespace, "gone")}
    loop.call_soon_threadsafe(store.deliver, [Change("ADDED", (namespace, "gone"), "0")])
    informer.start()
    try:
        assert informer.wait_synced(30)
        wait_for(lambda: store.snapshot() == {(namespace, "kept"): "1"}, 30, "the relist")
        assert (namespace, "gone") in store.deleted
        assert store.last_states == [None]  # never seen going: no last state
    finally:
        informer.stop()


def test_an_expired_version_lists_again(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> None:
    """A watch from a compacted-away version (410 Gone) is answered with a fresh list.

    On a private control plane that serves ConfigMap watches straight from etcd
    (no watch cache, which would serve old versions from memory): after the
    first list, etcd is compacted past the list's version, so the watch that
    follows gets a genuine 410 from the API server.
    """
    with (
        LocalCluster(
            tmp_path / "cluster",
            verbose=False,
            extra_args={"kube-apiserver": ["--watch-cache-sizes=configmaps#0"]},
        ) as private,
        api_client_for(private.kubeconfig) as api,
    ):
        core = client.CoreV1Api(api)
        core.create_namespaced_config_map("default", _config_map("a", "x", "1"))
        store = Store()
        informer = Informer(
            Kube(load_credentials(str(private.kubeconfig))),
            CONFIG_MAP,
            _record,
            store.deliver,
            loop,
            label_selector="informer-test=x",
        )
        real_list = informer._list

        def list_then_compact() -> str:
            version = real_list()
            if informer.lists == 1:
                # Move etcd on, then compact away everything up to now.
                core.create_namespaced_config_map("default", _config_map("b", "x", "2"))
                core.create_namespaced_config_map("default", _config_map("filler", "y", "0"))
                # Compaction keeps the revision it is given: the filler's. The
                # watch asks for what followed the list, "b" included: gone.
                now = core.list_namespaced_config_map("default").metadata.resource_version
                body = json.dumps({"revision": now, "physical": True}).encode()
                request = urllib.request.Request(
                    f"{private.etcd_url}/v3/kv/compaction", data=body, method="POST"
                )
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
            return version

        informer._list = list_then_compact  # type: ignore[method-assign]
        informer.start()
        try:
            wait_for(lambda: informer.lists >= 2, 30, "a second list after the 410")
            core.create_namespaced_config_map("default", _config_map("c", "x", "3"))
            want = {("default", "a"): "1", ("default", "b"): "2", ("default", "c"): "3"}
            wait_for(lambda: store.snapshot() == want, 30, "the watch after the relist")
        finally:
            informer.stop()


def test_stop_tolerates_a_watch_that_closed_meanwhile(loop: asyncio.AbstractEventLoop) -> None:
    """Seen in the suite: the watch ended on its own as stop() cut it (EBADF)."""

    class Closed:
        def shutdown(self) -> None:
            raise OSError(9, "Bad file descriptor")

    informer: Informer[str] = Informer(
        None,  # type: ignore[arg-type]  # never used: the thread is not started
        CONFIG_MAP,
        _record,
        lambda changes: None,
        loop,
    )
    informer._response = Closed()  # type: ignore[assignment]
    informer.stop()  # no exception


def test_ghosts_are_cached_unlisted_and_not_newer_than_the_list() -> None:
    def at(version: int | str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": str(version)}}

    cached = {
        ("ns", "listed"): at(5),
        ("ns", "gone"): at(7),  # last seen before the list: deleted unseen
        ("ns", "newer"): at(12),  # seen after the list was taken: kept
        ("ns", "no-version"): {"metadata": {}},  # nothing to compare: kept
        ("ns", "at-the-list"): at(10),
    }
    listed = Listed(frozenset({("ns", "listed")}), 10)
    assert ghosts(cached, listed) == [("ns", "at-the-list"), ("ns", "gone")]


def test_a_kind_served_later_is_listed_and_watched_once_it_is(
    cluster: LocalCluster, k8s: client.ApiClient, loop: asyncio.AbstractEventLoop
) -> None:
    """Gateway API installed after the operator started: its kind is asked for again."""
    group = f"{unique_name('later').replace('-', '')}.example.com"
    kind = Kind(f"{group}/v1", "Widget", "widgets", namespaced=False)
    store = Store()
    kube = _CountingLists(load_credentials(str(cluster.kubeconfig)))
    informer: Informer[str] = Informer(
        kube,
        kind,
        lambda obj: str((obj.get("spec") or {}).get("v")),
        store.deliver,
        loop,
        listed=store.listed,
        not_served_seconds=0.2,
    )
    informer.start()
    extensions = client.ApiextensionsV1Api(k8s)
    try:
        # Not served: listed as empty, so a start-up waiting for it is not held up.
        assert informer.wait_synced(30)
        assert store.lists[0].keys == frozenset()
        wait_for(lambda: kube.lists >= 3, 30, "the kind asked for again")
        extensions.create_custom_resource_definition(
            {
                "metadata": {"name": f"widgets.{group}"},
                "spec": {
                    "group": group,
                    "scope": "Cluster",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            }
        )
        custom = client.CustomObjectsApi(k8s)
        wait_for(
            lambda: _created(custom, group, {"metadata": {"name": "w"}, "spec": {"v": 1}}),
            30,
            "the CRD served",
        )
        wait_for(lambda: store.snapshot() == {("", "w"): "1"}, 30, "the widget listed")
        # Asked for every 0.2 s meanwhile, but told of two lists only: the one
        # that found the kind missing, and the first once it was served.
        assert len(store.lists) == 2, store.lists
        custom.patch_cluster_custom_object(group, "v1", "widgets", "w", {"spec": {"v": 2}})
        wait_for(lambda: store.snapshot() == {("", "w"): "2"}, 30, "the widget watched")
    finally:
        informer.stop()
        extensions.delete_custom_resource_definition(f"widgets.{group}")


class _CountingLists(Kube):
    """A Kube that counts the list requests made through it."""

    lists = 0

    def pages(self, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.lists += 1
        return super().pages(*args, **kwargs)


def _created(custom: Any, group: str, body: dict[str, Any]) -> bool:
    try:
        body = {"apiVersion": f"{group}/v1", "kind": "Widget", **body}
        custom.create_cluster_custom_object(group, "v1", "widgets", body)
    except client.ApiException as exc:
        if exc.status == 404:  # not served yet
            return False
        raise
    return True


def test_a_refused_list_ends_the_wait_and_says_why_until_rbac_allows_it(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """A 403 is not waited out: start-up names the kind and the refusal at once, and retries."""
    core, rbac = client.CoreV1Api(k8s), client.RbacAuthorizationV1Api(k8s)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    kube = Kube(load_credentials(str(cluster.serviceaccount_kubeconfig(namespace, "reader"))))
    store = Store()
    informer: Informer[str] = Informer(kube, CONFIG_MAP, _record, store.deliver, loop)
    informer.start()
    grant = unique_name("reader")
    try:
        # No timeout: only the refusal can end this wait, which a deadline bounds.
        waited: list[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(informer.wait_synced(None)))
        waiter.start()
        waiter.join(60)
        assert waited == [False], "the wait went on past the refusal"
        assert informer.refused is not None and "forbidden" in informer.refused, informer.refused
        assert not_listed([informer], 0) == [f"configmaps ({informer.refused})"]

        rbac.create_cluster_role(
            {
                "metadata": {"name": grant},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}
                ],
            }
        )
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": grant},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": grant,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            }
        )
        # Allowed now: the informer's own retries list the kind.
        wait_for(informer.synced.is_set, 60, "the list once RBAC allows it")
        assert informer.refused is None
        assert not_listed([informer], 0) == []
    finally:
        informer.stop()
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            with contextlib.suppress(client.exceptions.ApiException):
                delete(grant)


def test_holds_knows_what_was_delivered_and_deletions_can_come_bare(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """`holds` is never behind the consumer, even within a list; `last_states` False."""
    core = client.CoreV1Api(k8s)
    label = _five_config_maps(core, namespace)
    store = Store()
    behind: list[tuple[str, str]] = []
    made: list[str] = []

    def record(obj: Mapping[str, Any]) -> str:
        made.append(str(obj["metadata"]["name"]))
        return _record(obj)

    def deliver(changes: list[Change[str]]) -> None:
        # A consumer that holds a key its informer's `holds` denies would let a
        # write go ahead on a name it could have known taken.
        behind.extend(c.key for c in changes if c.type != "DELETED" and not informer.holds(c.key))
        store.deliver(changes)

    informer = _informer(
        cluster,
        label,
        deliver,
        loop,
        record=record,
        page_size=2,  # three pages, delivered one by one
        last_states=False,
    )
    informer.start()
    try:
        assert informer.wait_synced(30)
        assert len(store.snapshot()) == 5
        assert behind == []
        assert informer.holds((namespace, "cm-0")) and not informer.holds((namespace, "cm-x"))
        core.delete_namespaced_config_map("cm-0", namespace)
        wait_for(lambda: (namespace, "cm-0") in store.deleted, 30, "the deletion")
        assert store.last_states == [None]  # no record made of the deleted object
        assert made.count("cm-0") == 1  # only when it was listed
        assert not informer.holds((namespace, "cm-0"))
    finally:
        informer.stop()


def test_an_unchanged_modification_is_dropped_on_the_informers_thread(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str, loop: asyncio.AbstractEventLoop
) -> None:
    """`unchanged` is asked about a modified object only while the consumer holds
    every change before it; a change still on its way sends the next one to the loop."""
    core = client.CoreV1Api(k8s)
    label = _five_config_maps(core, namespace)
    store = Store()
    delivered: list[tuple[str, str]] = []

    def deliver(changes: list[Change[str]]) -> None:
        delivered.extend(change.key for change in changes)
        store.deliver(changes)

    def unchanged(obj: Mapping[str, Any]) -> bool:
        # The store keeps the data alone: an annotation changes nothing it keeps.
        return store.snapshot().get(key_of(obj)) == _record(obj)

    informer = _informer(cluster, label, deliver, loop, unchanged=unchanged)
    cm0, cm2 = (namespace, "cm-0"), (namespace, "cm-2")
    holding, release = threading.Event(), threading.Event()
    informer.start()
    try:
        assert informer.wait_synced(30), "the first list never reached the consumer"
        delivered.clear()
        core.patch_namespaced_config_map(
            "cm-0", namespace, {"metadata": {"annotations": {"a": "1"}}}
        )
        # A barrier: cm-2's change comes after it on the same watch.
        core.patch_namespaced_config_map("cm-2", namespace, {"data": {"v": "two"}})
        wait_for(lambda: store.snapshot()[cm2] == "two", 30, "cm-2's change")
        assert delivered == [cm2]
        assert informer.dropped == 1

        # The loop held: a change of cm-0 and its undoing wait in turn. The
        # undoing looks unchanged to a store that has not had the change yet.
        def hold() -> None:
            holding.set()
            release.wait(30)

        loop.call_soon_threadsafe(hold)
        assert holding.wait(10)
        core.patch_namespaced_config_map("cm-0", namespace, {"data": {"v": "x"}})
        core.patch_namespaced_config_map("cm-0", namespace, {"data": {"v": "0"}})
        wait_for(lambda: len(informer._pending) == 2, 30, "both of cm-0's changes to wait")
        release.set()
        core.patch_namespaced_config_map("cm-2", namespace, {"data": {"v": "2 again"}})
        wait_for(lambda: store.snapshot()[cm2] == "2 again", 30, "cm-2's second change")
        assert store.snapshot()[cm0] == "0"
        assert delivered == [cm2, cm0, cm0, cm2]
        assert informer.dropped == 1
    finally:
        release.set()
        informer.stop()
