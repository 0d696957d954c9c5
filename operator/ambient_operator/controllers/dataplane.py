"""The data-plane reconcile: facts -> render -> apply/prune -> status.

Thin on purpose: every decision lives in render, apply, the writer and
status. A full pass is the list `DataplaneController.steps`: each step reads
what those before it handed on (`FullPass`), then hands on its part or stops
the pass with one `Problem`, reported in one place (`_full_pass`). The
status-only pass is in dataplane_status.py, the writes in dataplane_writes.py.

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
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import MeshReason, Problem
from ambient_operator.api.v1alpha1 import (
    AmbientMeshSpec,
    AmbientMeshStatus,
    HeldTemplates,
    NodeReadinessStatus,
    RevisionStatus,
)
from ambient_operator.apply.adopt import Takeover
from ambient_operator.apply.plan import Owner
from ambient_operator.apply.writer import set_finalizer
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.cluster.platform import PlatformChoice
from ambient_operator.cluster.versions import AgentTag, agent_tag, image_version, release_tag
from ambient_operator.controllers.adoption import ORPHAN_FINALIZER
from ambient_operator.controllers.dataplane_moves import CONTROLLER, spec_error
from ambient_operator.controllers.dataplane_status import LastPass
from ambient_operator.controllers.dataplane_writes import DataplaneWrites
from ambient_operator.controllers.node_readiness import NodeReadinessGate
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import ObjectKey
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.render.dataplane import RenderMemo, deletes_pods
from ambient_operator.render.model import PLATFORM_LINUX
from ambient_operator.render.values import ZTUNNEL
from ambient_operator.render.waypoints.settings import default_image
from ambient_operator.status.adoption import adoption_status, as_is_message
from ambient_operator.status.components import ApplyOutcome, mesh_problems
from ambient_operator.status.held import held_message
from ambient_operator.status.platform import platform_status
from ambient_operator.status.revisions import revisions_status

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


@dataclass
class FullPass:
    """What a full pass's steps hand on: each fills its fields for the steps after it."""

    mesh: dict[str, Any]
    previous: AmbientMeshStatus | None
    generation: int
    # read_spec: the spec as this pass renders it (its tag set by choose_agent_tag).
    spec: AmbientMeshSpec = field(init=False)
    owner: Owner = field(init=False)
    # choose_agent_tag: this mesh's objects in the caches, read once (the
    # writes keep them current), and the agents' tag with how it was chosen.
    ours: dict[ObjectKey, dict[str, Any]] = field(init=False)
    chosen: AgentTag = field(init=False)
    # render_objects: where the agents move from, the platform, facts and render.
    moving_from: list[str] = field(init=False)
    choice: PlatformChoice = field(init=False)
    facts: ClusterFacts = field(init=False)
    result: RenderResult = field(init=False)
    # take_over, hold_templates, write_objects, gate_node_readiness.
    takeover: Takeover | None = field(init=False)
    objects: list[dict[str, Any]] = field(init=False)
    held: HeldTemplates | None = field(init=False)
    outcome: ApplyOutcome = field(init=False)
    gated: NodeReadinessStatus | None = field(init=False)
    gate_problems: list[Problem] = field(init=False)


# A step of the full pass: None hands on to the next step, a Problem stops the pass.
Step = Callable[[FullPass], Awaitable[Problem | None]]


class DataplaneController(DataplaneWrites):
    """Keeps the agents' DaemonSets and friends as the AmbientMesh asks."""

    _revisions_memo: tuple[Any, list[RevisionStatus]] | None = None

    @functools.cached_property
    def node_readiness(self) -> NodeReadinessGate:
        """The opt-in removal of nodes' readiness taints (controllers/node_readiness.py)."""
        return NodeReadinessGate(self.state, self.kube)

    @functools.cached_property
    def renders(self) -> RenderMemo:
        """Each platform's last render, by its inputs (render/dataplane.py)."""
        return RenderMemo()

    def render(self, spec: AmbientMeshSpec, facts: ClusterFacts) -> RenderResult:
        """This pass's desired objects; only what changed since the last pass is rendered."""
        return render_dataplane(spec, facts, cni_rbac=self.cni_rbac, memo=self.renders)

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

    @property
    def steps(self) -> tuple[Step, ...]:
        """The full pass, in order."""
        return (
            self.read_spec,
            self.keep_finalizer,
            self.choose_agent_tag,
            self.accept_namespace,
            self.allow_repair_mode,
            self.render_objects,
            self.take_over,
            self.hold_templates,
            self.write_objects,
            self.gate_node_readiness,
            self.finish,
        )

    async def _full_pass(self, mesh: dict[str, Any]) -> None:
        run = FullPass(
            mesh, self._previous_status(mesh), int(mesh["metadata"].get("generation", 0))
        )
        for step in self.steps:
            problem = await step(run)
            if problem is not None:
                await self._report_stop(run.mesh, run.previous, run.generation, problem)
                return

    # -- the steps of a full pass, in order -------------------------------------
    async def read_spec(self, run: FullPass) -> Problem | None:
        """The spec, validated, with the default registry; stops at an invalid spec."""
        try:
            spec = AmbientMeshSpec.model_validate(run.mesh.get("spec") or {})
        except ValidationError as exc:
            return Problem(MeshReason.INVALID_SPEC, spec_error(exc))
        run.spec = spec.with_default_registry(self.default_registry)
        run.owner = Owner.of(run.mesh)
        return None

    async def keep_finalizer(self, run: FullPass) -> Problem | None:
        """spec.deletionPolicy's finalizer on the AmbientMesh, as the policy says.

        Its failure is reported, not fatal: the agents are kept as the spec
        says; only what deleting the AmbientMesh does waits for the next pass.
        """
        keep = run.spec.deletion_policy == "Orphan"
        try:
            await asyncio.to_thread(set_finalizer, self.kube, run.mesh, ORPHAN_FINALIZER, keep)
        except KubeError as exc:
            return Problem(
                MeshReason.APPLY_FAILED,
                f"spec.deletionPolicy: the AmbientMesh's finalizer {ORPHAN_FINALIZER} "
                f"could not be written: {exc.message}",
            )
        return None

    async def choose_agent_tag(self, run: FullPass) -> Problem | None:
        """This mesh's objects, and the agents' tag this pass (set, istiod's, what runs)."""
        # Read once: it walks every object the operator keeps. The pass's own
        # writes and prunes are kept in it as they are made (_apply).
        run.ours = self.ours(run.owner)
        run.chosen = self._agent_tag(run.spec, run.ours)
        images = run.spec.images
        if run.chosen.tag != images.tag:
            run.spec = run.spec.model_copy(
                update={"images": images.model_copy(update={"tag": run.chosen.tag})}
            )
        return None

    async def accept_namespace(self, run: FullPass) -> Problem | None:
        """Stops while spec.namespace cannot take the agents (missing, going, not granted)."""
        refusal = await self.namespace_refusal(run.spec.namespace, run.ours)
        self.state.refused_namespace = run.spec.namespace if refusal is not None else None
        return None if refusal is None else Problem(*refusal)

    async def allow_repair_mode(self, run: FullPass) -> Problem | None:
        """Stops when spec.istioCni.repairMode Delete cannot be granted (repair_refusal)."""
        if not deletes_pods(run.spec):
            return None
        refused = repair_refusal(
            run.spec,
            may_delete_pods=await asyncio.to_thread(self.may_grant_pod_delete),
            by_chart=not self.cni_rbac,
        )
        return None if refused is None else Problem(MeshReason.REPAIR_MODE_NOT_GRANTED, refused)

    async def render_objects(self, run: FullPass) -> Problem | None:
        """The cluster facts and the desired objects; stops when render fails."""
        spec = run.spec
        run.moving_from = sorted(self.agent_namespaces(run.ours) - {spec.namespace})
        # The same nodes as the facts below: nothing awaits in between.
        run.choice = self.platform_choice(spec)
        try:
            attachments = await asyncio.to_thread(self.network_attachments, spec)
            run.facts = self.facts(spec, run.moving_from, run.ours, run.choice, attachments)
            # Pure, and the pass's largest piece of CPU (bench/profile_passes.py):
            # in a thread, the event loop keeps serving the waypoints' pass and
            # the watches meanwhile (a Gateway made with its namespace waited
            # for the namespace's data-plane pass). Only the platforms whose
            # inputs changed are rendered again (RenderMemo).
            run.result = await asyncio.to_thread(self.render, spec, run.facts)
        except Exception as exc:  # a render bug must show in status, not kill the loop
            log.exception("render failed")
            return Problem(MeshReason.RENDER_FAILED, str(exc))
        return None

    async def take_over(self, run: FullPass) -> Problem | None:
        """What spec.adopt may take this pass (a refusal is the writes' to report)."""
        run.takeover = await self._takeover(run.spec, run.owner, run.ours, run.result)
        return None

    async def hold_templates(self, run: FullPass) -> Problem | None:
        """The objects to write, with the pod templates another writer's kept (held)."""
        run.objects, run.held = self._to_write(
            run.mesh, run.spec, run.ours, run.result, run.takeover
        )
        return None

    async def write_objects(self, run: FullPass) -> Problem | None:
        """Write and prune; what failed or was refused is the outcome's, in status."""
        run.outcome = await self._apply(
            run.owner,
            run.ours,
            run.spec.namespace,
            run.moving_from,
            run.result,
            run.objects,
            run.takeover,
        )
        return None

    async def gate_node_readiness(self, run: FullPass) -> Problem | None:
        """Release the readiness taints of nodes whose agents are ready (when enabled)."""
        run.gated, run.gate_problems = await self.node_readiness.reconcile(run.spec, run.result)
        return None

    async def finish(self, run: FullPass) -> Problem | None:
        """The status of the pass; kept for status-only passes when nothing is left to do."""
        spec, result, outcome = run.spec, run.result, run.outcome
        last = LastPass(
            uid=run.owner.uid,
            generation=run.generation,
            spec=spec,
            chosen=run.chosen,
            result=result,
            agents=run.facts.agents,
            daemonsets=tuple(
                key for key in run.ours if key[:3] == ("apps/v1", "DaemonSet", spec.namespace)
            ),
            platform=platform_status(run.choice),
            inventory=result.inventory(),
            held=run.held,
            held_message=held_message(
                run.held,
                [p.platform for p in result.rollout.platforms],
                {
                    p.platform: p.why
                    for p in result.rollout.platforms
                    if p.state == "rolling" and not p.settling
                },
            ),
            node_readiness=run.gated,
            # Everything that makes the mesh Degraded (judged in status/components.py).
            problems=(
                *mesh_problems(
                    spec, result, set(self.state.services), self.istiod(spec), self.state.mesh_crd
                ),
                *run.gate_problems,
            ),
        )
        outcome.held = last.held_message
        adoption = adoption_status(run.takeover, run.ours, result.objects)
        outcome.as_is = as_is_message(adoption, spec.namespace, held=run.held is not None)
        await self._report(run.mesh, run.previous, last, run.ours, outcome, adoption, nodes=True)
        # A status-only pass may follow only a pass that left nothing to do:
        # no write failed or was refused, no move or take-over is under way
        # (their next step waits on the agents' readiness, which is status).
        clean = not (outcome.conflicts or outcome.errors or outcome.refused or outcome.waiting)
        if clean and not run.moving_from and run.takeover is None:
            self._last = last
        return None

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
