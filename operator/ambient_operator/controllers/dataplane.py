"""The data-plane reconcile: facts -> render -> apply/prune -> status.

Thin on purpose: every decision lives in render, apply and status; this
module gathers inputs, calls them in order, and reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from ambient_operator import constants as c
from ambient_operator import metrics
from ambient_operator.api.v1alpha1 import (
    AmbientMeshSpec,
    AmbientMeshStatus,
    ComponentStatus,
    Enrollment,
)
from ambient_operator.apply import Owner, plan, prepare
from ambient_operator.enrollment import summarize
from ambient_operator.events import EventRecorder, now_rfc3339
from ambient_operator.facts import ClusterFacts, NodeFacts
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS, kind_of
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.state import ClusterState
from ambient_operator.status import (
    Problem,
    Verdict,
    build_status,
    component_status,
    daemonset_ready,
    degraded_verdict,
    ready_verdict,
    transitions,
)

log = logging.getLogger(__name__)
CONTROLLER = "dataplane"
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]
# Node verdicts that are a choice of the user, not a gap in support.
INTENDED_EXCLUSIONS = {"PlatformDisabled", "WindowsBuildNotEnabled", "ExcludedBySpec"}
CLUSTER_DNS = ("kube-system", "kube-dns")


def spec_error(exc: ValidationError) -> str:
    """The first validation error as `spec.a.b: message`."""
    first = exc.errors()[0]
    path = ".".join(str(part) for part in ("spec", *first["loc"]))
    return f"{path}: {first['msg']}"


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
        f"env.CA_TRUSTED_NODE_ACCOUNTS={wanted} (helm upgrade ... --reuse-values "
        f"--set-string env.CA_TRUSTED_NODE_ACCOUNTS={wanted.replace(',', chr(92) + ',')})"
    )


class DataplaneController:
    """Keeps the agents' DaemonSets and friends as the AmbientMesh asks."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        events: EventRecorder,
        kube_version: str = "1.37",
        clock: Callable[[], str] = now_rfc3339,
    ) -> None:
        self.state = state
        self.kube = kube
        self.events = events
        self.kube_version = kube_version
        self.clock = clock
        self.workaround_misses = 0

    # -- facts ------------------------------------------------------------
    def _service_ip(self, namespace: str, name: str) -> str | None:
        svc = self.state.services.get((namespace, name))
        ip = ((svc or {}).get("spec") or {}).get("clusterIP")
        return ip if ip and ip != "None" else None

    def facts(self, spec: AmbientMeshSpec) -> ClusterFacts:
        """Cluster facts for render, from the caches."""
        nodes = tuple(NodeFacts.from_node(node) for _, node in sorted(self.state.nodes.items()))
        return ClusterFacts(
            nodes=nodes,
            istiod_ip=self._service_ip(spec.namespace, spec.istiod.service()),
            dns_ip=self._service_ip(*CLUSTER_DNS),
            kube_version=self.kube_version,
        )

    def problems(self, spec: AmbientMeshSpec, result: RenderResult) -> list[Problem]:
        """Everything that makes the mesh Degraded."""
        problems: list[Problem] = []
        unsupported = [
            v for v in result.verdicts if not v.supported and v.reason not in INTENDED_EXCLUSIONS
        ]
        if unsupported:
            listed = ", ".join(f"{v.node} ({v.reason}: {v.message})" for v in unsupported[:10])
            more = f" and {len(unsupported) - 10} more" if len(unsupported) > 10 else ""
            problems.append(
                Problem(
                    "UnsupportedNodes",
                    f"{len(unsupported)} node(s) get no ambient agent: {listed}{more}",
                )
            )
        service = spec.istiod.service()
        if spec.istiod.address is None and (spec.namespace, service) not in self.state.services:
            problems.append(
                Problem(
                    "IstiodNotFound",
                    f"Service {spec.namespace}/{service} not found; agents cannot reach istiod",
                )
            )
        trust = self._trust(spec, result)
        if trust is not None and trust[1]:
            trusted, missing = trust
            problems.append(Problem("IstiodTrustMissing", trust_message(trusted, missing)))
        for warning in result.warnings:
            problems.append(Problem("RenderWarning", warning))
        return problems

    def _trust(
        self, spec: AmbientMeshSpec, result: RenderResult
    ) -> tuple[list[str], list[str]] | None:
        """(accounts istiod trusts, our ztunnel accounts it does not); None without istiod."""
        deployment = self.state.deployments.get((spec.namespace, spec.istiod.service()))
        if deployment is None:
            return None  # nothing to check; IstiodNotFound covers a missing istiod
        ztunnel_accounts = sorted(
            f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            for obj in result.objects
            if obj["kind"] == "ServiceAccount"
            and obj["metadata"].get("labels", {}).get(c.LABEL_COMPONENT) == "ztunnel"
        )
        trusted: list[str] = []
        for container in (
            deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            for env in container.get("env") or []:
                if env.get("name") == "CA_TRUSTED_NODE_ACCOUNTS":
                    trusted += [
                        p.strip() for p in str(env.get("value", "")).split(",") if p.strip()
                    ]
        return trusted, [acct for acct in ztunnel_accounts if acct not in trusted]

    # -- the reconcile --------------------------------------------------------
    async def reconcile(self) -> None:
        """One pass; writes only what differs."""
        mesh = self.state.mesh
        if mesh is None or mesh.get("metadata", {}).get("deletionTimestamp"):
            return  # garbage collection removes what the mesh owned
        started = time.monotonic()
        metrics.RECONCILES.labels(controller=CONTROLLER).inc()
        try:
            await self._reconcile(mesh)
        finally:
            metrics.RECONCILE_SECONDS.labels(controller=CONTROLLER).observe(
                time.monotonic() - started
            )

    async def _reconcile(self, mesh: dict[str, Any]) -> None:
        generation = int(mesh["metadata"].get("generation", 0))
        previous = self._previous_status(mesh)
        try:
            spec = AmbientMeshSpec.model_validate(mesh.get("spec") or {})
        except ValidationError as exc:
            await self._fail(mesh, previous, generation, "InvalidSpec", spec_error(exc))
            return
        try:
            result = render_dataplane(spec, self.facts(spec))
        except Exception as exc:  # a render bug must show in status, not kill the loop
            log.exception("render failed")
            await self._fail(mesh, previous, generation, "RenderFailed", str(exc))
            return

        errors = await self._apply(mesh, result)
        if errors:
            reconciled = Verdict("Reconciled", "False", "ApplyFailed", "; ".join(errors))
            metrics.RECONCILE_ERRORS.labels(controller=CONTROLLER, reason="ApplyFailed").inc()
        else:
            reconciled = Verdict(
                "Reconciled", "True", "Reconciled", f"{len(result.objects)} objects match the spec"
            )
        components = self._components(result)
        problems = self.problems(spec, result)
        status = build_status(
            previous,
            generation,
            [reconciled, ready_verdict(components), degraded_verdict(problems)],
            components,
            result.inventory(),
            self._enrollment(),
            self.clock(),
        )
        self._export_metrics(result, status.enrollment)
        await self._write_status(mesh, previous, status)

    async def _apply(self, mesh: dict[str, Any], result: RenderResult) -> list[str]:
        owner = Owner.of(mesh)
        prepared = [prepare(obj, owner, CONTROLLER) for obj in result.objects]
        todo = plan(prepared, self.state.owned_by(CONTROLLER))
        errors: list[str] = []
        for obj in todo.apply:
            what = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
            try:
                live = await asyncio.to_thread(self.kube.apply, obj)
            except KubeError as exc:
                errors.append(f"{what}: {exc.message}")
                continue
            self.state.remember_owned(live)
            metrics.OBJECTS_APPLIED.labels(kind=obj["kind"]).inc()
            log.info("applied %s", what)
        for obj in todo.prune:
            meta = obj["metadata"]
            what = f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"
            try:
                await asyncio.to_thread(
                    self.kube.delete,
                    kind_of(obj),
                    meta["name"],
                    meta.get("namespace"),
                    uid=meta.get("uid"),
                )
            except KubeError as exc:
                errors.append(f"prune {what}: {exc.message}")
                continue
            self.state.remember_owned(obj, deleted=True)
            metrics.OBJECTS_PRUNED.labels(kind=obj["kind"]).inc()
            log.info("pruned %s", what)
        return errors

    def _components(self, result: RenderResult) -> list[tuple[ComponentStatus, bool, str]]:
        out = []
        for ds in result.daemonsets:
            live = next(
                (
                    obj
                    for key, obj in self.state.owned.items()
                    if key[1] == "DaemonSet" and key[3] == ds.name
                ),
                None,
            )
            cs = component_status(ds.name, ds.component, ds.platform, live)
            ok, why = daemonset_ready(live, len(ds.nodes))
            out.append((cs, ok, why))
        return out

    def _enrollment(self) -> Enrollment:
        node_os = {
            name: str((node.get("metadata", {}).get("labels") or {}).get(c.LABEL_OS, "linux"))
            for name, node in self.state.nodes.items()
        }
        return summarize(
            self.state.pods.values(), self.state.namespaces, node_os, self.workaround_misses
        )

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
        reason: str,
        message: str,
    ) -> None:
        metrics.RECONCILE_ERRORS.labels(controller=CONTROLLER, reason=reason).inc()
        keep = previous or AmbientMeshStatus()
        others = [
            Verdict(cond.type, cond.status, cond.reason, cond.message)
            for cond in keep.conditions
            if cond.type != "Reconciled"
        ]
        status = build_status(
            previous,
            generation,
            [Verdict("Reconciled", "False", reason, message), *others],
            [(cs, False, "") for cs in keep.components],
            keep.nodes,
            keep.enrollment,
            self.clock(),
        )
        await self._write_status(mesh, previous, status)

    async def _write_status(
        self, mesh: dict[str, Any], previous: AmbientMeshStatus | None, status: AmbientMeshStatus
    ) -> None:
        body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        if body == (mesh.get("status") or {}):
            return
        patch = {
            "apiVersion": mesh["apiVersion"],
            "kind": mesh["kind"],
            "metadata": {"name": mesh["metadata"]["name"]},
            "status": body,
        }
        try:
            live = await asyncio.to_thread(self.kube.apply_status, patch)
        except KubeError as exc:
            log.warning("status write failed: %s", exc)
            return
        self.state.mesh = live
        for cond in transitions(previous, status):
            bad = (cond.type == "Degraded") == (cond.status == "True")
            await asyncio.to_thread(
                self.events.post,
                mesh,
                "Warning" if bad else "Normal",
                cond.reason,
                f"{cond.type}={cond.status}: {cond.message}",
            )

    def _export_metrics(self, result: RenderResult, enrollment: Enrollment) -> None:
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
