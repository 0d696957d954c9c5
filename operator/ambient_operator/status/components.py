"""AmbientMesh status from what the cluster reports. Pure functions.

The vocabulary is kept small and stable because it is an API: the condition
types Reconciled, Ready and Degraded, and their reasons, are MeshCondition
and MeshReason in api/conditions.py, with what each reason means. Degraded
names the first problem's reason, and its message lists them all.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import (
    INTENDED_EXCLUSIONS,
    MeshCondition,
    MeshReason,
    Problem,
    Verdict,
)
from ambient_operator.api.v1alpha1 import (
    AdoptionStatus,
    AmbientMeshSpec,
    AmbientMeshStatus,
    ComponentStatus,
    Condition,
    Enrollment,
    HeldTemplates,
    NodeInventory,
    NodeReadinessStatus,
    PlatformStatus,
    RevisionStatus,
    VersionStatus,
    WindowsStatus,
)
from ambient_operator.render.model import RenderResult
from ambient_operator.render.values import windows_istiod
from ambient_operator.status.schema import crd_problem
from ambient_operator.status.versions import version_skew


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


def daemonset_settled(live: Mapping[str, Any]) -> tuple[bool, bool, str]:
    """(settled, updating, progress) of a live DaemonSet, for the order of a version change.

    Settled: the controller saw our latest spec and every pod is updated and
    available. Updating: pods of an older template remain (or the latest
    spec is not observed yet), so a rollout of its template is under way.
    """
    meta = live.get("metadata", {})
    st = live.get("status") or {}
    if st.get("observedGeneration", 0) < meta.get("generation", 0):
        return False, True, "rollout not observed yet"
    desired = int(st.get("desiredNumberScheduled", 0))
    updated = int(st.get("updatedNumberScheduled", 0))
    available = int(st.get("numberAvailable", 0))
    updating = updated < desired
    progress = f"{updated}/{desired} updated, {available}/{desired} available"
    return not updating and available >= desired, updating, progress


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
        return Verdict(
            MeshCondition.READY, "False", MeshReason.NO_AGENTS, "no node gets a data-plane agent"
        )
    waiting = [f"{cs.name}: {why}" for cs, ok, why in components if not ok]
    if waiting:
        return Verdict(
            MeshCondition.READY, "False", MeshReason.DAEMONSET_NOT_READY, "; ".join(waiting)
        )
    total = sum(cs.ready for cs, _, _ in components)
    return Verdict(
        MeshCondition.READY,
        "True",
        MeshReason.AGENTS_READY,
        f"{len(components)} DaemonSets ready with {total} agent pods",
    )


def degraded_verdict(problems: Sequence[Problem]) -> Verdict:
    """The Degraded condition: the first problem names the reason, all are listed."""
    if not problems:
        return Verdict(
            MeshCondition.DEGRADED, "False", MeshReason.AS_EXPECTED, "nothing is degraded"
        )
    return Verdict(
        MeshCondition.DEGRADED,
        "True",
        problems[0].reason,
        "; ".join(p.message for p in problems),
    )


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
    node_readiness: NodeReadinessStatus | None = None,
    *,
    versions: VersionStatus | None = None,
    platform: PlatformStatus | None = None,
    adoption: AdoptionStatus | None = None,
    held: HeldTemplates | None = None,
    revisions: Sequence[RevisionStatus] = (),
    windows: WindowsStatus | None = None,
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
        node_readiness=node_readiness,
        versions=versions,
        platform=platform,
        adoption=adoption,
        held=held,
        revisions=list(revisions),
        windows=windows,
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


# -- Degraded: what the cluster lacks for the mesh to work --------------------------


def istiod_trust(
    result: RenderResult, istiod: Mapping[str, Any] | None
) -> tuple[list[str], list[str]] | None:
    """(accounts istiod trusts, our ztunnel accounts it does not); None without istiod.

    Read from istiod's Deployment (its CA_TRUSTED_NODE_ACCOUNTS env).
    """
    if istiod is None:
        return None  # nothing to check; IstiodNotFound covers a missing istiod
    ztunnel_accounts = sorted(
        f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        for obj in result.objects
        if obj["kind"] == "ServiceAccount"
        and obj["metadata"].get("labels", {}).get(c.LABEL_COMPONENT) == "ztunnel"
    )
    trusted: list[str] = []
    for container in (
        istiod.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    ):
        for env in container.get("env") or []:
            if env.get("name") == "CA_TRUSTED_NODE_ACCOUNTS":
                trusted += [p.strip() for p in str(env.get("value", "")).split(",") if p.strip()]
    return trusted, [acct for acct in ztunnel_accounts if acct not in trusted]


def mesh_problems(
    spec: AmbientMeshSpec,
    result: RenderResult,
    services: Collection[tuple[str, str]],
    istiod: Mapping[str, Any] | None,
    crd: Mapping[str, Any] | None = None,
) -> list[Problem]:
    """Everything that makes the mesh Degraded, most severe first, each cause once.

    `services` are the (namespace, name) of the Services the operator
    watches; `istiod` is istiod's Deployment, when found; `crd` the
    AmbientMesh CRD as served.
    """
    # The order is by how much of the mesh each problem stops, because the
    # first names Degraded's reason and is what an operator fixes first:
    # - an old CRD: what the user set may not be what the operator sees, so
    #   anything below may follow from it;
    # - no istiod: no agent anywhere gets configuration or a certificate;
    # - istiod not trusting a ztunnel account: every node of that account
    #   (the Windows ones, typically) runs agents that cannot serve a pod;
    # - version skew: every agent of that version runs a combination Istio
    #   does not support, which may fail anywhere; it comes before unsupported
    #   nodes, which are often for good (a WS2019 pool) and would hide it;
    # - unsupported nodes: those nodes only, and the rest of the mesh works;
    # - what the spec asks for and the cluster cannot have (Multus), told by render;
    # - render warnings: a fallback that may yet work.
    problems: list[Problem] = []
    outdated = crd_problem(crd)
    if outdated is not None:
        problems.append(outdated)
    service = spec.istiod.service()
    istiod_missing = (
        not spec.istiod.dialled_as_written() and (spec.namespace, service) not in services
    )
    if istiod_missing:
        problems.append(
            Problem(
                MeshReason.ISTIOD_NOT_FOUND,
                f"Service {spec.namespace}/{service} not found; agents cannot reach istiod",
            )
        )
    trust = istiod_trust(result, istiod)
    if trust is not None and trust[1]:
        trusted, missing = trust
        problems.append(Problem(MeshReason.ISTIOD_TRUST_MISSING, trust_message(trusted, missing)))
    skew = version_skew(result.rollout, istiod)
    if skew is not None:
        problems.append(skew)
    unsupported = [v for v in result.unsupported() if v.reason not in INTENDED_EXCLUSIONS]
    if unsupported:
        listed = ", ".join(f"{v.node} ({v.reason}: {v.message})" for v in unsupported[:10])
        more = f" and {len(unsupported) - 10} more" if len(unsupported) > 10 else ""
        problems.append(
            Problem(
                MeshReason.UNSUPPORTED_NODES,
                f"{len(unsupported)} node(s) get no ambient agent: {listed}{more}",
            )
        )
    problems.extend(result.problems)
    # A missing istiod Service also leaves its IP unknown to the render, which
    # warns about the Windows agents' fallback: the same cause, told above.
    said = {windows_istiod(spec, None)[1]} if istiod_missing else set()
    for warning in dict.fromkeys(result.warnings):
        if warning not in said:
            problems.append(Problem(MeshReason.RENDER_WARNING, warning))
    return problems


# -- Reconciled: what one pass of writes came to ------------------------------------


@dataclass
class ApplyOutcome:
    """What one pass of writes and prunes came to."""

    conflicts: list[str] = field(default_factory=list)
    # (what was written or pruned, the API server's message), in pass order.
    errors: list[tuple[str, str]] = field(default_factory=list)
    # Why the old namespace's objects were kept this pass (a move under way).
    waiting: str | None = None
    # Which platform's agents roll and which wait (status/versions.py, rollout_message).
    rollout: str | None = None
    # Why spec.adopt takes nothing this pass (apply/adopt.py): nothing was written.
    refused: Sequence[str] = ()
    # DaemonSets taken over that run Helm's template (status/adoption.py, as_is_message).
    as_is: str | None = None
    # DaemonSets that keep the template they run (status/held.py, held_message).
    held: str | None = None

    def failed(self, what: str, cause: str) -> None:
        """Record a write or prune of `what` that the API server refused with `cause`."""
        self.errors.append((what, cause))

    def verdict(self, objects: int) -> Verdict:
        """The Reconciled condition."""
        if self.refused:
            return Verdict(
                MeshCondition.RECONCILED,
                "False",
                MeshReason.ADOPTION_REFUSED,
                f"spec.adopt takes nothing: {'; '.join(self.refused)}. Nothing was written; "
                "status.adoption.refused lists the same",
            )
        if self.conflicts:
            message = "; ".join([*self.conflicts, *failures(self.errors)])
            return Verdict(
                MeshCondition.RECONCILED,
                "False",
                MeshReason.NAME_CONFLICT,
                f"{message}. Objects that are not this AmbientMesh's are never changed or "
                "deleted: remove or rename them, or choose another spec.namespace; "
                "nothing was pruned",
            )
        if self.errors:
            return Verdict(
                MeshCondition.RECONCILED,
                "False",
                MeshReason.APPLY_FAILED,
                "; ".join(failures(self.errors)) + "; nothing was pruned",
            )
        message = f"{objects} objects match the spec"
        if self.waiting:
            message += f"; {self.waiting}"
        if self.rollout:
            message += f"; {self.rollout}"
        if self.held:
            message += f"; {self.held}"
        if self.as_is:
            message += f"; {self.as_is}"
            return Verdict(MeshCondition.RECONCILED, "True", MeshReason.ADOPTED_AS_IS, message)
        if self.held:
            return Verdict(MeshCondition.RECONCILED, "True", MeshReason.TEMPLATES_HELD, message)
        return Verdict(MeshCondition.RECONCILED, "True", MeshReason.RECONCILED, message)


FAILED_EXAMPLES = 3


def failures(errors: Sequence[tuple[str, str]]) -> list[str]:
    """One line per cause, in the order causes first came, with the objects it hit.

    A pass whose writes all fail for one reason (a namespace gone, a webhook
    down, the API server unreachable) fails once per object; the cause is
    told once, with how many objects it hit and the first few of them.
    """
    hit: dict[str, list[str]] = {}
    for what, cause in errors:
        hit.setdefault(cause, []).append(what)
    out = []
    for cause, objects in hit.items():
        if len(objects) == 1:
            out.append(f"{objects[0]}: {cause}")
            continue
        named = ", ".join(objects[:FAILED_EXAMPLES])
        more = len(objects) - FAILED_EXAMPLES
        if more > 0:
            named += f" and {more} more"
        out.append(f"{cause} ({len(objects)} objects: {named})")
    return out


def trust_message(trusted: Sequence[str], missing: Sequence[str]) -> str:
    """IstiodTrustMissing: what istiod trusts, what it lacks, and the Helm value that fixes it.

    Upstream's istiod chart renders CA_TRUSTED_NODE_ACCOUNTS from
    `trustedZtunnelNamespace`/`trustedZtunnelName`, one account only, unless
    `env.CA_TRUSTED_NODE_ACCOUNTS` is set; the Windows ztunnels' account
    needs the latter. The value keeps what istiod trusts already.
    """
    wanted = ",".join(dict.fromkeys([*trusted, *missing]))
    now = ",".join(trusted) or "nothing"
    return (
        f"istiod's CA_TRUSTED_NODE_ACCOUNTS ({now}) lacks {', '.join(missing)}; those "
        "ztunnels cannot get certificates for their pods. Set the istiod chart value "
        f"env.CA_TRUSTED_NODE_ACCOUNTS={wanted} (helm upgrade ... --reset-then-reuse-values "
        f"--set-string env.CA_TRUSTED_NODE_ACCOUNTS={wanted.replace(',', chr(92) + ',')})"
    )
