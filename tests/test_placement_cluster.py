"""Generated inventories on the real control plane: the DaemonSet controller places the pods.

Each run draws a few inventories (taints, extra labels, Windows nodes whose
build only the kernel version or the OS image tells) and specs (selectors,
tolerations, build lists), fresh every run; AMBIENT_PLACEMENT_SEED replays
one. Render's objects are applied in a namespace of their own; the real
DaemonSet controller and scheduler decide where pods go, and that must be
exactly where render's plans said, and where tests/oracle.py says.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, dynamic

import oracle
from ambient_devcluster import create_nodes, delete_nodes
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.render import render_dataplane
from conftest import ignoring, unique_name, wait_for

pytestmark = pytest.mark.cluster

INVENTORIES = 3
FIELD_MANAGER = "placement-cluster-test"
POOL = "ambient-test/placement"
WINDOWS_TAINT = {"key": "os", "value": "windows", "effect": "NoSchedule"}
TAINTS = [
    {"key": "dedicated", "value": "gpu", "effect": "NoExecute"},
    {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
    {"key": "busy", "effect": "PreferNoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},
]
# (os, arch, build, how the build is told: label, kernel or image)
SHAPES = [
    ("linux", "amd64", None, None),
    ("linux", "arm64", None, None),
    ("linux", "s390x", None, None),
    ("windows", "amd64", oracle.WS2022, "label"),
    ("windows", "amd64", oracle.WS2022, "kernel"),
    ("windows", "amd64", oracle.WS2025, "label"),
    ("windows", "amd64", oracle.WS2025, "image"),
    ("windows", "amd64", oracle.WS2019, "label"),
    ("windows", "amd64", None, None),
]
TOLERATIONS = [
    None,
    [{"key": "dedicated", "operator": "Exists"}],
    [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
    [{"operator": "Exists", "effect": "NoSchedule"}],
]


def _node(name: str, pool: str, rng: random.Random, shape: int | None = None) -> dict[str, Any]:
    os_name, arch, build, told = SHAPES[shape] if shape is not None else rng.choice(SHAPES)
    labels = {
        "kubernetes.io/hostname": name,
        oracle.OS_LABEL: os_name,
        oracle.ARCH_LABEL: arch,
        POOL: pool,
    }
    info = {"operatingSystem": os_name, "architecture": arch}
    if told == "label":
        labels[oracle.BUILD_LABEL] = str(build)
    if told in ("label", "kernel"):
        info["kernelVersion"] = f"{build}.{rng.randint(1, 7000)}"
    if told == "image":
        info["osImage"] = f"{oracle.RELEASE_NAMES[str(build)]} Datacenter"
    taints = [WINDOWS_TAINT] if os_name == "windows" and rng.random() < 0.8 else []
    if shape is None:
        if rng.random() < 0.5:
            labels["ambient"] = rng.choice(["yes", "no"])
        taints += rng.sample(TAINTS, rng.randint(0, 2))
    else:
        labels["ambient"] = "yes"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"nodeInfo": info},
    }


def _spec(namespace: str, pool: str, rng: random.Random) -> dict[str, Any]:
    platforms: dict[str, Any] = {}
    for os_name in ("linux", "windows"):
        selector = {POOL: pool}  # the rest of the session's nodes are not this test's
        if rng.random() < 0.3:
            selector["ambient"] = "yes"
        platform: dict[str, Any] = {"nodeSelector": selector}
        tolerations = rng.choice(TOLERATIONS)
        if tolerations is not None:
            platform["tolerations"] = tolerations
        platforms[os_name] = platform
    builds = rng.choice([None, None, [oracle.WS2022], [oracle.WS2025]])
    if builds is not None:
        platforms["windows"]["builds"] = builds
    return {"namespace": namespace, "platforms": platforms}


@pytest.fixture
def agents_namespace(k8s: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(k8s)
    name = unique_name("placement")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with ignoring(404):
        core.delete_namespace(name)


def _placed(core: client.CoreV1Api, namespace: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for pod in core.list_namespaced_pod(namespace).items:
        for ref in pod.metadata.owner_references or []:
            if ref.kind == "DaemonSet" and pod.spec.node_name:
                out.setdefault(ref.name, set()).add(pod.spec.node_name)
    return out


def _settled(
    apps: client.AppsV1Api, core: client.CoreV1Api, namespace: str, want: dict[str, frozenset[str]]
) -> bool:
    for ds in apps.list_namespaced_daemon_set(namespace).items:
        status = ds.status
        if status is None or status.observed_generation != ds.metadata.generation:
            return False
        if status.desired_number_scheduled != len(want[ds.metadata.name]):
            return False
    placed = _placed(core, namespace)
    return all(placed.get(name, set()) == set(nodes) for name, nodes in want.items())


@pytest.mark.parametrize("draw", range(INVENTORIES))
def test_generated_inventory_lands_where_render_promised(
    k8s: client.ApiClient, agents_namespace: str, draw: int
) -> None:
    given_seed = os.environ.get("AMBIENT_PLACEMENT_SEED")
    run_seed = int(given_seed) if given_seed else int.from_bytes(os.urandom(4), "big")
    rng = random.Random(run_seed + draw)
    pool = unique_name("pool")
    # Two nodes every spec serves (a plain Linux node, and a WS2022 node whose build only
    # its kernel version tells, unless the builds listed leave it out), then random ones.
    docs = [_node(f"{pool}-0", pool, rng, shape=0), _node(f"{pool}-1", pool, rng, shape=4)]
    docs += [_node(f"{pool}-{i}", pool, rng) for i in range(2, rng.randint(6, 10))]
    spec = _spec(agents_namespace, pool, rng)
    note = f"AMBIENT_PLACEMENT_SEED={run_seed} (draw {draw}): spec {spec}, nodes {docs}"
    names = create_nodes(k8s, copy.deepcopy(docs), timeout=120)
    try:
        live = [k8s.sanitize_for_serialization(n) for n in client.CoreV1Api(k8s).list_node().items]
        facts = ClusterFacts.from_nodes(live, istiod_ip="10.96.0.20", dns_ip="10.96.0.10")
        result = render_dataplane(AmbientMeshSpec.model_validate(spec), facts)
        promised = {p.name: frozenset(p.nodes) for p in result.daemonsets}
        judged = [oracle.Node.of(n) for n in live]
        assert promised == oracle.placement(spec, judged), note
        assert f"{pool}-0" in promised["ztunnel"], note

        dyn = dynamic.DynamicClient(k8s)
        for obj in result.objects:
            if "namespace" not in obj["metadata"]:
                continue  # placement needs no RBAC; the shared ClusterRole stays the operator's
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            dyn.server_side_apply(resource, body=copy.deepcopy(obj), field_manager=FIELD_MANAGER)
        apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
        try:
            wait_for(
                lambda: _settled(apps, core, agents_namespace, promised),
                timeout=90,
                message="the DaemonSet controller to place every pod",
            )
        except TimeoutError as exc:
            placed = _placed(core, agents_namespace)
            raise AssertionError(f"placed {placed}, promised {promised}; {note}") from exc
    finally:
        delete_nodes(k8s, names, wait=False)
