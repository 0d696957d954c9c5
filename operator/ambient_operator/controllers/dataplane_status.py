"""The data plane's status: the status-only pass, and the status every pass writes.

A full pass (controllers/dataplane.py) that left nothing to do keeps what it
found and rendered (`LastPass`). While only status news comes after it
(pods, our objects' status, the webhook's miss count: ClusterState.full_pass_due
stays False), `_status_pass` builds the status again from that and the caches,
without rendering or writing anything else. Both kinds of pass end in
`_report`; a full pass stopped by one of its steps ends in `_report_stop`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import metrics
from ambient_operator.api.conditions import MeshCondition, MeshEvent, Problem, Verdict
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
from ambient_operator.apply.ownership import conflict
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.versions import AgentTag, RunningAgent
from ambient_operator.controllers.dataplane_moves import CONTROLLER, DataplaneMoves
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import ObjectKey
from ambient_operator.render import RenderResult
from ambient_operator.status.components import (
    ApplyOutcome,
    build_status,
    component_status,
    daemonset_ready,
    degraded_verdict,
    ready_verdict,
    transitions,
)
from ambient_operator.status.held import held_platforms
from ambient_operator.status.schema import status_for
from ambient_operator.status.versions import rollout_message, version_status
from ambient_operator.status.windows import pod_limit_message, windows_status
from ambient_operator.status.writer import write_status

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LastPass:
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


class DataplaneStatus(DataplaneMoves, ABC):
    """The status side of `DataplaneController`: the status-only pass and the status written."""

    # The last full pass, while a status-only pass may build on it; None: the
    # next pass is full.
    _last: LastPass | None = None

    @functools.cached_property
    def passes(self) -> Counter[str]:
        """Passes run by kind, "full" or "status" (also a metric), for tests that count."""
        return Counter()

    def istiod(self, spec: AmbientMeshSpec) -> dict[str, Any] | None:
        """istiod's Deployment, when the caches hold it (named like its Service)."""
        return self.state.deployments.get((spec.namespace, spec.istiod.service()))

    @abstractmethod
    def _revisions(self, spec: AmbientMeshSpec) -> list[RevisionStatus]:
        """status.revisions from the caches; the controller keeps the last answer."""

    def report_workaround_misses(self, count: int, image_unavailable: int = 0) -> None:
        """The webhook's count of Windows pods admitted without the workaround, and of those
        left without it because its image was unavailable, for status."""
        self.workaround_misses = (count, image_unavailable)

    def _count_pass(self, kind: str) -> None:
        self.passes[kind] += 1
        metrics.DATAPLANE_PASSES.labels(kind=kind).inc()

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
        await self._report(mesh, self._previous_status(mesh), last, ours, outcome, None)
        return True

    async def _report(
        self,
        mesh: dict[str, Any],
        previous: AmbientMeshStatus | None,
        last: LastPass,
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
                result.tally.windows_served,
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

    async def _report_stop(
        self,
        mesh: dict[str, Any],
        previous: AmbientMeshStatus | None,
        generation: int,
        problem: Problem,
    ) -> None:
        """A full pass stopped at a step with `problem`: Reconciled=False says so, and the
        rest of the status stays as the last pass left it (nothing was changed)."""
        metrics.RECONCILE_ERRORS.labels(controller=CONTROLLER, reason=problem.reason).inc()
        keep = previous or AmbientMeshStatus()
        others = [
            Verdict(cond.type, cond.status, cond.reason, cond.message)
            for cond in keep.conditions
            if cond.type != MeshCondition.RECONCILED
        ]
        status = build_status(
            previous,
            generation,
            [Verdict(MeshCondition.RECONCILED, "False", problem.reason, problem.message), *others],
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

    @staticmethod
    def _export_metrics(result: RenderResult | None, enrollment: Enrollment) -> None:
        """The node gauges from a full pass's `result` (None: as they are), and enrollment's."""
        if result is not None:
            metrics.NODES.clear()
            gauges: Counter[tuple[str, str, str]] = Counter()
            for (os_name, build, supported), n in result.tally.counts.items():
                gauges[os_name or "unknown", build or "", "true" if supported else "false"] += n
            for (os_label, build_label, ok), n in gauges.items():
                metrics.NODES.labels(os=os_label, build=build_label, supported=ok).set(n)
        metrics.ENROLLED_NAMESPACES.set(enrollment.namespaces)
        for os_name, pods in (
            ("linux", enrollment.linux_pods),
            ("windows", enrollment.windows_pods),
        ):
            for state_name in ("enabled", "pending", "missing"):
                metrics.PODS.labels(os=os_name, redirection=state_name).set(
                    getattr(pods, state_name)
                )
