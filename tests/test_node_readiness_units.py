"""Node readiness gating, offline: what a pod summary keeps of an agent, and who is released.

Literal pods and nodes; the API server's side (the patch, RBAC, a race with
another taint writer) is tests/test_node_readiness.py's.
"""

from __future__ import annotations

from typing import Any

import pytest

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.readiness import judge
from ambient_operator.cluster.state import PodSummary

TAINT = {"key": "cni.istio.io/not-ready", "effect": "NoSchedule"}


def _pod(
    name: str,
    node: str,
    component: str | None,
    ready: bool,
    *,
    namespace: str = "istio-system",
    managed: bool = True,
    deleting: bool = False,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": component} if component else {}
    if managed:
        labels["app.kubernetes.io/managed-by"] = "ambient-operator"
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


@pytest.mark.parametrize(
    ("pod", "agent", "ready"),
    [
        (_pod("z", "n", "ztunnel", True), "ztunnel", True),
        (_pod("c", "n", "istio-cni", False), "istio-cni", False),
        # Terminating: its node loses it soon; not a reason to release.
        (_pod("z", "n", "ztunnel", True, deleting=True), "ztunnel", False),
        # Upstream's own agents (Helm's labels, not ours) are not this mesh's.
        (_pod("z", "n", "ztunnel", True, managed=False), None, False),
        # Our waypoint pods carry our labels with another component.
        (_pod("w", "n", "waypoint", True), None, False),
        # Any other pod keeps no readiness, so its flapping changes nothing.
        (_pod("app", "n", None, True, managed=False), None, False),
    ],
)
def test_the_summary_keeps_agents_and_their_readiness(
    pod: dict[str, Any], agent: str | None, ready: bool
) -> None:
    summary = PodSummary.of(pod)
    assert (summary.agent, summary.ready) == (agent, ready)


def _node(name: str, *taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"taints": list(taints)}}


def test_only_nodes_with_both_agents_ready_are_released() -> None:
    nodes = {
        "both": _node("both", TAINT),
        "cni-only": _node("cni-only", TAINT),
        "ztunnel-only": _node("ztunnel-only", TAINT),
        "cni-not-ready": _node("cni-not-ready", TAINT),
        "elsewhere": _node("elsewhere", TAINT),
        "untainted": _node("untainted"),
        "other-effect": _node("other-effect", {**TAINT, "effect": "NoExecute"}),
        "with-value": _node("with-value", {**TAINT, "value": "true"}),
        "unsupported": _node("unsupported", TAINT),
    }
    pods = [
        _pod("z1", "both", "ztunnel", True),
        _pod("c1", "both", "istio-cni", True),
        _pod("c2", "cni-only", "istio-cni", True),
        _pod("z3", "ztunnel-only", "ztunnel", True),
        _pod("z4", "cni-not-ready", "ztunnel", True),
        _pod("c4", "cni-not-ready", "istio-cni", False),
        # Agents of another namespace (an old one during a move) do not count.
        _pod("z5", "elsewhere", "ztunnel", True, namespace="old-agents"),
        _pod("c5", "elsewhere", "istio-cni", True, namespace="old-agents"),
        _pod("z6", "untainted", "ztunnel", True),
        _pod("c6", "untainted", "istio-cni", True),
        _pod("z7", "other-effect", "ztunnel", True),
        _pod("c7", "other-effect", "istio-cni", True),
        _pod("z8", "with-value", "ztunnel", True),
        _pod("c8", "with-value", "istio-cni", True),
    ]
    served = set(nodes) - {"unsupported"}
    gate = judge(
        nodes,
        served,
        [PodSummary.of(p) for p in pods],
        "istio-system",
        "cni.istio.io/not-ready",
        "NoSchedule",
    )
    assert gate.release == ("both", "with-value")
    assert gate.waiting == ("cni-not-ready", "cni-only", "elsewhere", "ztunnel-only")


def test_examples_are_bounded() -> None:
    nodes = {f"n{i:02}": _node(f"n{i:02}", TAINT) for i in range(12)}
    gate = judge(nodes, set(nodes), [], "istio-system", TAINT["key"], TAINT["effect"])
    assert len(gate.waiting) == 12
    assert gate.examples() == ["n00", "n01", "n02", "n03", "n04"]


def test_off_by_default_with_upstreams_taint() -> None:
    spec = AmbientMeshSpec()
    assert spec.node_readiness.enabled is False
    assert (spec.node_readiness.taint.key, spec.node_readiness.taint.effect) == (
        "cni.istio.io/not-ready",
        "NoSchedule",
    )
    with pytest.raises(ValueError):
        AmbientMeshSpec.model_validate({"nodeReadiness": {"taint": {"key": "not a key"}}})
    with pytest.raises(ValueError):
        AmbientMeshSpec.model_validate({"nodeReadiness": {"taint": {"effect": "Sometimes"}}})
