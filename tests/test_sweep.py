"""Forgetting objects deleted while no watch looked (kube/sweep.py), against the real API server."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from ambient_devcluster import LocalCluster
from ambient_operator.kube.client import Kube, load_api_client
from ambient_operator.kube.resources import KINDS
from ambient_operator.kube.sweep import Key, Target, ghosts, sweep
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
    kube = Kube(load_api_client(str(cluster.kubeconfig)))
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
