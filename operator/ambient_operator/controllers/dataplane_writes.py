"""The data plane's writes: what spec.adopt may take, the held templates, and the writes.

A full pass (controllers/dataplane.py) hands these its render; they decide
what is written this pass and write it through apply/writer.py, which
refuses anything without this mesh's controller reference (NameConflict)
and deletes by UID. Nothing is pruned in a pass where any write failed or
was refused, and the old namespace of a move only once the new one's
agents can take over (`_taking_over`, controllers/dataplane_moves.py).
Deleting the AmbientMesh with spec.deletionPolicy Orphan lets go of
everything first (`_orphan`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import MeshEvent
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, HeldTemplates
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
from ambient_operator.apply.ownership import describe
from ambient_operator.apply.plan import Owner, PassMemo, plan
from ambient_operator.apply.writer import NameConflictError, prune, set_finalizer, write
from ambient_operator.controllers.adoption import ORPHAN_FINALIZER, gather_takeover, orphan_all
from ambient_operator.controllers.dataplane_moves import (
    CONTROLLER,
    NETWORK_ATTACHMENT,
    _named,
    _uses,
)
from ambient_operator.controllers.dataplane_status import DataplaneStatus
from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import ObjectKey, key_of
from ambient_operator.render import RenderResult
from ambient_operator.render.rollout import release_held
from ambient_operator.render.values import NETWORK_ATTACHMENT_NAMESPACE
from ambient_operator.status.components import ApplyOutcome
from ambient_operator.status.held import held_status

log = logging.getLogger(__name__)


class DataplaneWrites(DataplaneStatus):
    """The write side of `DataplaneController`."""

    # What TEMPLATE_BY records (apply/held.py): the version and a digest of the code.
    version = c.operator_build()

    @functools.cached_property
    def memo(self) -> PassMemo:
        """What the last pass prepared and found up to date (apply/plan.py)."""
        return PassMemo()

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
