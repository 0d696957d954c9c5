"""Placement holds for any inventory, judged by an oracle that shares no code with render.

tests/oracle.py decides from the documented rules which platform each node
belongs to (or why it gets nothing) and where each DaemonSet must land; it
evaluates the rendered pod templates with its own reading of Kubernetes'
scheduling rules (nodeSelector, required node affinity, taints and the
DaemonSet controller's own tolerations). Render's answer must match it.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.cluster.node_table import NodeTable, PerNode
from ambient_operator.render import output, render_dataplane
from ambient_operator.render.dataplane import RenderMemo
from ambient_operator.render.model import RenderResult
from conftest import examples
from render_cases import SAMPLE_MESH, SAMPLE_NODES

OSES = ["linux", "windows", "freebsd", None]
ARCHES = ["amd64", "arm64", "s390x", None]
BUILDS = ["10.0.17763", "10.0.14393", "10.0.20348", "10.0.26100", "10.0.25398", "garbage", None]
OS_IMAGES = [
    None,
    "Windows Server 2019 Datacenter",
    "Windows Server 2022 Datacenter",
    "Windows Server 2025 Datacenter",
    "Ubuntu 24.04.1 LTS",
]
TAINTS = [
    {"key": "os", "value": "windows", "effect": "NoSchedule"},
    {"key": "os", "value": "linux", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "gpu", "effect": "NoExecute"},
    {"key": "dedicated", "effect": "NoSchedule"},
    {"key": "busy", "effect": "PreferNoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},
]


@st.composite
def api_node(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A Node in API form with any mix of labels, nodeInfo and taints."""
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    info: dict[str, str] = {}
    os_name = draw(st.sampled_from(OSES))
    if os_name and draw(st.booleans()):
        labels[oracle.OS_LABEL] = os_name
    # nodeInfo may be missing, agree, or (rarely in life) disagree with the label.
    info_os = draw(st.sampled_from([os_name, os_name, None, "windows", "linux"]))
    if info_os:
        info["operatingSystem"] = info_os
    arch = draw(st.sampled_from(ARCHES))
    if arch and draw(st.booleans()):
        labels[oracle.ARCH_LABEL] = arch
    info_arch = draw(st.sampled_from([arch, arch, None, "amd64"]))
    if info_arch:
        info["architecture"] = info_arch
    build = draw(st.sampled_from(BUILDS))
    if build and draw(st.booleans()):
        labels[oracle.BUILD_LABEL] = build
    kernel_build = draw(st.sampled_from([build, build, None, "10.0.20348", "6.8.0"]))
    if kernel_build:
        suffix = draw(st.sampled_from(["", ".7", ".2762", " ", "-azure"]))
        info["kernelVersion"] = f"{kernel_build}{suffix}"
    image = draw(st.sampled_from(OS_IMAGES))
    if image:
        info["osImage"] = image
    if draw(st.booleans()):
        labels["ambient"] = draw(st.sampled_from(["yes", "no"]))
    taints = draw(st.lists(st.sampled_from(TAINTS), max_size=3, unique_by=lambda t: t["key"]))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"nodeInfo": info},
    }


@st.composite
def inventory(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9-]{0,14}[a-z0-9]", fullmatch=True),
            min_size=0,
            max_size=14,
            unique=True,
        )
    )
    return [draw(api_node(name)) for name in names]


TOLERATION_CHOICES = [
    None,
    [],
    [{"key": "os", "operator": "Exists"}],
    [{"operator": "Exists", "effect": "NoSchedule"}],
    [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
    [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
]


@st.composite
def mesh_spec(draw: st.DrawFn) -> dict[str, Any]:
    """A spec in its API form (the oracle reads that, render reads the model of it)."""
    windows: dict[str, Any] = {"enabled": draw(st.booleans())}
    builds = draw(
        st.sampled_from([None, [], ["10.0.20348"], ["10.0.26100"], ["10.0.20348", "10.0.26100"]])
    )
    if builds is not None:
        windows["builds"] = builds
    linux: dict[str, Any] = {"enabled": draw(st.booleans())}
    for platform in (linux, windows):
        if draw(st.integers(0, 3)) == 0:
            platform["nodeSelector"] = {"ambient": "yes"}
        tolerations = draw(st.sampled_from(TOLERATION_CHOICES))
        if tolerations is not None:
            platform["tolerations"] = tolerations
    spec: dict[str, Any] = {"platforms": {"linux": linux, "windows": windows}}
    # What Istio's chart values become (api/helm_values.py): valid values only here.
    for component in ("ztunnel", "istioCni"):
        agent: dict[str, Any] = {}
        if draw(st.booleans()):
            agent["env"] = draw(
                st.dictionaries(st.sampled_from(USER_ENV), st.just("x"), max_size=3)
            )
        if draw(st.booleans()):
            agent["podLabels"] = draw(
                st.dictionaries(st.sampled_from(USER_LABELS), st.just("x"), max_size=3)
            )
        if draw(st.booleans()):
            agent["podAnnotations"] = {"sidecar.istio.io/inject": "true", "team": "x"}
        if agent:
            spec[component] = agent
    if draw(st.booleans()):
        spec["multiCluster"] = {"clusterName": draw(st.sampled_from(["west", "Kubernetes"]))}
        spec["network"] = draw(st.sampled_from(["net1", "net-2"]))
    if draw(st.booleans()):
        spec["images"] = {"pullSecrets": ["key"], "pullPolicy": "Always"}
    if draw(st.booleans()):
        cni = spec.setdefault("istioCni", {})
        cni["provider"] = draw(st.sampled_from(["default", "multus"]))
        cni["repairMode"] = draw(st.sampled_from(["Repair", "Delete", "Label"]))
    return spec


# Names a user may give, some of them the operator's own (which it keeps).
USER_ENV = ["CUSTOM", "NETWORK", "INPOD_UDS", "XDS_ADDRESS", "NODE_NAME", "ZTUNNEL_WORKER_THREADS"]
USER_LABELS = ["team", "app.kubernetes.io/name", "ambientoperator.io/platform", "app", "k8s-app"]


@settings(max_examples=examples(1400))
@given(nodes=inventory(), spec=mesh_spec(), istiod=st.sampled_from([None, "10.0.0.9"]))
def test_placement_matches_the_oracle(
    nodes: list[dict[str, Any]], spec: dict[str, Any], istiod: str | None
) -> None:
    result = render_dataplane(
        AmbientMeshSpec.model_validate(spec),
        ClusterFacts.from_nodes(nodes, istiod_ip=istiod, dns_ip="10.0.0.10"),
    )
    _assert_matches_the_oracle(result, spec, nodes)


def _assert_matches_the_oracle(
    result: RenderResult, spec: dict[str, Any], nodes: list[dict[str, Any]]
) -> None:
    judged = [oracle.Node.of(n) for n in nodes]
    expected = oracle.placement(spec, judged)

    daemonsets = {o["metadata"]["name"]: o for o in result.objects if o["kind"] == "DaemonSet"}
    assert set(daemonsets) == set(expected)
    for name, ds in daemonsets.items():
        pod = ds["spec"]["template"]["spec"]
        landed = {n.name for n in judged if oracle.daemon_pod_lands(pod, n)}
        assert landed == expected[name], (name, pod.get("nodeSelector"), pod.get("affinity"))
        assert pod["os"]["name"] == (
            "linux" if name in ("ztunnel", "istio-cni-node") else "windows"
        )
    # What render promised (the plans the status reports) is the same.
    assert {p.name: frozenset(p.nodes) for p in result.daemonsets} == expected

    verdicts = {v.node: v for v in result.verdicts}
    assert [v.node for v in result.verdicts] == sorted(n.name for n in judged)
    for node in judged:
        platform, reason = oracle.verdict(node, spec)
        got = verdicts[node.name]
        assert (got.platform if got.supported else None, got.reason) == (platform, reason), node

    # The status's counts, from the oracle's verdicts.
    counted = Counter((n.os, n.build, oracle.verdict(n, spec)[0] is not None) for n in judged)
    tally = result.tally
    assert {k: v for k, v in tally.counts.items()} == dict(counted)
    assert [v.node for v in tally.unsupported] == sorted(
        n.name for n in judged if oracle.verdict(n, spec)[0] is None
    )
    assert list(tally.windows_served) == sorted(
        n.name for n in judged if n.os == "windows" and oracle.verdict(n, spec)[0] is not None
    )

    keys = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        for o in result.objects
    }
    assert keys == oracle.objects(spec, judged)


# A pool of names, so that steps replace and remove nodes as well as add them.
NODE_NAMES = [f"node-{i}" for i in range(3)]


@st.composite
def node_steps(draw: st.DrawFn) -> list[list[tuple[str, dict[str, Any] | None]]]:
    """Steps of node changes: each a few (name, its new Node, or None: it went)."""
    steps = []
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        step = []
        for name in draw(st.lists(st.sampled_from(NODE_NAMES), min_size=1, max_size=3)):
            step.append((name, draw(st.one_of(st.none(), api_node(name)))))
        steps.append(step)
    return steps


@settings(max_examples=examples(1500))
@given(
    steps=node_steps(),
    specs=st.lists(mesh_spec(), min_size=1, max_size=2),
    spec_at=st.integers(min_value=0, max_value=8),
)
def test_a_render_kept_across_node_changes_matches_the_oracle(
    steps: list[list[tuple[str, dict[str, Any] | None]]],
    specs: list[dict[str, Any]],
    spec_at: int,
) -> None:
    """The operator's path: the Node cache, its per-node readings and one RenderMemo,
    which judges only the nodes the readings say changed (and all, after the spec's)."""
    table = NodeTable()
    readings = PerNode(NodeFacts.from_node)
    memo = RenderMemo()
    bare = ClusterFacts.from_nodes([], istiod_ip="10.0.0.9", dns_ip="10.0.0.10")
    for at, step in enumerate(steps):
        for name, body in step:
            if body is None:
                table.pop(name, None)
            else:
                table[name] = body
        # The second spec, if any, from step `spec_at` on.
        spec = specs[-1] if at >= spec_at else specs[0]
        facts = dataclasses.replace(bare, nodes=readings.update(table))
        model = AmbientMeshSpec.model_validate(spec)
        result = render_dataplane(model, facts, memo=memo)
        _assert_matches_the_oracle(result, spec, list(table.values()))
        # And the objects are the ones a render from nothing kept makes (the
        # oracle judges where pods land, not how the selection is spelt).
        fresh = render_dataplane(model, dataclasses.replace(facts, nodes=tuple(facts.nodes)))
        assert result.objects == fresh.objects


def test_the_oracle_places_the_sample_inventory() -> None:
    """The oracle itself, against placement written out by hand for the sample nodes."""
    nodes = [oracle.Node.of(n) for n in yaml.safe_load(SAMPLE_NODES.read_text())["items"]]
    spec = yaml.safe_load(SAMPLE_MESH.read_text())["spec"]
    linux = frozenset({"linux-amd64-1", "linux-amd64-2", "linux-arm64-1"})
    assert oracle.placement(spec, nodes) == {
        "istio-cni-node": linux,
        "ztunnel": linux,
        "istio-cni-node-windows-ltsc2022": frozenset({"win2022-1"}),
        "ztunnel-windows-ltsc2022": frozenset({"win2022-1"}),
        "istio-cni-node-windows-ltsc2025": frozenset({"win2025-1"}),
        "ztunnel-windows-ltsc2025": frozenset({"win2025-1"}),
    }
    assert {n.name: oracle.verdict(n, spec) for n in nodes} == {
        "linux-amd64-1": ("linux", None),
        "linux-amd64-2": ("linux", None),
        "linux-arm64-1": ("linux", None),
        "win2022-1": ("10.0.20348", None),
        "win2025-1": ("10.0.26100", None),
        "win2019-1": (None, "WindowsBuildUnsupported"),
    }
    # Builds listed: exactly these, present or not; the others are left out on purpose.
    narrowed = {"platforms": {"windows": {"builds": ["10.0.20348"]}}}
    assert set(oracle.placement(narrowed, nodes)) == {
        "istio-cni-node",
        "ztunnel",
        "istio-cni-node-windows-ltsc2022",
        "ztunnel-windows-ltsc2022",
    }
    assert oracle.verdict(nodes[4], narrowed) == (None, "WindowsBuildNotEnabled")


@settings(max_examples=examples(100))
@given(nodes=inventory(), spec=mesh_spec(), seed=st.integers(0, 2**32 - 1))
def test_rendering_is_deterministic(
    nodes: list[dict[str, Any]], spec: dict[str, Any], seed: int
) -> None:
    model = AmbientMeshSpec.model_validate(spec)
    facts = ClusterFacts.from_nodes(nodes, istiod_ip="10.0.0.9", dns_ip="10.0.0.10")
    first = render_dataplane(model, facts)
    again = render_dataplane(model, facts)
    shuffled_nodes = list(facts.nodes)
    random.Random(seed).shuffle(shuffled_nodes)
    shuffled = render_dataplane(
        model, ClusterFacts(tuple(shuffled_nodes), facts.istiod_ip, facts.dns_ip)
    )
    text = output.to_yaml(first.objects)
    assert output.to_yaml(again.objects) == text
    assert output.to_yaml(shuffled.objects) == text
    assert first == again == shuffled


@settings(max_examples=examples(200))
@given(nodes=inventory(), spec=mesh_spec())
def test_what_users_add_never_breaks_an_agent(
    nodes: list[dict[str, Any]], spec: dict[str, Any]
) -> None:
    # Linux agents render with no Linux node at all: every example has some to judge.
    spec["platforms"]["linux"]["enabled"] = True
    result = render_dataplane(
        AmbientMeshSpec.model_validate(spec),
        ClusterFacts.from_nodes(nodes, istiod_ip="10.0.0.9", dns_ip="10.0.0.10"),
    )
    daemonsets = [o for o in result.objects if o["kind"] == "DaemonSet"]
    assert daemonsets
    for ds in daemonsets:
        template = ds["spec"]["template"]
        selector = ds["spec"]["selector"]["matchLabels"]
        # The selector still picks the pods, whatever labels the user adds.
        assert selector.items() <= template["metadata"]["labels"].items()
        # The agents never get a sidecar of their own.
        assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        for container in template["spec"]["containers"]:
            names = [e["name"] for e in container.get("env") or []]
            assert len(names) == len(set(names)), (ds["metadata"]["name"], names)


def test_facts_round_trip_through_api_form() -> None:
    # The property tests build facts from API JSON; make sure that path keeps labels.
    node = NodeFacts.from_node(
        {"metadata": {"name": "n", "labels": {oracle.OS_LABEL: "linux"}}, "status": {}}
    )
    assert node.labels == {oracle.OS_LABEL: "linux"}
