"""Namespace labels people get wrong: near-miss keys, `use-waypoint: true`, a waypoint
on a namespace not enrolled. Pure judgements (cluster/enrollment.py) and the checker
that posts them (controllers/namespaces.py), on literal labels."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from ambient_operator.cluster.enrollment import (
    carries_ambient_labels,
    namespace_problems,
    near_misses,
)
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.controllers.namespaces import NamespaceChecker

NOT_ENROLLED_TALK = (
    "MisspelledDataplaneMode",
    "data-plane-mode=ambient is not a label Istio reads; the key is istio.io/dataplane-mode. "
    "This namespace is not enrolled in ambient and ztunnel does not redirect its pods: "
    "kubectl label namespace talk istio.io/dataplane-mode=ambient",
)
TRUE_IN_TALK = (
    "WaypointNameExpected",
    "istio.io/use-waypoint takes the name of a waypoint Gateway, not true: no Gateway "
    "talk/true exists, so traffic skips any waypoint; talk has no waypoint yet "
    "(ambient-operator waypoint apply -n talk makes one named waypoint)",
)


def _judged(
    labels: Mapping[str, str],
    waypoints: Mapping[tuple[str, str], bool] | None = None,
    name: str = "talk",
) -> list[tuple[str, str]]:
    problems = namespace_problems(name, labels, waypoints or {}, enrollment=True)
    return [(str(reason), message) for reason, message in problems]


def test_the_talks_labels_say_not_enrolled_and_that_the_waypoint_takes_a_name() -> None:
    labels = {"data-plane-mode": "ambient", "istio.io/use-waypoint": "true"}
    # Not WaypointNotFound for a Gateway named "true"; and not WaypointWithoutAmbient,
    # which would tell the missing enrollment a second time.
    assert _judged(labels) == [NOT_ENROLLED_TALK, TRUE_IN_TALK]


def test_both_keys_misspelt() -> None:
    labels = {"data-plane-mode": "ambient", "use-waypoint": "true"}
    assert _judged(labels) == [
        NOT_ENROLLED_TALK,
        (
            "MisspelledUseWaypoint",
            "use-waypoint=true is not a label Istio reads; the key is istio.io/use-waypoint, "
            "and it takes a waypoint Gateway's name, not true. No waypoint is used: set "
            "istio.io/use-waypoint=<name of a waypoint Gateway>",
        ),
    ]
    assert _judged({"istio.io/dataplane-mode": "ambient", "use-waypoint": "waypoint"}) == [
        (
            "MisspelledUseWaypoint",
            "use-waypoint=waypoint is not a label Istio reads; the key is istio.io/use-waypoint. "
            "No waypoint is used: set istio.io/use-waypoint=waypoint",
        )
    ]


@pytest.mark.parametrize(
    "key",
    [
        "data-plane-mode",
        "dataplane-mode",
        "dataplane_mode",
        "istio.io/data-plane-mode",
        "istio.io/dataPlaneMode",
        "istio.io/DataplaneMode",
        "Istio.io/dataplane-mode",
        "istio/dataplane-mode",
    ],
)
def test_near_misses_of_the_dataplane_key(key: str) -> None:
    assert near_misses({key: "ambient", "app": "x"}, "istio.io/dataplane-mode") == [key]
    assert carries_ambient_labels({key: "ambient"})
    assert [reason for reason, _ in _judged({key: "ambient"}, name="n")] == [
        "MisspelledDataplaneMode"
    ]


@pytest.mark.parametrize(
    "key",
    [
        "istio.io/dataplane-mode",  # the key itself
        "example.com/dataplane-mode",  # another project's
        "istio.io/use-waypoint-namespace",  # a key of its own
        "istio.io/dataplane",
        "sidecar.istio.io/inject",
    ],
)
def test_not_near_misses(key: str) -> None:
    assert near_misses({key: "x"}, "istio.io/dataplane-mode") == []
    assert near_misses({key: "x"}, "istio.io/use-waypoint") == []


def test_a_stray_key_beside_the_right_one_is_left_alone() -> None:
    labels = {"istio.io/dataplane-mode": "ambient", "data-plane-mode": "ambient"}
    assert _judged(labels) == []
    labels = {"istio.io/use-waypoint": "wp", "use-waypoint": "wp", **labels}
    assert _judged(labels, {("talk", "wp"): True}) == []


def test_misspelt_none_is_still_told_with_its_own_value() -> None:
    assert _judged({"dataplane-mode": "none"}, name="n") == [
        (
            "MisspelledDataplaneMode",
            "dataplane-mode=none is not a label Istio reads; the key is istio.io/dataplane-mode. "
            "This namespace is not enrolled in ambient and ztunnel does not redirect its pods: "
            "kubectl label namespace n istio.io/dataplane-mode=none",
        )
    ]


def test_a_waypoint_on_a_namespace_not_enrolled() -> None:
    waypoints = {("shop", "wp"): True}
    assert _judged({"istio.io/use-waypoint": "wp"}, waypoints, "shop") == [
        (
            "WaypointWithoutAmbient",
            "istio.io/use-waypoint=wp has no effect on this namespace's pods: the namespace is "
            "not enrolled in ambient (no istio.io/dataplane-mode=ambient), so ztunnel does not "
            "redirect their traffic; only pods labelled for ambient themselves use the waypoint. "
            "Label the namespace istio.io/dataplane-mode=ambient",
        )
    ]
    labels = {"istio.io/dataplane-mode": "none", "istio.io/use-waypoint": "wp"}
    assert _judged(labels, waypoints, "shop") == [
        (
            "WaypointWithoutAmbient",
            "istio.io/use-waypoint=wp has no effect on this namespace's pods: the namespace is "
            "not enrolled in ambient (istio.io/dataplane-mode=none, not "
            "istio.io/dataplane-mode=ambient), so ztunnel does not redirect their traffic; "
            "only pods labelled for ambient themselves use the waypoint. Label the namespace "
            "istio.io/dataplane-mode=ambient",
        )
    ]
    # An invalid mode says "not enrolled" already; use-waypoint=none asks for nothing.
    labels = {"istio.io/dataplane-mode": "on", "istio.io/use-waypoint": "wp"}
    assert [r for r, _ in _judged(labels, waypoints, "shop")] == ["InvalidDataplaneMode"]
    assert _judged({"istio.io/use-waypoint": "none"}, waypoints, "shop") == []


def test_switch_words_for_use_waypoint() -> None:
    enrolled = {"istio.io/dataplane-mode": "ambient"}
    waypoints = {("a", "waypoint"): True, ("a", "plain"): False, ("b", "other"): True}
    assert _judged({**enrolled, "istio.io/use-waypoint": "true"}, waypoints, "a") == [
        (
            "WaypointNameExpected",
            "istio.io/use-waypoint takes the name of a waypoint Gateway, not true: no Gateway "
            "a/true exists, so traffic skips any waypoint; waypoints in a: waypoint",
        )
    ]
    assert _judged({**enrolled, "istio.io/use-waypoint": "false"}, waypoints, "a") == [
        (
            "WaypointNameExpected",
            "istio.io/use-waypoint takes the name of a waypoint Gateway, not false: no Gateway "
            "a/false exists, so traffic skips any waypoint; to use no waypoint, set it to none",
        )
    ]
    # A waypoint that is named true is a name like any other.
    named_true = {("a", "true"): True}
    assert _judged({**enrolled, "istio.io/use-waypoint": "true"}, named_true, "a") == []


def test_a_services_labels_are_not_judged_for_enrollment() -> None:
    # controllers/waypoints/reports.py judges Services' labels without enrollment=True:
    # a Service's istio.io/use-waypoint never needs istio.io/dataplane-mode beside it.
    service = {"istio.io/use-waypoint": "true", "data-plane-mode": "ambient"}
    assert [r for r, _ in namespace_problems("a", service, {})] == ["WaypointNameExpected"]
    assert namespace_problems("a", {"istio.io/use-waypoint": "wp"}, {("a", "wp"): True}) == []


class _Events:
    """What NamespaceChecker needs of an EventRecorder: told and post."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str, str]] = []

    def told(self, obj: Mapping[str, Any], reason: str, message: str) -> bool:
        return any(
            p[0] == obj["metadata"]["name"] and p[2:] == (reason, message) for p in self.posted
        )

    def post(self, obj: Mapping[str, Any], kind_type: str, reason: str, message: str) -> bool:
        self.posted.append((obj["metadata"]["name"], kind_type, reason, message))
        return True


def test_the_checker_looks_at_namespaces_with_only_a_near_miss() -> None:
    state = ClusterState()
    for name, labels in (
        ("talk", {"data-plane-mode": "ambient", "istio.io/use-waypoint": "true"}),
        ("plain", {"team": "a"}),
        ("fine", {"istio.io/dataplane-mode": "ambient"}),
    ):
        # The shape of the namespace cache's entries: the labels kept whole.
        state.namespaces[name] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "labels": labels,
        }
    events = _Events()
    checker = NamespaceChecker(state, None, events)  # type: ignore[arg-type]
    asyncio.run(checker.check())
    asyncio.run(checker.check())  # told once
    assert events.posted == [
        ("talk", "Warning", *NOT_ENROLLED_TALK),
        ("talk", "Warning", *TRUE_IN_TALK),
    ]


def test_the_checker_judges_only_what_changed() -> None:
    # Fed as the watches feed it (cluster/watches.py): each change is recorded
    # for the next check; the Gateway through the waypoint cache's call.
    state = ClusterState()
    record = {row.id: row.record for row in state_watches(state, [])}

    def labelled(name: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}}

    for i in range(50):
        record["namespaces"](None, labelled(f"ns-{i:02}", **{"istio.io/dataplane-mode": "ambient"}))
    record["namespaces"](None, labelled("plain", team="a"))
    # Two namespaces use the waypoint `wp` of `shared`, which does not exist yet.
    for name in ("ns-01", "ns-02"):
        record["namespaces"](
            None,
            labelled(
                name,
                **{
                    "istio.io/dataplane-mode": "ambient",
                    "istio.io/use-waypoint": "wp",
                    "istio.io/use-waypoint-namespace": "shared",
                },
            ),
        )
    events = _Events()
    checker = NamespaceChecker(state, None, events)  # type: ignore[arg-type]
    asyncio.run(checker.check())
    # The first check judges every namespace with an ambient label.
    assert checker.judged == 50
    assert [(ns, reason) for ns, _, reason, _ in events.posted] == [
        ("ns-01", "WaypointNotFound"),
        ("ns-02", "WaypointNotFound"),
    ]

    # One namespace relabelled: it alone is judged.
    record["namespaces"](None, labelled("ns-07", **{"istio.io/dataplane-mode": "on"}))
    asyncio.run(checker.check())
    assert checker.judged == 51
    assert events.posted[-1][:3] == ("ns-07", "Warning", "InvalidDataplaneMode")

    # Nothing changed: nothing judged.
    asyncio.run(checker.check())
    assert checker.judged == 51

    # A Gateway appears in `shared`: the two namespaces looking there are judged.
    key = ("shared", "wp")
    state.gateways[key] = {
        "metadata": {"namespace": "shared", "name": "wp"},
        "spec": {"listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    }
    state.gateway_changed(key)
    asyncio.run(checker.check())
    assert checker.judged == 53

    # A resync judges them all again.
    state.resync()
    asyncio.run(checker.check())
    assert checker.judged == 103
