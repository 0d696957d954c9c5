"""The data-plane reconcile: facts -> render -> apply/prune -> status.

Thin on purpose: every decision lives in render, apply, the writer and
status; this module gathers inputs, calls them in order, and reports.

What it may touch, and when:
- Nothing at all while spec.namespace cannot take the agents (missing,
  being deleted, or not one the operator is allowed to write to): the
  status says why, once, and the agents keep running where they are.
- Only objects of this mesh: every write and delete goes through apply/writer.py,
  which refuses anything without this mesh's controller reference
  (NameConflict) and deletes by UID.
- Nothing is pruned in a pass where any write failed or was refused.
- A move of spec.namespace is make-before-break: the old namespace's
  objects are pruned only once every DaemonSet in the new one is Ready, or,
  for agents that cannot run twice on a node, placed (see _taking_over in
  dataplane_moves.py, with the rest of a move).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import (
    MeshCondition,
    MeshEvent,
    MeshReason,
    Problem,
    Verdict,
)
from ambient_operator.api.v1alpha1 import (
    AdoptionStatus,
    AmbientMeshSpec,
    AmbientMeshStatus,
    ComponentStatus,
    Enrollment,
    HeldTemplates,
    NodeInventory,
    NodeReadinessStatus,
    PlatformStatus,
    RevisionStatus,
)
from ambient_operator.apply.adopt import Takeover, as_adopted
from ambient_operator.apply.held import (
    APPROVE,
    Held,
    Hold,
    apply_hold,
    approval,
    held,
    inputs_digest,
)
from ambient_operator.apply.order import in_pass_order, write_in_order
from ambient_operator.apply.ownership import conflict, describe
from ambient_operator.apply.plan import Owner, PassMemo, plan
from ambient_operator.apply.writer import NameConflictError, prune, set_finalizer, write
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.cluster.versions import (
    AgentTag,
    RunningAgent,
    agent_tag,
    image_version,
    release_tag,
)
from ambient_operator.controllers.adoption import ORPHAN_FINALIZER, gather_takeover, orphan_all
from ambient_operator.controllers.dataplane_moves import (
    CONTROLLER,
    NETWORK_ATTACHMENT,
    DataplaneMoves,
    _named,
    _uses,
    spec_error,
)
from ambient_operator.controllers.node_readiness import NodeReadinessGate
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import ObjectKey, key_of
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.render.dataplane import RenderMemo, deletes_pods
from ambient_operator.render.model import PLATFORM_LINUX
from ambient_operator.render.rollout import release_held
from ambient_operator.render.values import NETWORK_ATTACHMENT_NAMESPACE, ZTUNNEL
from ambient_operator.render.waypoints.settings import default_image
from ambient_operator.status.adoption import adoption_status, as_is_message
from ambient_operator.status.components import (
    ApplyOutcome,
    build_status,
    component_status,
    daemonset_ready,
    degraded_verdict,
    mesh_problems,
    ready_verdict,
    transitions,
)
from ambient_operator.status.held import held_message, held_platforms, held_status
from ambient_operator.status.platform import platform_status
from ambient_operator.status.revisions import revisions_status
from ambient_operator.status.schema import status_for
from ambient_operator.status.versions import rollout_message, version_status
from ambient_operator.status.windows import pod_limit_message, windows_status
from ambient_operator.status.writer import write_status

log = logging.getLogger(__name__)
# The operator chart's value that grants istio-cni delete on pods (and sets
# --istio-cni-may-delete-pods).
CHART_DELETE_PODS_VALUE = "istioCniRepair.deletePods"


def repair_refusal(spec: AmbientMeshSpec, *, may_delete_pods: bool, by_chart: bool) -> str | None:
    """Why the spec's repair mode cannot be had, or None.

    Judged before anything is written: a ConfigMap asking istio-cni to delete
    pods beside a role that does not let it would fail pod after pod, and
    without the chart the API server refuses to let the operator grant what it
    does not hold. `may_delete_pods`: the chart grants it, or the operator holds
    it; `by_chart`: the chart ships istio-cni's RBAC (--cni-rbac=chart).
    """
    if not deletes_pods(spec) or may_delete_pods:
        return None
    fix = (
        f"set the chart value {CHART_DELETE_PODS_VALUE}=true (helm upgrade ... "
        "--reset-then-reuse-values "
        f"--set {CHART_DELETE_PODS_VALUE}=true), which grants it"
        if by_chart
        else "grant the operator delete on pods: it keeps istio-cni's ClusterRole, and RBAC "
        "lets it grant only what it holds"
    )
    return (
        "spec.istioCni.repairMode Delete has istio-cni delete pods that started without "
        "redirection, and istio-cni may not be granted delete on pods; nothing was changed. "
        f"To allow it, {fix}; or set spec.istioCni.repairMode to Repair or Label"
    )


@dataclass(frozen=True)
class _LastPass:
    """What a full pass found and rendered, which a status-only pass builds the status from.

    Kept only after a full pass that left nothing to do (controllers/dataplane.py).
    """

    uid: str
    generation: int
    # The spec as rendered (the agents' tag chosen), and how the tag was chosen.
    spec: AmbientMeshSpec
    chosen: AgentTag
    result: RenderResult
    # Our agents as they ran when rendered: render's input that status news moves.
    agents: Mapping[tuple[str, str], RunningAgent]
    # This mesh's DaemonSets in spec.namespace after the pass's writes.
    daemonsets: tuple[ObjectKey, ...]
    platform: PlatformStatus
    inventory: NodeInventory
    held: HeldTemplates | None
    held_message: str | None
    node_readiness: NodeReadinessStatus | None
    problems: tuple[Problem, ...]


class DataplaneController(DataplaneMoves):
    """Keeps the agents' DaemonSets and friends as the AmbientMesh asks."""

    # The last full pass, while a status-only pass may build on it; None: the
    # next pass is full.
    _last: _LastPass | None = None
    # status.revisions with the inputs it was built from (_revisions).
    _revisions_memo: tuple[Any, list[RevisionStatus]] | None = None

    @functools.cached_property
    def passes(self) -> Counter[str]:
        """Passes run by kind, "full" or "status" (also a metric), for tests that count."""
        return Counter()

    @functools.cached_property
    def node_readiness(self) -> NodeReadinessGate:
        """The opt-in removal of nodes' readiness taints (controllers/node_readiness.py)."""
        return NodeReadinessGate(self.state, self.kube)

    # What TEMPLATE_BY records (apply/held.py): the version and a digest of the code.
    version = c.operator_build()

    @functools.cached_property
    def memo(self) -> PassMemo:
        """What the last pass prepared and found up to date (apply/plan.py)."""
        return PassMemo()

    @functools.cached_property
    def renders(self) -> RenderMemo:
        """Each platform's last render, by its inputs (render/dataplane.py)."""
        return RenderMemo()

    def render(self, spec: AmbientMeshSpec, facts: ClusterFacts) -> RenderResult:
        """This pass's desired objects; only what changed since the last pass is rendered."""
        return render_dataplane(spec, facts, cni_rbac=self.cni_rbac, memo=self.renders)

    def problems(self, spec: AmbientMeshSpec, result: RenderResult) -> list[Problem]:
        """Everything that makes the mesh Degraded (judged in status/components.py)."""
        return mesh_problems(
            spec, result, set(self.state.services), self.istiod(spec), self.state.mesh_crd
        )

    def istiod(self, spec: AmbientMeshSpec) -> dict[str, Any] | None:
        """istiod's Deployment, when the caches hold it (named like its Service)."""
        return self.state.deployments.get((spec.namespace, spec.istiod.service()))

    # -- the reconcile --------------------------------------------------------
    async def reconcile(self) -> None:
        """One pass; writes only what differs."""
        mesh = self.state.mesh
        if mesh is None:
            return
        if mesh.get("metadata", {}).get("deletionTimestamp"):
            # Garbage collection removes what the mesh owned, unless
            # spec.deletionPolicy Orphan put our finalizer on it.
            if ORPHAN_FINALIZER in (mesh["metadata"].get("finalizers") or []):
                await self._orphan(mesh)
            return
        started = time.monotonic()
        metrics.RECONCILES.labels(controller=CONTROLLER).inc()
        try:
            await self._reconcile(mesh)
        finally:
            metrics.RECONCILE_SECONDS.labels(controller=CONTROLLER).observe(
                time.monotonic() - started
            )

    async def _reconcile(self, mesh: dict[str, Any]) -> None:
        # Only status news since the last full pass: the status alone is built
        # again, from that pass's render and the caches (_status_pass).
        if not self.state.full_pass_due and await self._status_pass(mesh):
            return
        self.state.full_pass_due = False
        self._last = None
        self._count_pass("full")
        try:
            await self._full_pass(mesh)
        except BaseException:
            self.state.full_pass_due = True  # what it did not finish, the next pass does
            raise

    async def _full_pass(self, mesh: dict[str, Any]) -> None:
        generation = int(mesh["metadata"].get("generation", 0))
        previous = self._previous_status(mesh)
        try:
            spec = AmbientMeshSpec.model_validate(mesh.get("spec") or {})
        except ValidationError as exc:
            await self._fail(mesh, previous, generation, MeshReason.INVALID_SPEC, spec_error(exc))
            return
        spec = spec.with_default_registry(self.default_registry)
        owner = Owner.of(mesh)
        try:
            await asyncio.to_thread(
                set_finalizer, self.kube, mesh, ORPHAN_FINALIZER, spec.deletion_policy == "Orphan"
            )
        except KubeError as exc:
            # Reported, not fatal: the agents are kept as the spec says; only
            # what deleting the AmbientMesh does waits for the next pass.
            await self._fail(
                mesh,
                previous,
                generation,
                MeshReason.APPLY_FAILED,
                f"spec.deletionPolicy: the AmbientMesh's finalizer {ORPHAN_FINALIZER} "
                f"could not be written: {exc.message}",
            )
            return
        # Read once: it walks every object the operator keeps. The pass's own
        # writes and prunes are kept in it as they are made (_apply).
        ours = self.ours(owner)
        chosen = self._agent_tag(spec, ours)
        if chosen.tag != spec.images.tag:
            spec = spec.model_copy(
                update={"images": spec.images.model_copy(update={"tag": chosen.tag})}
            )
        refusal = await self.namespace_refusal(spec.namespace, ours)
        self.state.refused_namespace = spec.namespace if refusal is not None else None
        if refusal is not None:
            await self._fail(mesh, previous, generation, *refusal)
            return
        refused = (
            repair_refusal(
                spec,
                may_delete_pods=await asyncio.to_thread(self.may_grant_pod_delete),
                by_chart=not self.cni_rbac,
            )
            if deletes_pods(spec)
            else None
        )
        if refused is not None:
            await self._fail(
                mesh, previous, generation, MeshReason.REPAIR_MODE_NOT_GRANTED, refused
            )
            return
        moving_from = sorted(self.agent_namespaces(ours) - {spec.namespace})
        # The same nodes as the facts below: nothing awaits in between.
        choice = self.platform_choice(spec)
        try:
            attachments = await asyncio.to_thread(self.network_attachments, spec)
            facts = self.facts(spec, moving_from, ours, choice, attachments)
            # Pure, and the pass's largest piece of CPU (bench/profile_passes.py):
            # in a thread, the event loop keeps serving the waypoints' pass and
            # the watches meanwhile (a Gateway made with its namespace waited
            # for the namespace's data-plane pass). Only the platforms whose
            # inputs changed are rendered again (RenderMemo).
            result = await asyncio.to_thread(self.render, spec, facts)
        except Exception as exc:  # a render bug must show in status, not kill the loop
            log.exception("render failed")
            await self._fail(mesh, previous, generation, MeshReason.RENDER_FAILED, str(exc))
            return

        takeover = await self._takeover(spec, owner, ours, result)
        objects, held = self._to_write(mesh, spec, ours, result, takeover)
        outcome = await self._apply(
            owner, ours, spec.namespace, moving_from, result, objects, takeover
        )
        gated, gate_problems = await self.node_readiness.reconcile(spec, result)
        last = _LastPass(
            uid=owner.uid,
            generation=generation,
            spec=spec,
            chosen=chosen,
            result=result,
            agents=facts.agents,
            daemonsets=tuple(
                key for key in ours if key[:3] == ("apps/v1", "DaemonSet", spec.namespace)
            ),
            platform=platform_status(choice),
            inventory=result.inventory(),
            held=held,
            held_message=held_message(
                held,
                [p.platform for p in result.rollout.platforms],
                {
                    p.platform: p.why
                    for p in result.rollout.platforms
                    if p.state == "rolling" and not p.settling
                },
            ),
            node_readiness=gated,
            problems=(*self.problems(spec, result), *gate_problems),
        )
        outcome.held = last.held_message
        adoption = adoption_status(takeover, ours, result.objects)
        outcome.as_is = as_is_message(adoption, spec.namespace, held=held is not None)
        await self._finish(mesh, previous, last, ours, outcome, adoption, nodes=True)
        # A status-only pass may follow only a pass that left nothing to do:
        # no write failed or was refused, no move or take-over is under way
        # (their next step waits on the agents' readiness, which is status).
        clean = not (outcome.conflicts or outcome.errors or outcome.refused or outcome.waiting)
        if clean and not moving_from and takeover is None:
            self._last = last

    async def _status_pass(self, mesh: dict[str, Any]) -> bool:
        """The status again from the last full pass's render and the caches; False when a
        full pass is needed.

        Run when only status news came since that pass (the pokes said so,
        ClusterState.full_pass_due): pods, our objects' status, the webhook's
        miss count. Our agents' rollout state is one of render's inputs that
        such news moves; when it moved, the full pass runs. Costs the
        DaemonSets and what changed: the enrollment totals are kept as pods
        change (ClusterState.tally), status.revisions as their inputs do.
        """
        last = self._last
        meta = mesh.get("metadata") or {}
        if (
            last is None
            or meta.get("uid") != last.uid
            or int(meta.get("generation", 0)) != last.generation
        ):
            return False
        owned, owner = self.state.owned, Owner.of(mesh)
        ours = {
            key: live
            for key in last.daemonsets
            if (live := owned.get(key)) is not None and conflict(live, owner) is None
        }
        if self.running_agents(last.spec.namespace, ours) != last.agents:
            return False
        self._count_pass("status")
        outcome = ApplyOutcome(held=last.held_message)
        await self._finish(mesh, self._previous_status(mesh), last, ours, outcome, None)
        return True

    def _count_pass(self, kind: str) -> None:
        self.passes[kind] += 1
        metrics.DATAPLANE_PASSES.labels(kind=kind).inc()

    async def _finish(
        self,
        mesh: dict[str, Any],
        previous: AmbientMeshStatus | None,
        last: _LastPass,
        ours: Mapping[ObjectKey, Mapping[str, Any]],
        outcome: ApplyOutcome,
        adoption: AdoptionStatus | None,
        *,
        nodes: bool = False,
    ) -> None:
        """Build the status of a pass (full or status-only) and write it when it differs.

        `ours` holds at least the DaemonSets rendered; `nodes` exports the
        node metrics too (only a full pass judges nodes).
        """
        spec, result = last.spec, last.result
        versions = version_status(
            spec,
            result.rollout,
            self.istiod(spec),
            last.chosen,
            previous.versions if previous is not None else None,
        )
        outcome.rollout = rollout_message(
            result.rollout, last.chosen, versions, held_platforms(last.held)
        )
        reconciled = outcome.verdict(len(result.objects))
        if reconciled.status != "True":
            metrics.RECONCILE_ERRORS.labels(controller=CONTROLLER, reason=reconciled.reason).inc()
        components = self._components(result, spec.namespace, ours)
        status = build_status(
            previous,
            last.generation,
            [
                reconciled,
                ready_verdict(components, sum(len(ds.nodes) for ds in result.daemonsets)),
                degraded_verdict(list(last.problems)),
            ],
            components,
            last.inventory,
            self.state.tally.enrollment(*self.workaround_misses),
            self.clock(),
            node_readiness=last.node_readiness,
            versions=versions,
            platform=last.platform,
            adoption=adoption,
            held=last.held,
            revisions=self._revisions(spec),
            windows=windows_status(
                spec,
                (v.node for v in result.verdicts if v.os == "windows" and v.supported),
                self.state.tally.windows_pods_by_node(),
            ),
        )
        self._export_metrics(result if nodes else None, status.enrollment)
        await self._write_status(mesh, previous, status)
        crowded = pod_limit_message(status.windows) if status.windows else None
        if crowded and not self.events.told(mesh, MeshEvent.WINDOWS_POD_LIMIT, crowded):
            await asyncio.to_thread(
                self.events.post, mesh, "Warning", MeshEvent.WINDOWS_POD_LIMIT, crowded
            )

    def _revisions(self, spec: AmbientMeshSpec) -> list[RevisionStatus]:
        """status.revisions from the caches (status/revisions.py), again only when its
        inputs changed (ClusterState.revision_changes counts their changes)."""
        inputs = (self.state.revision_changes, spec, default_image(spec))
        held = self._revisions_memo
        if held is not None and held[0] == inputs:
            return held[1]
        revisions = revisions_status(
            spec,
            [dep for (ns, _), dep in self.state.deployments.items() if ns == spec.namespace],
            self.state.gateways.values(),
            self.state.namespaces,
            self.state.revision_tags.values(),
            default_image(spec),
        )
        self._revisions_memo = (inputs, revisions)
        return revisions

    def _agent_tag(
        self, spec: AmbientMeshSpec, ours: Mapping[ObjectKey, Mapping[str, Any]]
    ) -> AgentTag:
        """The agents' tag this pass (cluster/versions.py's agent_tag): set, istiod's, default.

        What the Linux ztunnel runs is what the agents keep while istiod rolls.
        """
        running = self.running_agents(spec.namespace, ours).get((PLATFORM_LINUX, ZTUNNEL))
        version = image_version(running.image) if running is not None else None
        return agent_tag(
            spec.images.tag_if_set(),
            c.ISTIO_VERSION,
            self.istiod(spec),
            None if version is None else release_tag(version),
        )

    async def _takeover(
        self,
        spec: AmbientMeshSpec,
        owner: Owner,
        ours: dict[ObjectKey, dict[str, Any]],
        result: RenderResult,
    ) -> Takeover | None:
        """What spec.adopt may take this pass (apply/adopt.py); None when it names nothing.

        The release records are read when an object the operator renders is
        not yet its own (a take-over to make, or an object to create) and
        once after a start; otherwise the last answer stands.
        """
        names = tuple(spec.adopt.helm_releases)
        if not names:
            self.takeover = None
            return None
        rendered = {key_of(obj) for obj in result.objects}
        held = self.takeover
        if held is not None and held.releases == names and rendered <= ours.keys():
            return held
        self.takeover = await asyncio.to_thread(
            gather_takeover, self.kube, spec.namespace, names, rendered, owner, ours
        )
        return self.takeover

    async def _orphan(self, mesh: dict[str, Any]) -> None:
        """spec.deletionPolicy Orphan: let go of every agent, then let the deletion finish."""
        owner = Owner.of(mesh)
        failed = await asyncio.to_thread(orphan_all, self.kube, self.ours(owner), owner)
        if failed:
            log.warning("AmbientMesh deletion waits: %s", "; ".join(failed))
            await asyncio.to_thread(
                self.events.post,
                mesh,
                "Warning",
                MeshEvent.ORPHAN_FAILED,
                "spec.deletionPolicy Orphan: these objects keep the AmbientMesh's owner "
                f"reference, so its deletion waits: {'; '.join(failed)}",
            )
            return
        with contextlib.suppress(KubeError):  # 409/404: the next event tells again
            await asyncio.to_thread(set_finalizer, self.kube, mesh, ORPHAN_FINALIZER, False)

    def _to_write(
        self,
        mesh: Mapping[str, Any],
        spec: AmbientMeshSpec,
        ours: Mapping[ObjectKey, Mapping[str, Any]],
        result: RenderResult,
        takeover: Takeover | None,
    ) -> tuple[list[dict[str, Any]], HeldTemplates | None]:
        """The objects to write this pass, with held pod templates kept (apply/held.py).

        Every DaemonSet whose running template another operator version or
        Helm wrote keeps it until the user changes the spec or approves; an
        approval rolls the held platforms in the rollout order.
        """
        hold = Hold(inputs_digest(spec), self.version)
        forms: list[tuple[dict[str, Any], Mapping[str, Any] | None, Held | None]] = []
        for obj in result.objects:
            key = key_of(obj)
            taken = takeover.taken.get(key) if takeover is not None else None
            live = ours.get(key) or (taken[1] if taken is not None else None)
            out = dict(as_adopted(obj, live, taken[0] if taken is not None else None))
            forms.append((out, live, held(out, live, hold, taking=taken is not None)))
        states = [state for _, _, state in forms if state is not None]
        token = approval(states)
        asked = ((mesh.get("metadata") or {}).get("annotations") or {}).get(APPROVE)
        if states and asked == token:
            states = [dataclasses.replace(s, approved=True) for s in states]
            forms = [
                (out, live, None if s is None else dataclasses.replace(s, approved=True))
                for out, live, s in forms
            ]
        flags: dict[str, list[bool]] = {}
        for state in states:
            flags.setdefault(state.platform, []).append(state.approved)
        hold = dataclasses.replace(hold, release=release_held(result.rollout, flags))
        objects = [apply_hold(out, live, hold, state) for out, live, state in forms]
        still = [s for s in states if not (s.approved and s.platform in hold.release)]
        by_name = {str(live["metadata"]["name"]): live for _, live, s in forms if s and live}
        return objects, held_status(still, by_name, approval(still), asked)

    async def _apply(
        self,
        owner: Owner,
        ours: dict[ObjectKey, dict[str, Any]],
        target: str,
        moving_from: Sequence[str],
        result: RenderResult,
        objects: Sequence[dict[str, Any]],
        takeover: Takeover | None = None,
    ) -> ApplyOutcome:
        outcome = ApplyOutcome()
        if takeover is not None and takeover.refused:
            outcome.refused = takeover.refused
            return outcome  # consent that cannot be honoured whole writes nothing
        # In the loop, not a thread: what the last pass prepared costs a
        # comparison, and a hop to a thread and back cost more than that.
        prepared = self.memo.prepare(objects, owner, CONTROLLER)
        # Only this mesh's objects can be up to date or pruned; anything else
        # under a name we want is written through the writer, which refuses it.
        todo = plan(prepared, ours, self.memo)
        refused: set[ObjectKey] = set()

        async def one(obj: dict[str, Any]) -> None:  # stage by stage, a few at once
            what = describe(obj)
            # A DaemonSet's pods would run with somebody else's account or
            # configuration: the agents are not written until that is sorted.
            blocked = [key for key in _uses(obj) if key in refused]
            if blocked:
                outcome.conflicts.append(
                    f"{what} was not written: it would use {', '.join(map(_named, blocked))}"
                )
                return
            key = key_of(obj)
            current = self.state.owned.get(key)
            if current is None and takeover is not None and key in takeover.taken:
                current = dict(takeover.taken[key][1])
            try:
                live = await asyncio.to_thread(
                    functools.partial(write, takeover=takeover),
                    self.kube,
                    obj,
                    current,
                    owner,
                )
            except NameConflictError as exc:
                refused.add(key_of(obj))
                outcome.conflicts.append(exc.message)
                return
            except KubeError as exc:
                outcome.failed(what, exc.message)
                return
            self.state.remember_owned(live)
            # `ours` stays what the caches hold of this mesh: the newer of the
            # response and a watch event already in.
            ours[key] = self.state.owned.get(key, live)
            metrics.OBJECTS_APPLIED.labels(kind=obj["kind"]).inc()
            log.info("applied %s", what)

        await write_in_order(todo.apply, one)
        outcome.conflicts[:] = in_pass_order(todo.apply, outcome.conflicts, str)
        outcome.errors[:] = in_pass_order(todo.apply, outcome.errors, lambda e: e[0])
        if outcome.conflicts or outcome.errors:
            return outcome
        scope = {target}
        if moving_from:
            waiting = self._taking_over(result, target, ours)
            if waiting:
                outcome.waiting = (
                    f"the agents in {', '.join(moving_from)} stay until those in {target} "
                    f"are Ready, or placed where they cannot run twice on a node "
                    f"({'; '.join(waiting)})"
                )
            else:
                scope.update(moving_from)
        for obj in todo.prune:
            what = describe(obj)
            try:
                # Multus's attachment is in its global namespace, not the agents'.
                where = (
                    {*scope, NETWORK_ATTACHMENT_NAMESPACE}
                    if obj["kind"] == NETWORK_ATTACHMENT.kind
                    else scope
                )
                pruned = await asyncio.to_thread(prune, self.kube, obj, owner, where)
            except KubeError as exc:
                outcome.failed(f"prune {what}", exc.message)
                continue
            if not pruned:
                continue  # out of scope this pass (the old namespace during a move)
            self.state.remember_owned(obj, deleted=True)
            ours.pop(key_of(obj), None)
            metrics.OBJECTS_PRUNED.labels(kind=obj["kind"]).inc()
            log.info("pruned %s", what)
        return outcome

    def report_workaround_misses(self, count: int, image_unavailable: int = 0) -> None:
        """The webhook's count of Windows pods admitted without the workaround, and of those
        left without it because its image was unavailable, for status."""
        self.workaround_misses = (count, image_unavailable)

    @staticmethod
    def _components(
        result: RenderResult, namespace: str, ours: Mapping[ObjectKey, Mapping[str, Any]]
    ) -> list[tuple[ComponentStatus, bool, str]]:
        """Each rendered DaemonSet's live counts and readiness, in `namespace` only.

        During a move both namespaces hold DaemonSets of the same names; only
        the target's tell whether the agents run as the spec asks.
        """
        out = []
        for ds in result.daemonsets:
            live = ours.get(("apps/v1", "DaemonSet", namespace, ds.name))
            cs = component_status(ds.name, ds.component, ds.platform, live)
            ok, why = daemonset_ready(live, len(ds.nodes))
            out.append((cs, ok, why))
        return out

    @staticmethod
    def _previous_status(mesh: dict[str, Any]) -> AmbientMeshStatus | None:
        try:
            return AmbientMeshStatus.model_validate(mesh.get("status") or {})
        except ValidationError:
            return None  # a status we cannot read is rewritten whole

    async def _fail(
        self,
        mesh: dict[str, Any],
        previous: AmbientMeshStatus | None,
        generation: int,
        reason: MeshReason,
        message: str,
    ) -> None:
        metrics.RECONCILE_ERRORS.labels(controller=CONTROLLER, reason=reason).inc()
        keep = previous or AmbientMeshStatus()
        others = [
            Verdict(cond.type, cond.status, cond.reason, cond.message)
            for cond in keep.conditions
            if cond.type != MeshCondition.RECONCILED
        ]
        status = build_status(
            previous,
            generation,
            [Verdict(MeshCondition.RECONCILED, "False", reason, message), *others],
            [(cs, False, "") for cs in keep.components],
            keep.nodes,
            keep.enrollment,
            self.clock(),
            node_readiness=keep.node_readiness,
            versions=keep.versions,
            platform=keep.platform,
            adoption=keep.adoption,
            held=keep.held,
            revisions=keep.revisions,
            windows=keep.windows,
        )
        # Nothing was changed: the DaemonSets are as ready as they were.
        status = status.model_copy(update={"ready_components": keep.ready_components})
        await self._write_status(mesh, previous, status)

    async def _write_status(
        self, mesh: dict[str, Any], previous: AmbientMeshStatus | None, status: AmbientMeshStatus
    ) -> None:
        # What an old CRD cannot take is left out, or the API server refuses
        # the whole write, CrdOutdated with it (status/schema.py).
        body = dict(
            status_for(
                self.state.mesh_crd,
                status.model_dump(by_alias=True, exclude_none=True, mode="json"),
            )
        )
        if body == (mesh.get("status") or {}):
            return
        try:
            # The whole status is recomputed each pass: no precondition needed.
            wrote = await asyncio.to_thread(write_status, self.kube, mesh, body, precondition=False)
        except KubeError as exc:
            log.warning("status write failed: %s", exc)
            return
        if not wrote.written:
            return  # the AmbientMesh is gone; its deletion event is on its way
        self.state.mesh = wrote.live
        for cond in transitions(previous, status):
            bad = (cond.type == MeshCondition.DEGRADED) == (cond.status == "True")
            await asyncio.to_thread(
                self.events.post,
                mesh,
                "Warning" if bad else "Normal",
                cond.reason,
                f"{cond.type}={cond.status}: {cond.message}",
            )

    @staticmethod
    def _export_metrics(result: RenderResult | None, enrollment: Enrollment) -> None:
        """The node gauges from a full pass's `result` (None: as they are), and enrollment's."""
        if result is not None:
            metrics.NODES.clear()
            counts: dict[tuple[str, str, str], int] = {}
            for v in result.verdicts:
                labels = (v.os or "unknown", v.build or "", "true" if v.supported else "false")
                counts[labels] = counts.get(labels, 0) + 1
            for (os_name, build, supported), n in counts.items():
                metrics.NODES.labels(os=os_name, build=build, supported=supported).set(n)
        metrics.ENROLLED_NAMESPACES.set(enrollment.namespaces)
        for os_name, pods in (
            ("linux", enrollment.linux_pods),
            ("windows", enrollment.windows_pods),
        ):
            for state_name in ("enabled", "pending", "missing"):
                metrics.PODS.labels(os=os_name, redirection=state_name).set(
                    getattr(pods, state_name)
                )
