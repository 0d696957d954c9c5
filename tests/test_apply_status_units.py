"""Pure pieces of the operator: the apply comparison, status and enrollment rules."""

from __future__ import annotations

from typing import Any

from ambient_operator.api.conditions import Problem, Verdict
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.api.v1alpha1 import AmbientMeshStatus
from ambient_operator.apply.plan import (
    HASH_ANNOTATION,
    Owner,
    PassMemo,
    is_subset,
    plan,
    prepare,
    up_to_date,
)
from ambient_operator.cluster.enrollment import namespace_problems, pod_enrolled, summarize
from ambient_operator.cluster.state import PodSummary
from ambient_operator.status.components import (
    build_status,
    daemonset_ready,
    degraded_verdict,
    merge_conditions,
    transitions,
)

OWNER = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "uid-1")


def _cm(data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "istio-system"},
        "data": data,
    }


def _live(prepared: dict[str, Any], **extra: Any) -> dict[str, Any]:
    live = {**prepared, **extra}
    live["metadata"] = {**prepared["metadata"], "uid": "u", "resourceVersion": "7"}
    return live


def test_prepare_adds_labels_owner_and_hash() -> None:
    obj = prepare(_cm({"a": "1"}), OWNER, "dataplane")
    meta = obj["metadata"]
    assert meta["labels"][LABEL_CONTROLLER] == "dataplane"
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["annotations"][HASH_ANNOTATION]
    assert prepare(_cm({"a": "1"}), OWNER, "dataplane") == obj  # deterministic


def test_up_to_date_sees_drift_and_server_defaults() -> None:
    want = prepare(_cm({"a": "1"}), OWNER, "dataplane")
    assert up_to_date(want, _live(want, extra="server default"))
    drifted = _live(want)
    drifted["data"] = {"a": "2"}
    assert not up_to_date(want, drifted)
    assert not up_to_date(want, None)
    # A field we stopped setting changes the hash, so the apply removes it.
    older = prepare(_cm({"a": "1", "b": "2"}), OWNER, "dataplane")
    assert not up_to_date(want, _live(older))


def test_is_subset_rules() -> None:
    assert is_subset({"a": {}}, {})
    assert is_subset({"a": []}, {"b": 1})
    assert not is_subset({"a": [1, 2]}, {"a": [1]})
    assert not is_subset({"a": True}, {"a": 1})
    assert is_subset({"a": [{"n": 1}]}, {"a": [{"n": 1, "d": 0}]})


def test_plan_applies_changed_and_prunes_unwanted() -> None:
    keep = prepare(_cm({"a": "1"}), OWNER, "dataplane")
    stale = _live(
        prepare(
            {**_cm({}), "metadata": {"name": "old", "namespace": "istio-system"}},
            OWNER,
            "dataplane",
        )
    )
    live = {
        ("v1", "ConfigMap", "istio-system", "x"): _live(keep),
        ("v1", "ConfigMap", "istio-system", "old"): stale,
    }
    result = plan([keep], live)
    assert result.apply == [] and result.unchanged == 1
    assert [o["metadata"]["name"] for o in result.prune] == ["old"]


def test_a_pass_memo_hands_back_only_what_an_equal_input_made() -> None:
    memo = PassMemo()
    (first,) = memo.prepare([_cm({"a": "1"})], OWNER, "dataplane")
    assert first == prepare(_cm({"a": "1"}), OWNER, "dataplane")
    # Rendered again, equal: the same object, its hash not worked out again.
    assert memo.prepare([_cm({"a": "1"})], OWNER, "dataplane")[0] is first
    (changed,) = memo.prepare([_cm({"a": "2"})], OWNER, "dataplane")
    assert changed["data"] == {"a": "2"}
    assert (
        changed["metadata"]["annotations"][HASH_ANNOTATION]
        != (first["metadata"]["annotations"][HASH_ANNOTATION])
    )
    other = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "uid-2")
    (moved,) = memo.prepare([_cm({"a": "2"})], other, "dataplane")
    assert moved["metadata"]["ownerReferences"][0]["uid"] == "uid-2"
    # A pass that did not render it forgets it.
    memo.prepare([], other, "dataplane")
    assert memo.prepare([_cm({"a": "2"})], other, "dataplane")[0] is not moved


def test_a_pass_memo_judges_again_when_the_live_object_or_the_input_changes() -> None:
    memo = PassMemo()
    (want,) = memo.prepare([_cm({"a": "1"})], OWNER, "dataplane")
    key = ("v1", "ConfigMap", "istio-system", "x")
    live = _live(want)
    assert plan([want], {key: live}, memo).unchanged == 1
    drifted = _live(want)
    drifted["data"] = {"a": "2"}
    drifted["metadata"]["resourceVersion"] = "8"
    assert [o["data"] for o in plan([want], {key: drifted}, memo).apply] == [{"a": "1"}]
    # Put right, at a newer version: up to date again.
    fixed = _live(want)
    fixed["metadata"]["resourceVersion"] = "9"
    assert plan([want], {key: fixed}, memo).unchanged == 1
    (changed,) = memo.prepare([_cm({"a": "3"})], OWNER, "dataplane")
    assert [o["data"] for o in plan([changed], {key: fixed}, memo).apply] == [{"a": "3"}]
    assert not memo.up_to_date(want, None)


def _ds(desired: int, ready: int, updated: int, gen: int = 1, observed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": gen},
        "status": {
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "updatedNumberScheduled": updated,
        },
    }


def test_daemonset_readiness_rule() -> None:
    assert daemonset_ready(_ds(3, 3, 3), 3)[0]
    assert not daemonset_ready(_ds(3, 2, 3), 3)[0]
    assert not daemonset_ready(_ds(3, 3, 2), 3)[0]
    assert not daemonset_ready(_ds(0, 0, 0), 2)[0]  # nothing scheduled for real nodes
    assert not daemonset_ready(_ds(3, 3, 3, gen=2, observed=1), 3)[0]
    assert not daemonset_ready(None, 1)[0]


def test_conditions_keep_transition_time_until_status_changes() -> None:
    first = merge_conditions([], [Verdict("Ready", "False", "DaemonSetNotReady", "m")], 1, "T1")
    same = merge_conditions(first, [Verdict("Ready", "False", "DaemonSetNotReady", "m2")], 2, "T2")
    assert same[0].last_transition_time == "T1" and same[0].observed_generation == 2
    flipped = merge_conditions(same, [Verdict("Ready", "True", "AgentsReady", "ok")], 2, "T3")
    assert flipped[0].last_transition_time == "T3"


def test_degraded_lists_every_problem_and_events_on_transitions() -> None:
    verdict = degraded_verdict([Problem("UnsupportedNodes", "win2019-1"), Problem("X", "y")])
    assert verdict.reason == "UnsupportedNodes" and "win2019-1" in verdict.message
    assert "y" in verdict.message
    empty = AmbientMeshStatus()
    before = build_status(None, 1, [verdict], [], empty.nodes, empty.enrollment, "T")
    after = build_status(before, 1, [verdict], [], empty.nodes, empty.enrollment, "T2")
    assert transitions(before, after) == []
    assert [c.type for c in transitions(None, before)] == ["Degraded"]


def _pod(**kw: Any) -> PodSummary:
    base: dict[str, Any] = dict(
        namespace="ns",
        name="p",
        mode=None,
        sidecar=False,
        host_network=False,
        os=None,
        node=None,
        redirection=None,
        phase="Running",
    )
    base.update(kw)
    return PodSummary(**base)


def test_enrollment_rules() -> None:
    ambient = {"istio.io/dataplane-mode": "ambient"}
    assert pod_enrolled(_pod(), ambient)
    assert not pod_enrolled(_pod(mode="none"), ambient)
    assert pod_enrolled(_pod(mode="ambient"), {})
    assert not pod_enrolled(_pod(sidecar=True), ambient)
    assert not pod_enrolled(_pod(host_network=True), ambient)
    totals = summarize(
        [
            _pod(name="a", redirection="enabled"),
            _pod(name="b", node="w1"),
            _pod(name="c", os="windows", redirection="pending"),
        ],
        {"ns": {"labels": ambient}},
        {"w1": "windows"},
    )
    assert totals.linux_pods.enabled == 1
    assert totals.windows_pods.missing == 1 and totals.windows_pods.pending == 1
    assert totals.example_pending_pods == ["ns/b", "ns/c"]


def test_namespace_problems() -> None:
    assert [r for r, _ in namespace_problems("n", {"istio.io/dataplane-mode": "on"}, {})] == [
        "InvalidDataplaneMode"
    ]
    both = {"istio.io/dataplane-mode": "ambient", "istio-injection": "enabled"}
    assert [r for r, _ in namespace_problems("n", both, {})] == ["SidecarAndAmbient"]
    wp = {"istio.io/use-waypoint": "wp"}
    assert [r for r, _ in namespace_problems("n", wp, {})] == ["WaypointNotFound"]
    assert [r for r, _ in namespace_problems("n", wp, {("n", "wp"): False})] == ["NotAWaypoint"]
    assert namespace_problems("n", wp, {("n", "wp"): True}) == []
