"""status.adoption and what the Reconciled condition says of a take-over. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AdoptionStatus, AsIsDaemonSet
from ambient_operator.apply.adopt import ADOPTED_FROM, Takeover, next_template
from ambient_operator.apply.held import DIFFERENCES_SHOWN, is_held, template_differences
from ambient_operator.apply.ownership import describe
from ambient_operator.kube.resources import ObjectKey, key_of

TAKEN_SHOWN = 64


def adoption_status(
    takeover: Takeover | None,
    ours: Mapping[ObjectKey, Mapping[str, Any]],
    rendered: Iterable[Mapping[str, Any]],
) -> AdoptionStatus | None:
    """What spec.adopt took (from the objects of ours that say so), or why it took nothing.

    `ours` is the mesh's objects after this pass's writes; `rendered` what
    the operator renders, whose pod templates the next change rolls.
    """
    if takeover is None:
        return None
    taken = sorted(
        describe(obj)
        for obj in ours.values()
        if ADOPTED_FROM in ((obj.get("metadata") or {}).get("annotations") or {})
    )
    as_is = []
    for obj in rendered:
        live = ours.get(key_of(obj))
        if obj.get("kind") != "DaemonSet" or live is None or not is_held(live):
            continue
        as_is.append(pending_roll(obj, live))
    return AdoptionStatus(
        releases=list(takeover.releases),
        taken=taken[:TAKEN_SHOWN],
        left_with_helm=list(takeover.left_with_helm),
        refused=list(takeover.refused),
        as_is=as_is,
    )


def pending_roll(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> AsIsDaemonSet:
    """What the next change does to a DaemonSet that runs Helm's template: its pods, and the
    fields where the render differs (status.adoption.asIs and precheck say the same)."""
    meta = live.get("metadata") or {}
    running = (live.get("spec") or {}).get("template") or {}
    differences = template_differences(running, next_template(rendered, live))
    platform = (meta.get("labels") or {}).get(c.LABEL_PLATFORM) or (
        (rendered.get("metadata") or {}).get("labels") or {}
    ).get(c.LABEL_PLATFORM, "")
    return AsIsDaemonSet(
        name=str(meta.get("name", "")),
        platform=str(platform),
        pods=int((live.get("status") or {}).get("currentNumberScheduled") or 0),
        differences=differences[:DIFFERENCES_SHOWN],
    )


def as_is_message(
    status: AdoptionStatus | None, namespace: str, *, held: bool = False
) -> str | None:
    """What Reconciled adds while DaemonSets taken over run Helm's template, or None.

    `held`: status.held lists them, and the held message says when they restart
    (status/held.py); this one does not say it twice.
    """
    if status is None or not status.as_is:
        return None
    running = ", ".join(
        f"{ds.name} ({ds.pods} pods on {ds.platform or 'linux'}, "
        f"{len(ds.differences)} fields differ from the render)"
        for ds in status.as_is
    )
    when = (
        " "
        if held
        else "; nothing restarts until this AmbientMesh changes, and then those pods are "
        "replaced by the ordered rollout "
    )
    return (
        f"taken over from Helm as they run: {running}{when}"
        "(status.adoption.asIs lists the fields). If the releases' records are still there, "
        "`helm uninstall` would delete these objects: have Helm forget each release first ("
        + "; ".join(
            f"kubectl delete secret -n {namespace} -l owner=helm,name={release}"
            for release in status.releases
        )
        + "; docs/migration.md)"
    )
