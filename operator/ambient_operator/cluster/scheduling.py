"""Kubernetes placement semantics, evaluated offline.

The rules mirror the scheduler's NodeAffinity and TaintToleration plugins
(and the DaemonSet controller, which runs the same predicates): nodeSelector
labels must all match; required node-affinity terms are ORed and the
requirements inside a term are ANDed; NoSchedule and NoExecute taints must
be tolerated. A requirement the API server would reject makes its term match
nothing, as in the scheduler, rather than raising.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ambient_operator.cluster.facts import NodeFacts, Taint

# The DaemonSet controller adds these to every daemon pod it creates, so a
# daemon pod lands on cordoned, not-ready or pressured nodes whatever the
# template says (pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations).
DAEMON_POD_TOLERATIONS: tuple[Mapping[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_DAEMON_TOLERATION: Mapping[str, str] = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_FIELD_NAME = "metadata.name"
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def _int64(text: str) -> int | None:
    # Go's strconv.ParseInt, not Python's int(): no spaces, no underscores.
    if not _DECIMAL.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _label_requirement(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool | None:
    """Whether one matchExpressions entry holds; None when the entry is invalid."""
    key = expr.get("key")
    op = expr.get("operator")
    values = list(expr.get("values") or [])
    if not isinstance(key, str) or not key:
        return None
    present = key in labels
    if op == "In":
        return (present and labels[key] in values) if values else None
    if op == "NotIn":
        return (not present or labels[key] not in values) if values else None
    if op == "Exists":
        return present if not values else None
    if op == "DoesNotExist":
        return (not present) if not values else None
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            return None
        bound = _int64(str(values[0]))
        if bound is None:
            return None
        if not present:
            return False
        actual = _int64(labels[key])
        if actual is None:
            return False
        return actual > bound if op == "Gt" else actual < bound
    return None


def _field_requirement(expr: Mapping[str, Any], node: NodeFacts) -> bool | None:
    """Whether one matchFields entry holds; only metadata.name with In/NotIn is valid."""
    if expr.get("key") != _FIELD_NAME:
        return None
    values = list(expr.get("values") or [])
    op = expr.get("operator")
    # The API server refuses a node field selector with other than exactly
    # one value, so a list of names must be spelled as one term per name.
    if len(values) != 1:
        return None
    if op == "In":
        return bool(node.name == values[0])
    if op == "NotIn":
        return bool(node.name != values[0])
    return None


def _term_matches(term: Mapping[str, Any], node: NodeFacts) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term selects no node
    for expr in expressions:
        if _label_requirement(expr, node.labels) is not True:
            return False
    return all(_field_requirement(expr, node) is True for expr in fields)


def required_terms(pod_spec: Mapping[str, Any]) -> Sequence[Mapping[str, Any]] | None:
    """The required node-affinity terms of a pod spec, or None when there are none."""
    affinity = pod_spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    terms: Sequence[Mapping[str, Any]] = required.get("nodeSelectorTerms") or []
    return terms


def node_matches(pod_spec: Mapping[str, Any], node: NodeFacts) -> bool:
    """Whether the pod's nodeName, nodeSelector and required node affinity admit the node.

    Taints are separate: see `tolerates` and `schedulable`.
    """
    node_name = pod_spec.get("nodeName")
    if node_name and node_name != node.name:
        return False
    selector: Mapping[str, str] = pod_spec.get("nodeSelector") or {}
    for key, value in selector.items():
        if node.labels.get(key) != value:
            return False
    terms = required_terms(pod_spec)
    if terms is None:
        return True
    return any(_term_matches(term, node) for term in terms)


def toleration_matches(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """Whether one toleration tolerates one taint, as core/v1 Toleration.ToleratesTaint says.

    An empty key matches every key (the API allows that only with Exists).
    The Gt/Lt operators sit behind an alpha gate that is off by default, so
    they match nothing here.
    """
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.value or ""))
    return False


def tolerates(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Taint]) -> bool:
    """Whether every NoSchedule and NoExecute taint is tolerated by some toleration.

    PreferNoSchedule taints only lower a node's score, so they never block.
    """
    tols = list(tolerations)
    return all(
        any(toleration_matches(t, taint) for t in tols)
        for taint in taints
        if taint.effect in _BLOCKING_EFFECTS
    )


def untolerated(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Taint]) -> list[Taint]:
    """The blocking taints no toleration covers, in the node's order."""
    tols = list(tolerations)
    return [
        taint
        for taint in taints
        if taint.effect in _BLOCKING_EFFECTS and not any(toleration_matches(t, taint) for t in tols)
    ]


def schedulable(pod_spec: Mapping[str, Any], node: NodeFacts) -> bool:
    """Whether an ordinary pod with this spec may be placed on the node."""
    tolerations = pod_spec.get("tolerations") or []
    return node_matches(pod_spec, node) and tolerates(tolerations, node.taints)


def daemon_pod_tolerations(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's tolerations plus those the DaemonSet controller adds to daemon pods."""
    tols: list[Mapping[str, Any]] = list(pod_spec.get("tolerations") or [])
    tols.extend(DAEMON_POD_TOLERATIONS)
    if pod_spec.get("hostNetwork"):
        tols.append(HOST_NETWORK_DAEMON_TOLERATION)
    return tols


def daemon_schedulable(pod_spec: Mapping[str, Any], node: NodeFacts) -> bool:
    """Whether the DaemonSet controller would run a pod with this template spec on the node."""
    return node_matches(pod_spec, node) and tolerates(daemon_pod_tolerations(pod_spec), node.taints)
