"""cluster/scheduling.py against the scheduler's NodeAffinity and TaintToleration rules."""

from __future__ import annotations

from typing import Any

import pytest

from ambient_operator.cluster.facts import NodeFacts, Taint
from ambient_operator.cluster.scheduling import (
    daemon_schedulable,
    node_matches,
    schedulable,
    tolerates,
    toleration_matches,
    untolerated,
)


def node(name: str = "n1", taints: tuple[Taint, ...] = (), **labels: str) -> NodeFacts:
    return NodeFacts(name, "linux", "amd64", None, False, labels, taints)


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": op}
    if values:
        out["values"] = list(values)
    return out


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


def one(*exprs: dict[str, Any]) -> dict[str, Any]:
    return affinity({"matchExpressions": list(exprs)})


N = node(zone="a", size="10", os="linux", under="1_0")


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("missing", "In", "a"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("zone", "NotIn", "a"), False),
        (expr("missing", "NotIn", "a"), True),
        (expr("zone", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("zone", "DoesNotExist"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("size", "Gt", "9"), True),
        (expr("size", "Gt", "10"), False),
        (expr("size", "Lt", "11"), True),
        (expr("size", "Lt", "10"), False),
        (expr("size", "Gt", "-1"), True),
        (expr("zone", "Gt", "1"), False),  # the label is not an integer
        (expr("under", "Gt", "1"), False),  # Go's ParseInt refuses "1_0"
        (expr("missing", "Lt", "100"), False),
    ],
)
def test_label_operators(requirement: dict[str, Any], expected: bool) -> None:
    assert node_matches(one(requirement), N) is expected


@pytest.mark.parametrize(
    "invalid",
    [
        expr("zone", "In"),  # In needs values
        expr("zone", "NotIn"),
        expr("zone", "Exists", "a"),  # Exists takes none
        expr("zone", "DoesNotExist", "a"),
        expr("size", "Gt", "1", "2"),  # exactly one value
        expr("size", "Lt", "ten"),
        expr("zone", "Like", "a"),
    ],
)
def test_invalid_requirement_matches_nothing(invalid: dict[str, Any]) -> None:
    assert node_matches(one(invalid), N) is False


def test_expressions_in_a_term_are_anded() -> None:
    assert node_matches(one(expr("zone", "In", "a"), expr("size", "Gt", "5")), N)
    assert not node_matches(one(expr("zone", "In", "a"), expr("size", "Gt", "50")), N)


def test_terms_are_ored() -> None:
    spec = affinity(
        {"matchExpressions": [expr("zone", "In", "z")]},
        {"matchExpressions": [expr("os", "In", "linux")]},
    )
    assert node_matches(spec, N)
    spec = affinity(
        {"matchExpressions": [expr("zone", "In", "z")]},
        {"matchExpressions": [expr("os", "In", "windows")]},
    )
    assert not node_matches(spec, N)


def test_empty_term_and_empty_terms_match_nothing() -> None:
    assert not node_matches(affinity({}), N)
    assert not node_matches(affinity(), N)
    # An empty term next to a matching one does not spoil it.
    assert node_matches(affinity({}, {"matchExpressions": [expr("zone", "Exists")]}), N)


def test_match_fields_on_the_node_name() -> None:
    by_name = affinity({"matchFields": [expr("metadata.name", "In", "n1")]})
    assert node_matches(by_name, N)
    assert not node_matches(by_name, node("n2"))
    not_name = affinity({"matchFields": [expr("metadata.name", "NotIn", "n1")]})
    assert not node_matches(not_name, N)
    assert node_matches(not_name, node("n2"))


@pytest.mark.parametrize(
    "invalid",
    [
        expr("metadata.name", "In", "n1", "n2"),  # the API server takes exactly one name
        expr("metadata.name", "Exists"),
        expr("metadata.uid", "In", "n1"),
    ],
)
def test_invalid_field_requirement_matches_nothing(invalid: dict[str, Any]) -> None:
    assert not node_matches(affinity({"matchFields": [invalid]}), N)


def test_fields_and_expressions_in_one_term_are_anded() -> None:
    term = {
        "matchExpressions": [expr("zone", "In", "a")],
        "matchFields": [expr("metadata.name", "In", "n1")],
    }
    assert node_matches(affinity(term), N)
    assert not node_matches(affinity(term), node("n1", zone="b"))


def test_node_selector_needs_every_label() -> None:
    assert node_matches({"nodeSelector": {"zone": "a", "os": "linux"}}, N)
    assert not node_matches({"nodeSelector": {"zone": "a", "os": "windows"}}, N)
    assert not node_matches({"nodeSelector": {"gpu": "true"}}, N)
    assert node_matches({"nodeSelector": {}}, N)


def test_node_selector_and_affinity_are_anded() -> None:
    spec = {"nodeSelector": {"zone": "a"}, **one(expr("os", "In", "windows"))}
    assert not node_matches(spec, N)


def test_node_name_pins_the_pod() -> None:
    assert node_matches({"nodeName": "n1"}, N)
    assert not node_matches({"nodeName": "n2"}, N)


def test_no_constraints_match_every_node() -> None:
    assert node_matches({}, N)
    assert node_matches({"affinity": {"nodeAffinity": {}}}, N)


T_NOSCHED = Taint("os", "windows", "NoSchedule")
T_NOEXEC = Taint("dedicated", None, "NoExecute")
T_PREFER = Taint("busy", "yes", "PreferNoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        ({"operator": "Exists"}, T_NOSCHED, True),  # empty key + Exists: everything
        ({"operator": "Exists"}, T_NOEXEC, True),
        ({"operator": "Exists", "effect": "NoSchedule"}, T_NOEXEC, False),
        ({"key": "os", "operator": "Equal", "value": "windows"}, T_NOSCHED, True),  # any effect
        ({"key": "os", "value": "windows"}, T_NOSCHED, True),  # Equal is the default
        ({"key": "os", "operator": "Equal", "value": "linux"}, T_NOSCHED, False),
        ({"key": "os", "operator": "Exists", "effect": "NoSchedule"}, T_NOSCHED, True),
        ({"key": "os", "operator": "Exists", "effect": "NoExecute"}, T_NOSCHED, False),
        ({"key": "dedicated", "operator": "Equal"}, T_NOEXEC, True),  # empty value == no value
        ({"key": "dedicated", "operator": "Equal", "value": "x"}, T_NOEXEC, False),
        ({"key": "other", "operator": "Exists"}, T_NOSCHED, False),
        # Refused by API validation, but ToleratesTaint compares the values.
        ({"operator": "Equal", "value": "windows"}, T_NOSCHED, True),
        ({"key": "os", "operator": "Gt", "value": "1"}, T_NOSCHED, False),  # alpha, off
    ],
)
def test_toleration_matches(toleration: dict[str, str], taint: Taint, expected: bool) -> None:
    assert toleration_matches(toleration, taint) is expected


def test_tolerates_needs_every_blocking_taint() -> None:
    taints = (T_NOSCHED, T_NOEXEC)
    assert not tolerates([{"key": "os", "operator": "Exists"}], taints)
    assert tolerates(
        [{"key": "os", "operator": "Exists"}, {"key": "dedicated", "operator": "Exists"}], taints
    )
    assert untolerated([{"key": "os", "operator": "Exists"}], taints) == [T_NOEXEC]


def test_prefer_no_schedule_never_blocks() -> None:
    assert tolerates([], (T_PREFER,))
    assert tolerates([], ())


def test_schedulable_combines_placement_and_taints() -> None:
    tainted = node("w", (T_NOSCHED,), os="windows")
    spec: dict[str, Any] = {"nodeSelector": {"os": "windows"}}
    assert not schedulable(spec, tainted)
    spec["tolerations"] = [
        {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}
    ]
    assert schedulable(spec, tainted)


def test_daemon_pods_get_the_controller_tolerations() -> None:
    cordoned = node("c", (Taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),))
    assert not schedulable({}, cordoned)
    assert daemon_schedulable({}, cordoned)
    no_network = node("x", (Taint("node.kubernetes.io/network-unavailable", None, "NoSchedule"),))
    assert not daemon_schedulable({}, no_network)
    assert daemon_schedulable({"hostNetwork": True}, no_network)
