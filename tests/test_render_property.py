"""Placement holds for any inventory: each served node gets exactly one agent pair.

The rendered pod templates are evaluated with scheduling.py, as the
DaemonSet controller would, against each node's labels, name and taints.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient_operator import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.facts import ClusterFacts, NodeFacts
from ambient_operator.render import RenderResult, output, render_dataplane
from ambient_operator.scheduling import daemon_schedulable

OSES = ["linux", "windows", "freebsd", None]
ARCHES = ["amd64", "arm64", "s390x", None]
BUILDS = ["10.0.17763", "10.0.20348", "10.0.26100", "10.0.25398", "garbage", None]
TAINTS = [
    {"key": "os", "value": "windows", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "gpu", "effect": "NoExecute"},
    {"key": "busy", "effect": "PreferNoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},
]


@st.composite
def api_node(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A Node in API form with any mix of labels, nodeInfo and taints."""
    labels: dict[str, str] = {c.LABEL_HOSTNAME: name}
    info: dict[str, str] = {}
    os_name = draw(st.sampled_from(OSES))
    if os_name and draw(st.booleans()):
        labels[c.LABEL_OS] = os_name
    # nodeInfo may be missing, agree, or (rarely in life) disagree with the label.
    info_os = draw(st.sampled_from([os_name, os_name, None, "windows", "linux"]))
    if info_os:
        info["operatingSystem"] = info_os
    arch = draw(st.sampled_from(ARCHES))
    if arch and draw(st.booleans()):
        labels[c.LABEL_ARCH] = arch
    info_arch = draw(st.sampled_from([arch, arch, None, "amd64"]))
    if info_arch:
        info["architecture"] = info_arch
    build = draw(st.sampled_from(BUILDS))
    if build and draw(st.booleans()):
        labels[c.LABEL_WINDOWS_BUILD] = build
    kernel_build = draw(st.sampled_from([build, build, None, "10.0.20348"]))
    if kernel_build:
        info["kernelVersion"] = f"{kernel_build}.{draw(st.integers(0, 9999))}"
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
    [{"key": "os", "operator": "Exists"}],
    [{"operator": "Exists", "effect": "NoSchedule"}],
    [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
]


@st.composite
def mesh_spec(draw: st.DrawFn) -> AmbientMeshSpec:
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
    return AmbientMeshSpec.model_validate({"platforms": {"linux": linux, "windows": windows}})


def _daemonsets(result: RenderResult) -> list[dict[str, Any]]:
    return [o for o in result.objects if o["kind"] == "DaemonSet"]


def _component(ds: dict[str, Any]) -> str:
    return str(ds["metadata"]["labels"][c.LABEL_COMPONENT])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=inventory(), spec=mesh_spec(), istiod=st.sampled_from([None, "10.0.0.9"]))
def test_every_supported_node_gets_exactly_one_agent_pair(
    nodes: list[dict[str, Any]], spec: AmbientMeshSpec, istiod: str | None
) -> None:
    facts = ClusterFacts.from_nodes(nodes, istiod_ip=istiod, dns_ip="10.0.0.10")
    result = render_dataplane(spec, facts)
    by_name = {n.name: n for n in facts.nodes}
    plans = {p.name: p for p in result.daemonsets}
    daemonsets = _daemonsets(result)
    assert len(daemonsets) == len(plans)

    for verdict in result.verdicts:
        node = by_name[verdict.node]
        selecting = [
            ds for ds in daemonsets if daemon_schedulable(ds["spec"]["template"]["spec"], node)
        ]
        components = sorted(_component(ds) for ds in selecting)
        if not verdict.supported:
            assert selecting == [], (verdict, [ds["metadata"]["name"] for ds in selecting])
            assert verdict.reason and verdict.message
            continue
        assert components == ["istio-cni", "ztunnel"], (verdict, components)
        for ds in selecting:
            pod_os = ds["spec"]["template"]["spec"]["os"]["name"]
            assert pod_os == node.os, "a DaemonSet of one OS selects a node of the other"
            plan = plans[ds["metadata"]["name"]]
            assert plan.platform == verdict.platform
            assert node.name in plan.nodes

    # The plans name exactly the nodes their DaemonSets select.
    for ds in daemonsets:
        pod = ds["spec"]["template"]["spec"]
        chosen = tuple(sorted(n.name for n in facts.nodes if daemon_schedulable(pod, n)))
        assert chosen == plans[ds["metadata"]["name"]].nodes


@settings(max_examples=100, deadline=None)
@given(nodes=inventory(), spec=mesh_spec(), seed=st.integers(0, 2**32 - 1))
def test_rendering_is_deterministic(
    nodes: list[dict[str, Any]], spec: AmbientMeshSpec, seed: int
) -> None:
    facts = ClusterFacts.from_nodes(nodes, istiod_ip="10.0.0.9", dns_ip="10.0.0.10")
    first = render_dataplane(spec, facts)
    again = render_dataplane(spec, facts)
    shuffled_nodes = list(facts.nodes)
    random.Random(seed).shuffle(shuffled_nodes)
    shuffled = render_dataplane(
        spec, ClusterFacts(tuple(shuffled_nodes), facts.istiod_ip, facts.dns_ip)
    )
    text = output.to_yaml(first.objects)
    assert output.to_yaml(again.objects) == text
    assert output.to_yaml(shuffled.objects) == text
    assert first == again == shuffled


def test_facts_round_trip_through_api_form() -> None:
    # The property tests build facts from API JSON; make sure that path keeps labels.
    node = NodeFacts.from_node(
        {"metadata": {"name": "n", "labels": {c.LABEL_OS: "linux"}}, "status": {}}
    )
    assert node.labels == {c.LABEL_OS: "linux"}
