"""Forgetting objects deleted while no watch looked (kube/sweep.py), against the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubernetes import client

from ambient_devcluster import LocalCluster
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.resources import KINDS
from ambient_operator.kube.sweep import Key, Sweeps, Target, ghosts, sweep
from conftest import unique_name

CONFIG_MAP = KINDS[("v1", "ConfigMap")]


def _obj(rv: str | None) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}} if rv is not None else {"metadata": {}}


def test_ghosts_are_cached_unlisted_and_not_newer_than_the_list() -> None:
    cached = {
        ("", "listed"): _obj("5"),
        ("", "deleted-before-the-list"): _obj("7"),
        ("", "seen-after-the-list"): _obj("12"),  # created after the list: an event told us
        ("", "no-version"): _obj(None),  # cannot tell: kept
        ("", "at-the-list-version"): _obj("10"),
    }
    assert ghosts(cached, {("", "listed")}, 10) == [
        ("", "at-the-list-version"),
        ("", "deleted-before-the-list"),
    ]
    assert ghosts(cached, set(cached), 10) == []


def test_a_sweep_forgets_only_what_the_api_server_no_longer_has(
    k8s: client.ApiClient, cluster: LocalCluster
) -> None:
    kube = Kube(load_credentials(str(cluster.kubeconfig)))
    core = client.CoreV1Api(k8s)
    namespace = unique_name("sweep")
    core.create_namespace({"metadata": {"name": namespace}})
    label = {"sweep-test": namespace}
    try:
        live = []
        for i in range(3):
            live.append(
                core.create_namespaced_config_map(
                    namespace, {"metadata": {"name": f"cm-{i}", "labels": label}}
                )
            )
        gone = core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "gone", "labels": label}}
        )
        core.delete_namespaced_config_map("gone", namespace)
        cache: dict[Key, dict[str, Any]] = {
            (namespace, cm.metadata.name): {
                "metadata": {"resourceVersion": cm.metadata.resource_version}
            }
            for cm in [*live, gone]
        }
        # As if an event newer than any list told of an object created since.
        cache[(namespace, "from-the-future")] = {"metadata": {"resourceVersion": str(10**15)}}
        forgotten: list[Key] = []
        target = Target(
            CONFIG_MAP,
            lambda: dict(cache),
            lambda key: (forgotten.append(key), cache.pop(key)),
            label_selector=f"sweep-test={namespace}",
        )
        assert asyncio.run(sweep(kube, [target])) == 1
        assert forgotten == [(namespace, "gone")]
        assert set(cache) == {
            *((namespace, f"cm-{i}") for i in range(3)),
            (namespace, "from-the-future"),
        }
        # Nothing left to forget: a second sweep forgets nothing.
        assert asyncio.run(sweep(kube, [target])) == 0
    finally:
        core.delete_namespace(namespace)


def test_a_relisted_kind_is_swept_soon_and_only_it(
    k8s: client.ApiClient, cluster: LocalCluster
) -> None:
    """kopf reports no deletion when it lists again (after a 410): that kind is swept then."""
    kube = Kube(load_credentials(str(cluster.kubeconfig)))
    core = client.CoreV1Api(k8s)
    namespace = unique_name("relist")
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        gone = core.create_namespaced_config_map(namespace, {"metadata": {"name": "gone"}})
        core.delete_namespaced_config_map("gone", namespace)
        ghost = {
            (namespace, "gone"): {"metadata": {"resourceVersion": gone.metadata.resource_version}}
        }
        caches = {"relisted": dict(ghost), "quiet": dict(ghost)}
        forgotten: list[tuple[str, Key]] = []

        def target(row: str) -> Target:
            return Target(
                CONFIG_MAP,
                lambda: dict(caches[row]),
                lambda key: (forgotten.append((row, key)), caches[row].pop(key)),
                field_selector=f"metadata.namespace={namespace}",
            )

        async def scenario() -> None:
            # Neither the first sweep nor the period comes within the test.
            sweeps = Sweeps(kube, lambda: {r: target(r) for r in caches}, 3600, 3600, 0.05)
            running = asyncio.create_task(sweeps.run())
            sweeps.relisted("relisted")
            try:
                await asyncio.wait_for(_until(lambda: bool(forgotten)), 30)
            finally:
                running.cancel()

        asyncio.run(scenario())
        assert forgotten == [("relisted", (namespace, "gone"))]
        assert caches["quiet"] == ghost
    finally:
        core.delete_namespace(namespace)


async def _until(done: Callable[[], bool]) -> None:
    while not done():
        await asyncio.sleep(0.05)
