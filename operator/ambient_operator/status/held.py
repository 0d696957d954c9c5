"""status.held and what the Reconciled condition says of held pod templates. Pure.

The rule is apply/held.py's; the order of an approved roll is render/rollout.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AsIsDaemonSet, HeldTemplates
from ambient_operator.apply.held import APPROVE, DIFFERENCES_SHOWN, TAKEN_OVER, Held
from ambient_operator.render.model import PLATFORM_LINUX
from ambient_operator.status.versions import platform_name

HELD_SHOWN = 32
# Who wrote the template a held DaemonSet runs, by status.held reason.
WRITERS = {"OperatorUpgrade": "another operator version", "TakenOver": "Helm"}


def held_status(
    states: Sequence[Held],
    live: Mapping[str, Mapping[str, Any]],
    approval: str,
    asked: str | None,
) -> HeldTemplates | None:
    """status.held from the DaemonSets held after this pass, or None when none is.

    `live` gives each held DaemonSet as it runs, by name (its pods);
    `approval` the digest that approves them; `asked` the AmbientMesh's
    approval annotation.
    """
    if not states:
        return None
    return HeldTemplates(
        approval=approval,
        daemon_sets=[
            AsIsDaemonSet(
                name=s.name,
                platform=s.platform or PLATFORM_LINUX,
                pods=_pods(live.get(s.name)),
                differences=list(s.differences[:DIFFERENCES_SHOWN]),
                reason="TakenOver" if s.reason == TAKEN_OVER else "OperatorUpgrade",
                approved=s.approved,
            )
            for s in sorted(states, key=lambda s: s.name)[:HELD_SHOWN]
        ],
        # Honoured approvals stay on the AmbientMesh while their platforms roll.
        stale_approval=(
            asked if asked and asked != approval and not all(s.approved for s in states) else None
        ),
    )


def _pods(live: Mapping[str, Any] | None) -> int:
    return int(((live or {}).get("status") or {}).get("currentNumberScheduled") or 0)


def per_platform(held: HeldTemplates, order: Iterable[str]) -> list[tuple[str, int, list[str]]]:
    """(platform, pods that would restart, DaemonSet names) in rollout order."""
    out = []
    for platform in order:
        here = [ds for ds in held.daemon_sets if ds.platform == platform]
        if here:
            out.append((platform, sum(ds.pods for ds in here), [ds.name for ds in here]))
    return out


def approve_command(approval: str) -> str:
    """The command that approves what status.held lists."""
    return f"kubectl annotate ambientmesh {c.MESH_NAME} {APPROVE}={approval} --overwrite"


def held_platforms(held: HeldTemplates | None) -> frozenset[str]:
    """The platforms with DaemonSets held and not approved: their agents are not being
    replaced, whatever their images (status/versions.py's rollout_message)."""
    return frozenset(ds.platform for ds in (held.daemon_sets if held else []) if not ds.approved)


def held_message(
    held: HeldTemplates | None, order: Sequence[str], changes: Mapping[str, str] | None = None
) -> str | None:
    """What Reconciled adds while DaemonSets keep the template they run, or None.

    It says what is true now (the agents run the template Helm or another
    operator build wrote) and what approving would change: `changes` gives,
    per platform, what its agents' render changes beyond the template
    (render/rollout.py's `why`: a new image, a new istiod revision).
    """
    if held is None:
        return None
    platforms = per_platform(held, order)
    pods = "; ".join(
        f"{platform}: {count} pod(s) of {', '.join(names)}" for platform, count, names in platforms
    )
    waiting = [ds for ds in held.daemon_sets if not ds.approved]
    if not waiting:
        return (
            f"approved pod templates roll in order, Linux first, then each Windows build, each "
            f"Ready before the next; still to roll: {pods} (status.held)"
        )
    writers = sorted({WRITERS[ds.reason or "OperatorUpgrade"] for ds in held.daemon_sets})
    stale = (
        f" (the annotation {APPROVE}={held.stale_approval} approves what was held before, not this)"
        if held.stale_approval
        else ""
    )
    changes = changes or {}
    new = "; ".join(
        f"{platform_name(platform)}: {changes[platform]}"
        for platform, _, _ in platforms
        if changes.get(platform)
    )
    return (
        f"agents are held, running the pod template that {' or '.join(writers)} wrote ({pods}); "
        f"approving restarts them with this operator's render{f' ({new})' if new else ''}, "
        "in order, Linux first; nothing restarts until this AmbientMesh changes or you approve "
        f"({approve_command(held.approval)}){stale} (status.held lists the fields that differ)"
    )
