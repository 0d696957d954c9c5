"""status.revisions: each istiod revision seen, and what of ours uses it. Pure.

A revision is seen when an istiod Deployment of spec.namespace serves it
(`istiod`, or `istiod-<revision>` with its istio.io/rev label), or when the
agents, a waypoint of our class or an enrolled namespace names it (directly
or through a tag, cluster/revisions.py). For each: istiod's version, the tags
that point at it, who uses it, and the skew of the agents and the waypoints
with that istiod (Istio's support rule, cluster/versions.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, RevisionStatus
from ambient_operator.cluster.revisions import (
    DEFAULT_REVISION,
    resolve,
    revision_tags,
    waypoint_revision,
)
from ambient_operator.cluster.versions import (
    image_version,
    istiod_version,
    parse_version,
    skew_problem,
)

NAMESPACES_SHOWN = 16
REVISIONS_SHOWN = 8


def _name(revision: str | None) -> str:
    return revision or DEFAULT_REVISION


def served_revision(deployment: Mapping[str, Any]) -> str | None:
    """The revision an istiod Deployment serves, or None when it is not istiod's."""
    meta = deployment.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    if name == "istiod":
        return str(labels.get(c.LABEL_REVISION) or DEFAULT_REVISION)
    if name.startswith("istiod-"):
        return str(labels.get(c.LABEL_REVISION) or name.removeprefix("istiod-"))
    return None


def revisions_status(
    spec: AmbientMeshSpec,
    deployments: Iterable[Mapping[str, Any]],
    gateways: Iterable[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, Any]],
    tag_webhooks: Iterable[Mapping[str, Any]],
    waypoint_image: str,
) -> list[RevisionStatus]:
    """Each revision seen, in name order (at most 8).

    `deployments` are istiod's in spec.namespace; `gateways` every Gateway
    (ours are those of spec.waypoints.className); `namespaces` the cached
    entries (their labels); `waypoint_image` the proxy image waypoints run.
    """
    tags = revision_tags(tag_webhooks)
    istiods = {rev: dep for dep in deployments if (rev := served_revision(dep)) is not None}
    agents = _name(spec.istiod.revision)
    waypoints: dict[str, int] = {}
    for gw in gateways:
        if (gw.get("spec") or {}).get("gatewayClassName") != spec.waypoints.class_name:
            continue
        meta = gw.get("metadata") or {}
        ns = namespaces.get(str(meta.get("namespace"))) or {}
        choice = waypoint_revision(
            meta.get("labels") or {}, ns.get("labels") or {}, spec.istiod.revision, tags
        )
        waypoints[_name(choice.revision)] = waypoints.get(_name(choice.revision), 0) + 1
    enrolled: dict[str, list[str]] = {}
    for name, ns in sorted(namespaces.items()):
        value = (ns.get("labels") or {}).get(c.LABEL_REVISION)
        if value:
            enrolled.setdefault(_name(resolve(str(value), tags)[0]), []).append(name)
    seen = sorted({*istiods, agents, *waypoints, *enrolled})
    agents_version = parse_version(spec.images.tag)
    waypoint_version = image_version(waypoint_image)
    out = []
    for rev in seen[:REVISIONS_SHOWN]:
        version = istiod_version(istiods.get(rev))
        skew = []
        if version is not None:
            for who, used, dp in (
                ("agents", rev == agents, agents_version),
                ("waypoints", rev in waypoints, waypoint_version),
            ):
                problem = skew_problem(version, dp) if used and dp is not None else None
                if problem:
                    skew.append(f"{who}: {problem}")
        out.append(
            RevisionStatus(
                name=rev,
                version=None if version is None else str(version),
                istiod=rev in istiods,
                tags=sorted(tag for tag, target in tags.items() if target == rev),
                agents=rev == agents,
                waypoints=waypoints.get(rev, 0),
                namespaces=enrolled.get(rev, [])[:NAMESPACES_SHOWN],
                skew=skew,
            )
        )
    return out
