"""The enrollment tally (cluster/enrollment.EnrollmentTally) says what summarize says.

Literal cases first, then a differential property test: after any sequence
of pod, namespace-label and node-OS changes, the tally kept change by change
equals summarize over the whole caches.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambient_operator.api.v1alpha1 import Enrollment, PodCounts
from ambient_operator.cluster.enrollment import EnrollmentTally, summarize
from ambient_operator.cluster.state import PodSummary
from conftest import examples

AMBIENT = {"istio.io/dataplane-mode": "ambient"}


def summary(
    ns: str,
    name: str,
    *,
    node: str | None = "n1",
    redirection: str | None = None,
    mode: str | None = None,
    os: str | None = None,
    phase: str | None = "Running",
    sidecar: bool = False,
    host_network: bool = False,
) -> PodSummary:
    return PodSummary(ns, name, mode, sidecar, host_network, os, node, redirection, phase)


def test_the_tally_follows_each_change() -> None:
    tally = EnrollmentTally()
    tally.namespace("shop", AMBIENT)
    tally.node("win", "windows")
    tally.pod(("shop", "a"), summary("shop", "a", redirection="enabled"))
    tally.pod(("shop", "b"), summary("shop", "b", node="win"))
    tally.pod(("shop", "c"), summary("shop", "c", mode="none"))
    tally.pod(("web", "d"), summary("web", "d", redirection="pending"))
    tally.pod(("web", "e"), summary("web", "e", mode="ambient", phase="Succeeded"))
    assert tally.enrollment(2) == Enrollment(
        namespaces=1,
        linux_pods=PodCounts(enabled=1, pending=0, missing=0),
        windows_pods=PodCounts(enabled=0, pending=0, missing=1),
        example_pending_pods=["shop/b"],
        workaround_misses=2,
    )
    # web is enrolled: d counts; the node win becomes Linux: b counts there.
    tally.namespace("web", AMBIENT)
    tally.node("win", "linux")
    assert tally.enrollment() == Enrollment(
        namespaces=2,
        linux_pods=PodCounts(enabled=1, pending=1, missing=1),
        windows_pods=PodCounts(enabled=0, pending=0, missing=0),
        example_pending_pods=["shop/b", "web/d"],
        workaround_misses=0,
    )
    # shop goes (its pods' deletions come on their own), a is deleted.
    tally.namespace("shop", None)
    tally.pod(("shop", "a"), None)
    assert tally.enrollment() == Enrollment(
        namespaces=1,
        linux_pods=PodCounts(enabled=0, pending=1, missing=0),
        windows_pods=PodCounts(enabled=0, pending=0, missing=0),
        example_pending_pods=["web/d"],
        workaround_misses=0,
    )


def test_the_examples_are_the_first_five_in_name_order() -> None:
    tally = EnrollmentTally()
    tally.namespace("ns", AMBIENT)
    for i in (9, 3, 7, 1, 8, 5, 2):
        tally.pod(("ns", f"p{i}"), summary("ns", f"p{i}"))
    assert tally.enrollment().example_pending_pods == ["ns/p1", "ns/p2", "ns/p3", "ns/p5", "ns/p7"]
    tally.pod(("ns", "p0"), summary("ns", "p0"))
    assert tally.enrollment().example_pending_pods == ["ns/p0", "ns/p1", "ns/p2", "ns/p3", "ns/p5"]
    tally.pod(("ns", "p6"), summary("ns", "p6"))  # after the last example: none changes
    tally.pod(("ns", "p3"), summary("ns", "p3", redirection="enabled"))
    assert tally.enrollment().example_pending_pods == ["ns/p0", "ns/p1", "ns/p2", "ns/p5", "ns/p6"]
    tally.pod(("ns", "p1"), None)
    tally.pod(("ns", "p2"), None)
    assert tally.enrollment().example_pending_pods == ["ns/p0", "ns/p5", "ns/p6", "ns/p7", "ns/p8"]


def test_a_label_change_counts_only_that_namespaces_pods() -> None:
    tally = EnrollmentTally()
    for ns in ("a", "b"):
        for i in range(100):
            tally.pod((ns, f"p{i}"), summary(ns, f"p{i}"))
    before = tally.recounted
    tally.namespace("a", AMBIENT)
    assert tally.recounted - before == 100
    before = tally.recounted
    tally.namespace("a", AMBIENT)  # the same labels: nothing
    tally.node("n2", "windows")  # no pod there
    assert tally.recounted == before


NAMESPACES = ["a", "b", "c"]
NODES = ["n1", "n2", "n3"]
pods = st.builds(
    summary,
    st.sampled_from(NAMESPACES),
    st.sampled_from([f"p{i}" for i in range(12)]),
    node=st.sampled_from([None, *NODES]),
    redirection=st.sampled_from([None, "enabled", "pending", "failed"]),
    mode=st.sampled_from([None, "ambient", "none", "bogus"]),
    os=st.sampled_from([None, None, "linux", "windows"]),
    phase=st.sampled_from(["Running", "Pending", "Succeeded", "Failed", None]),
    sidecar=st.booleans(),
    host_network=st.sampled_from([False, False, True]),
)
labels = st.fixed_dictionaries(
    {},
    optional={
        "istio.io/dataplane-mode": st.sampled_from(["ambient", "none", "x"]),
        "istio-injection": st.just("enabled"),
    },
)
step = st.one_of(
    st.tuples(st.just("pod"), pods),
    st.tuples(st.just("pod-gone"), pods),
    st.tuples(st.just("namespace"), st.sampled_from(NAMESPACES), labels),
    st.tuples(st.just("namespace-gone"), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("node"), st.sampled_from(NODES), st.sampled_from(["linux", "windows"])),
    st.tuples(st.just("node-gone"), st.sampled_from(NODES)),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(step, min_size=1, max_size=60), st.integers(0, 3))
def test_the_tally_is_summarize(steps: list[tuple[Any, ...]], misses: int) -> None:
    tally = EnrollmentTally()
    pods_by_key: dict[tuple[str, str], PodSummary] = {}
    namespaces: dict[str, dict[str, Any]] = {}
    node_os: dict[str, str] = {}
    for what, *args in steps:
        if what in ("pod", "pod-gone"):
            pod = args[0]
            key = (pod.namespace, pod.name)
            if what == "pod":
                pods_by_key[key] = pod
            else:
                pods_by_key.pop(key, None)
            tally.pod(key, pod if what == "pod" else None)
        elif what == "namespace":
            namespaces[args[0]] = {"labels": args[1]}
            tally.namespace(args[0], args[1])
        elif what == "namespace-gone":
            namespaces.pop(args[0], None)
            tally.namespace(args[0], None)
        elif what == "node":
            node_os[args[0]] = args[1]
            tally.node(args[0], args[1])
        else:
            node_os.pop(args[0], None)
            tally.node(args[0], None)
        assert tally.enrollment(misses) == summarize(
            pods_by_key.values(), namespaces, node_os, misses
        )
        for os_name in ("linux", "windows"):
            assert tally.nodes_of(os_name) == list(node_os.values()).count(os_name)


def test_the_tally_counts_nodes_by_os() -> None:
    tally = EnrollmentTally()
    tally.node("n1", "linux")
    tally.node("n2", "windows")
    tally.node("n3", "windows")
    assert (tally.nodes_of("linux"), tally.nodes_of("windows")) == (1, 2)
    tally.node("n2", "linux")  # relabelled
    tally.node("n3", "windows")  # told again: no change
    assert (tally.nodes_of("linux"), tally.nodes_of("windows")) == (2, 1)
    tally.node("n3", None)
    tally.node("n3", None)  # gone twice: counted once
    tally.node("n9", None)  # never seen
    assert (tally.nodes_of("linux"), tally.nodes_of("windows")) == (2, 0)


def test_the_tally_counts_enrolled_windows_pods_per_node() -> None:
    tally = EnrollmentTally()
    tally.namespace("shop", AMBIENT)
    tally.node("win-1", "windows")
    tally.node("win-2", "windows")
    for i in range(3):
        tally.pod(("shop", f"a{i}"), summary("shop", f"a{i}", node="win-1"))
    tally.pod(("shop", "b"), summary("shop", "b", node="win-2", redirection="enabled"))
    tally.pod(("shop", "c"), summary("shop", "c", node="win-2", mode="none"))
    tally.pod(("shop", "l"), summary("shop", "l", node="n1"))
    assert tally.windows_pods_by_node() == {"win-1": 3, "win-2": 1}
    # A pod moves between nodes, one goes, one finishes, the namespace leaves the mesh.
    tally.pod(("shop", "a0"), summary("shop", "a0", node="win-2"))
    tally.pod(("shop", "a1"), None)
    tally.pod(("shop", "a2"), summary("shop", "a2", node="win-1", phase="Succeeded"))
    assert tally.windows_pods_by_node() == {"win-2": 2}
    tally.namespace("shop", {})
    assert tally.windows_pods_by_node() == {}
