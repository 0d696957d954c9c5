"""A node event renders only its own platform's objects, counted at 5,000 nodes.

The data-plane pass hands render_dataplane its last pass's RenderMemo. These
tests count the templates render_dataplane renders (every object is one
`render_object` call, two for a DaemonSet or ConfigMap that takes the
user's env), with the memo kept from pass to pass as the controller keeps
it, over an inventory of 5,000 nodes mixed as the sample is: three Linux
nodes to one each of WS2022, WS2025 and WS2019 (unsupported). The expected
counts and names are literal. A property test then checks that the memo
never changes the answer: after any sequence of node, address, rollout and
spec changes, the result equals a render without it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.versions import RunningAgent
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.render import dataplane, render_dataplane
from ambient_operator.render.dataplane import RenderMemo
from ambient_operator.render.model import RenderResult
from conftest import SAMPLE_NODES, examples
from render_cases import SAMPLE_MESH
from test_render_property import api_node

ISTIOD_IP, DNS_IP = "10.96.0.20", "10.96.0.10"
WS2022, WS2025 = "10.0.20348", "10.0.26100"
SAMPLE = yaml.safe_load(SAMPLE_NODES.read_text())["items"]
SPEC = AmbientMeshSpec.model_validate(yaml.safe_load(SAMPLE_MESH.read_text())["spec"])


def windows_objects(release: str) -> list[tuple[str, str]]:
    """The objects of one Windows build's platform: (template, name) each."""
    return [
        ("configmap-istio-cni.yaml.j2", f"istio-cni-config-windows-{release}"),
        ("daemonset-istio-cni-windows.yaml.j2", f"istio-cni-node-windows-{release}"),
        ("daemonset-ztunnel-windows.yaml.j2", f"ztunnel-windows-{release}"),
    ]


# Each platform's objects (the templates and names rendered for it).
WS2022_OBJECTS = windows_objects("ltsc2022")
WS2025_OBJECTS = windows_objects("ltsc2025")
LINUX_OBJECTS = [
    ("configmap-istio-cni.yaml.j2", "istio-cni-config"),
    ("daemonset-istio-cni-linux.yaml.j2", "istio-cni-node"),
    ("daemonset-ztunnel-linux.yaml.j2", "ztunnel"),
]
# What every platform shares: the three ServiceAccounts and istio-cni's ClusterRole
# and binding (the sample's generic platform needs no ResourceQuota).
SHARED_OBJECTS = [
    ("serviceaccount.yaml.j2", "istio-cni"),
    ("serviceaccount.yaml.j2", "ztunnel"),
    ("serviceaccount.yaml.j2", "ztunnel-windows"),
    ("clusterrole-istio-cni.yaml.j2", "istio-cni"),
    ("clusterrolebinding.yaml.j2", "istio-cni"),
]


def node(i: int, *, without_build_label: bool = False) -> dict[str, Any]:
    """The i-th node: the sample's node i % 6 under a name of its own."""
    out = copy.deepcopy(SAMPLE[i % len(SAMPLE)])
    name = f"{out['metadata']['name']}-{i}"
    out["metadata"]["name"] = name
    out["metadata"]["labels"]["kubernetes.io/hostname"] = name
    if without_build_label:
        del out["metadata"]["labels"]["node.kubernetes.io/windows-build"]
    return out


def facts_of(nodes: list[dict[str, Any]]) -> ClusterFacts:
    return ClusterFacts.from_nodes(nodes, istiod_ip=ISTIOD_IP, dns_ip=DNS_IP)


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """(template, object name) of every template render_dataplane renders, in order."""
    made: list[tuple[str, str]] = []
    real = dataplane.render_object

    def counting(template: str, **values: Any) -> dict[str, Any]:
        made.append((template, str(values["name"])))
        return real(template, **values)

    monkeypatch.setattr(dataplane, "render_object", counting)
    yield made


def nodes_per_platform(facts: ClusterFacts, memo: RenderMemo) -> dict[str, int]:
    result = render_dataplane(SPEC, facts, memo=memo)
    return {ds.platform: len(ds.nodes) for ds in result.daemonsets if ds.component == "ztunnel"}


def test_a_node_event_at_5000_nodes_renders_only_its_platforms_objects(
    renders: list[tuple[str, str]],
) -> None:
    memo = RenderMemo()
    inventory = [node(i) for i in range(5000)]
    # 5,000 nodes, six sample shapes: 834 of the first two, 833 of the others.
    assert nodes_per_platform(facts_of(inventory), memo) == {
        "linux": 2501,
        WS2022: 833,
        WS2025: 833,
    }
    assert sorted(renders) == sorted(
        SHARED_OBJECTS + LINUX_OBJECTS + WS2022_OBJECTS + WS2025_OBJECTS
    )

    # A pass with nothing changed (a heartbeat, a pod) renders nothing.
    renders.clear()
    nodes_per_platform(facts_of(inventory), memo)
    assert renders == []

    # A WS2022 node joins with the labels its platform's DaemonSets select
    # on: its DaemonSets' nodes grow, their objects are what they were.
    inventory.append(node(5001))  # 5001 % 6 == 3: the sample's WS2022 node
    assert nodes_per_platform(facts_of(inventory), memo) == {
        "linux": 2501,
        WS2022: 834,
        WS2025: 833,
    }
    assert renders == []

    # A WS2022 node without the build label (its kernel version tells the
    # build) is admitted by name in its platform's node affinity: WS2022's
    # objects, and no other platform's or shared object, are rendered again.
    inventory.append(node(5007, without_build_label=True))
    assert nodes_per_platform(facts_of(inventory), memo)[WS2022] == 835
    assert renders == WS2022_OBJECTS

    # It leaves: WS2022 again, alone.
    renders.clear()
    inventory.pop()
    nodes_per_platform(facts_of(inventory), memo)
    assert renders == WS2022_OBJECTS

    # Every WS2025 node leaves: its platform goes, nothing is rendered (the
    # shared objects stay as they were: WS2022 still needs ztunnel-windows).
    renders.clear()
    inventory = [n for n in inventory if not n["metadata"]["name"].startswith("win2025-")]
    assert nodes_per_platform(facts_of(inventory), memo) == {"linux": 2501, WS2022: 834}
    assert renders == []

    # The first WS2025 node comes back: its platform's objects, and nothing else.
    inventory.append(node(4))
    nodes_per_platform(facts_of(inventory), memo)
    assert renders == WS2025_OBJECTS


def test_the_data_plane_pass_keeps_its_memo_from_pass_to_pass(
    renders: list[tuple[str, str]],
) -> None:
    # The controller's own facts (from its caches) and render, as each pass calls them.
    ctl = DataplaneController(ClusterState(), None, None)  # type: ignore[arg-type]
    ctl.state.nodes = {n["metadata"]["name"]: n for n in map(node, range(5000))}
    ctl.render(SPEC, ctl.facts(SPEC))
    renders.clear()
    joined = node(5007, without_build_label=True)
    ctl.state.nodes[joined["metadata"]["name"]] = joined
    result = ctl.render(SPEC, ctl.facts(SPEC))
    assert renders == WS2022_OBJECTS
    assert [len(ds.nodes) for ds in result.daemonsets] == [2501, 2501, 834, 834, 833, 833]


def test_what_every_platform_reads_renders_each_platform_that_reads_it(
    renders: list[tuple[str, str]],
) -> None:
    memo = RenderMemo()
    inventory = [node(i) for i in range(60)]
    render_dataplane(SPEC, facts_of(inventory), memo=memo)

    # istiod's ClusterIP is dialled by the Windows agents only.
    renders.clear()
    moved = replace(facts_of(inventory), istiod_ip="10.96.0.99")
    render_dataplane(SPEC, moved, memo=memo)
    assert renders == WS2022_OBJECTS + WS2025_OBJECTS

    # A spec change reaches every platform and the shared objects.
    renders.clear()
    spec = SPEC.model_copy(update={"log_level": "debug"})
    render_dataplane(spec, moved, memo=memo)
    assert sorted(renders) == sorted(
        SHARED_OBJECTS + LINUX_OBJECTS + WS2022_OBJECTS + WS2025_OBJECTS
    )

    # The chart's RBAC: the shared objects only.
    renders.clear()
    render_dataplane(spec, moved, memo=memo, cni_rbac=False)
    assert renders == SHARED_OBJECTS[:3]


# -- the memo never changes the answer -------------------------------------------------

BASE = [node(i) for i in range(12)]
AGENT_STATES = [
    {},
    {
        ("linux", "ztunnel"): RunningAgent("docker.io/istio/ztunnel:1.30.0", True, False),
        ("linux", "istio-cni"): RunningAgent("docker.io/istio/install-cni:1.30.0", True, False),
    },
    {
        ("linux", "ztunnel"): RunningAgent("docker.io/istio/ztunnel:1.31.0", False, True, "1/3"),
        (WS2022, "ztunnel"): RunningAgent("registry.example.com/old:1", True, False),
    },
    # Linux rolls to the spec's istiod revision; WS2022 keeps the one it serves.
    {
        ("linux", "ztunnel"): RunningAgent("docker.io/istio/ztunnel:1.31.0", False, True, "1/3"),
        (WS2022, "ztunnel"): RunningAgent(
            "registry.example.com/istio/ztunnel-windows:1.31.0", True, False, revision="old"
        ),
    },
]
SPECS = [
    SPEC,
    SPEC.model_copy(update={"log_level": "debug"}),
    SPEC.model_copy(
        update={"ztunnel": SPEC.ztunnel.model_copy(update={"env": {"NODE_NAME": "x"}})}
    ),
    AmbientMeshSpec.model_validate(
        {
            **yaml.safe_load(SAMPLE_MESH.read_text())["spec"],
            "ztunnel": {"env": {"RUST_LOG": "debug", "NODE_NAME": "x"}},
            "istioCni": {"env": {"EXTRA": "1"}, "provider": "multus"},
            "networkPolicy": {"enabled": True},
            "istiod": {"revision": "canary"},
        }
    ),
    AmbientMeshSpec.model_validate({"platforms": {"windows": {"builds": [WS2025]}}}),
]


def fact(field: str, values: list[Any]) -> st.SearchStrategy[tuple[str, tuple[str, Any]]]:
    """A step that sets one field of the facts to one of `values`."""
    return st.tuples(st.just("facts"), st.tuples(st.just(field), st.sampled_from(values)))


step = st.one_of(
    st.tuples(st.just("add"), api_node("drawn")),
    st.tuples(st.just("add-sample"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("remove"), st.integers(0, 100)),
    st.tuples(st.just("remove-os"), st.sampled_from(["windows", "linux"])),
    st.tuples(st.just("spec"), st.sampled_from(SPECS)),
    st.tuples(st.just("cni_rbac"), st.booleans()),
    fact("istiod_ip", [None, "10.96.0.20", "10.96.0.21"]),
    fact("dns_ip", [None, "10.96.0.10", "10.96.0.11"]),
    fact("istiod_ips", [{}, {"istiod-canary": "10.96.0.30"}]),
    fact("agents", AGENT_STATES),
    fact("platform", ["generic", "openshift", "gke", "eks"]),
    fact("moving_from", [(), ("old-ns",)]),
    fact("network_attachments", ["served", "not served", "not granted"]),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(SPECS), st.lists(step, min_size=1, max_size=12))
def test_the_memo_gives_what_a_full_render_gives(
    spec: AmbientMeshSpec, steps: list[tuple[Any, ...]]
) -> None:
    memo = RenderMemo()
    nodes = list(BASE)
    facts = facts_of(nodes)
    cni_rbac, added = True, 0
    render_dataplane(spec, facts, memo=memo)
    for what, *args in steps:
        if what == "add":
            added += 1
            drawn = copy.deepcopy(args[0])
            drawn["metadata"]["name"] = f"drawn-{added}"
            nodes.append(drawn)
        elif what == "add-sample":
            joined = node(
                100 + args[0], without_build_label=args[1] and (100 + args[0]) % 6 in (3, 4)
            )
            if all(n["metadata"]["name"] != joined["metadata"]["name"] for n in nodes):
                nodes.append(joined)
        elif what == "remove" and nodes:
            nodes.pop(args[0] % len(nodes))
        elif what == "remove-os":
            nodes = [n for n in nodes if n["metadata"]["labels"].get("kubernetes.io/os") != args[0]]
        if what in ("add", "add-sample", "remove", "remove-os"):
            facts = replace(facts, nodes=facts_of(nodes).nodes)
        elif what == "facts":
            field, value = args[0]
            facts = replace(facts, **{field: value})
        elif what == "spec":
            spec = args[0]
        elif what == "cni_rbac":
            cni_rbac = args[0]
        incremental = render_dataplane(spec, facts, cni_rbac=cni_rbac, memo=memo)
        assert incremental == render_dataplane(spec, facts, cni_rbac=cni_rbac)


def _ws2022_selection(result: RenderResult) -> tuple[dict[str, str], Any]:
    pod = next(
        o["spec"]["template"]["spec"]
        for o in result.objects
        if o["metadata"]["name"] == "ztunnel-windows-ltsc2022"
    )
    return pod["nodeSelector"], pod.get("affinity")


def test_a_node_event_judges_that_node_alone_and_compares_none() -> None:
    """Through the Node cache (a NodeTable) render learns which nodes changed: a
    node's event costs that node, not a comparison of all 5,000 (issue 44)."""
    ctl = DataplaneController(ClusterState(), None, None)  # type: ignore[arg-type]
    for body in map(node, range(5000)):
        ctl.state.nodes[body["metadata"]["name"]] = body
    memo = ctl.renders.verdicts
    ctl.render(SPEC, ctl.facts(SPEC))
    assert (memo.judged, memo.compared) == (5000, 5000)

    # A WS2022 node without the build label joins: judged alone, and named in
    # its platform's affinity.
    joined = node(5007, without_build_label=True)
    name = joined["metadata"]["name"]
    ctl.state.nodes[name] = joined
    result = ctl.render(SPEC, ctl.facts(SPEC))
    assert (memo.judged, memo.compared) == (5001, 5000)
    assert [len(ds.nodes) for ds in result.daemonsets] == [2501, 2501, 834, 834, 833, 833]
    selector, affinity = _ws2022_selection(result)
    assert "node.kubernetes.io/windows-build" not in selector
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[1:] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
    ]

    # A Linux node's labels change: that node is judged again, alone.
    relabelled = copy.deepcopy(ctl.state.nodes["linux-amd64-1-0"])
    relabelled["metadata"]["labels"]["team"] = "a"
    ctl.state.nodes["linux-amd64-1-0"] = relabelled
    ctl.render(SPEC, ctl.facts(SPEC))
    assert (memo.judged, memo.compared) == (5002, 5000)

    # A pass with no node event judges and compares nothing.
    ctl.render(SPEC, ctl.facts(SPEC))
    assert (memo.judged, memo.compared) == (5002, 5000)

    # The unlabelled node leaves: nothing is judged, and WS2022 selects by
    # its build label again, with no affinity.
    del ctl.state.nodes[name]
    result = ctl.render(SPEC, ctl.facts(SPEC))
    assert (memo.judged, memo.compared) == (5002, 5000)
    assert len(result.verdicts) == 5000
    assert [len(ds.nodes) for ds in result.daemonsets] == [2501, 2501, 833, 833, 833, 833]
    assert _ws2022_selection(result) == (
        {
            "kubernetes.io/os": "windows",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/windows-build": WS2022,
        },
        None,
    )

    # The spec changes: every verdict depends on it, so every node is judged again.
    raw = yaml.safe_load(SAMPLE_MESH.read_text())["spec"]
    changed = AmbientMeshSpec.model_validate({**raw, "logLevel": "debug"})
    ctl.render(changed, ctl.facts(changed))
    assert (memo.judged, memo.compared) == (10002, 10000)
