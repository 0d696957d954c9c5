"""AmbientMesh status from what the cluster reports. Pure functions.

Vocabulary, kept small and stable because it is an API:
- Reconciled: True/Reconciled, or False with InvalidSpec, NamespaceNotFound,
  NamespaceNotAllowed, RenderFailed, NameConflict, ApplyFailed.
- Ready: True/AgentsReady, or False with DaemonSetNotReady, NoAgents.
- Degraded: False/AsExpected, or True with UnsupportedNodes, IstiodNotFound,
  IstiodTrustMissing, ClusterDNSNotFound (first in that order; the message lists all).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api.v1alpha1 import (
    AmbientMeshStatus,
    ComponentStatus,
    Condition,
    Enrollment,
    NodeInventory,
)

READY_TRUE = "AgentsReady"


@dataclass(frozen=True)
class Verdict:
    """One condition before timestamps: type, status, reason, message."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Problem:
    """Something that degrades the mesh (reason, message)."""

    reason: str
    message: str


def component_status(
    name: str, component: str, platform: str, live: Mapping[str, Any] | None
) -> ComponentStatus:
    """Counts of one DaemonSet from its live status (zeros when it is missing)."""
    st = (live or {}).get("status") or {}
    return ComponentStatus(
        name=name,
        component=component,
        platform=platform,
        desired=int(st.get("desiredNumberScheduled", 0)),
        current=int(st.get("currentNumberScheduled", 0)),
        updated=int(st.get("updatedNumberScheduled", 0)),
        ready=int(st.get("numberReady", 0)),
        available=int(st.get("numberAvailable", 0)),
    )


def daemonset_ready(live: Mapping[str, Any] | None, expected_nodes: int) -> tuple[bool, str]:
    """Ready when the controller saw our latest spec and every pod is updated and ready.

    A DaemonSet with nothing scheduled is not ready when nodes are meant to run it.
    """
    if live is None:
        return False, "not created yet"
    meta = live.get("metadata", {})
    st = live.get("status") or {}
    if st.get("observedGeneration", 0) < meta.get("generation", 0):
        return False, "rollout not observed yet"
    desired = int(st.get("desiredNumberScheduled", 0))
    updated = int(st.get("updatedNumberScheduled", 0))
    ready = int(st.get("numberReady", 0))
    if desired == 0 and expected_nodes > 0:
        return False, f"0 pods scheduled for {expected_nodes} node(s)"
    if updated < desired or ready < desired:
        return False, f"{ready}/{desired} ready, {updated}/{desired} updated"
    return True, f"{ready}/{desired} ready"


def daemonset_placed(live: Mapping[str, Any] | None, expected_nodes: int) -> tuple[bool, str]:
    """Placed when the controller saw our latest spec and every node has its updated pod,
    running or not.

    For agents on the host network, which cannot run twice on a node (their
    ports, the node's CNI configuration): a replacement's pods wait, Pending,
    until the pods they replace have left, so they cannot be Ready first.
    """
    if live is None:
        return False, "not created yet"
    meta = live.get("metadata", {})
    st = live.get("status") or {}
    if st.get("observedGeneration", 0) < meta.get("generation", 0):
        return False, "rollout not observed yet"
    desired = int(st.get("desiredNumberScheduled", 0))
    current = int(st.get("currentNumberScheduled", 0))
    updated = int(st.get("updatedNumberScheduled", 0))
    if desired == 0 and expected_nodes > 0:
        return False, f"0 pods scheduled for {expected_nodes} node(s)"
    if current < desired or updated < desired:
        return False, f"{min(current, updated)}/{desired} placed"
    return True, f"{desired}/{desired} placed"


def ready_verdict(
    components: Sequence[tuple[ComponentStatus, bool, str]],
    served_nodes: int | None = None,
) -> Verdict:
    """The Ready condition from each DaemonSet's readiness.

    `served_nodes` is how many nodes the render placed an agent on. Linux
    DaemonSets are rendered even when no node takes them, so rendered
    DaemonSets alone do not mean any node gets an agent.
    """
    if not components or served_nodes == 0:
        return Verdict("Ready", "False", "NoAgents", "no node gets a data-plane agent")
    waiting = [f"{cs.name}: {why}" for cs, ok, why in components if not ok]
    if waiting:
        return Verdict("Ready", "False", "DaemonSetNotReady", "; ".join(waiting))
    total = sum(cs.ready for cs, _, _ in components)
    return Verdict(
        "Ready",
        "True",
        READY_TRUE,
        f"{len(components)} DaemonSets ready with {total} agent pods",
    )


def degraded_verdict(problems: Sequence[Problem]) -> Verdict:
    """The Degraded condition: the first problem names the reason, all are listed."""
    if not problems:
        return Verdict("Degraded", "False", "AsExpected", "nothing is degraded")
    return Verdict("Degraded", "True", problems[0].reason, "; ".join(p.message for p in problems))


def merge_conditions(
    previous: Iterable[Condition], verdicts: Iterable[Verdict], generation: int, now: str
) -> list[Condition]:
    """Conditions in the standard form; a transition time moves only on a status change."""
    before = {cond.type: cond for cond in previous}
    out: list[Condition] = []
    for v in verdicts:
        old = before.get(v.type)
        since = old.last_transition_time if old is not None and old.status == v.status else now
        out.append(
            Condition(
                type=v.type,
                status=v.status,
                observed_generation=generation,
                last_transition_time=since,
                reason=v.reason,
                message=v.message[:32768],
            )
        )
    return out


def build_status(
    previous: AmbientMeshStatus | None,
    generation: int,
    verdicts: Sequence[Verdict],
    components: Sequence[tuple[ComponentStatus, bool, str]],
    nodes: NodeInventory,
    enrollment: Enrollment,
    now: str,
) -> AmbientMeshStatus:
    """The whole status object."""
    prev_conditions = previous.conditions if previous else []
    ready = sum(1 for _, ok, _ in components if ok)
    return AmbientMeshStatus(
        observed_generation=generation,
        conditions=merge_conditions(prev_conditions, verdicts, generation, now),
        components=[cs for cs, _, _ in components],
        nodes=nodes,
        enrollment=enrollment,
        ready_components=f"{ready}/{len(components)}",
    )


def transitions(previous: AmbientMeshStatus | None, current: AmbientMeshStatus) -> list[Condition]:
    """Conditions whose status or reason changed: each deserves an Event."""
    before = {(cond.type): cond for cond in (previous.conditions if previous else [])}
    changed = []
    for cond in current.conditions:
        old = before.get(cond.type)
        if old is None or old.status != cond.status or old.reason != cond.reason:
            changed.append(cond)
    return changed
