"""istiod revisions and revision tags, resolved as istiod resolves them. Pure.

A data-plane object names the control plane it belongs to with the label
`istio.io/rev`: a revision (`canary`, `1-31-0`) or a revision tag (`prod`).
A tag is a MutatingWebhookConfiguration named `istio-revision-tag-<tag>`
carrying `istio.io/tag=<tag>` and `istio.io/rev=<revision>` (what
`istioctl tag set` and the istiod chart's `revisionTags` write; istiod's
tag watcher in pkg/revisions reads the same labels). The revision `default`
is an istiod installed without a revision: its Service is `istiod`.

A waypoint takes the label of its Gateway, else of its Gateway's namespace,
else the AmbientMesh's spec.istiod.revision (which the agents follow).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec

TAG_WEBHOOK_PREFIX = "istio-revision-tag-"
LABEL_TAG = "istio.io/tag"
DEFAULT_REVISION = "default"

Source = Literal["gateway", "namespace", "mesh"]


def revision_tags(webhooks: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """tag -> revision, from the revision-tag webhook configurations.

    Only configurations named like a tag's and carrying both labels count;
    a tag defined twice keeps the one named exactly `istio-revision-tag-<tag>`.
    """
    out: dict[str, str] = {}
    exact: set[str] = set()
    for hook in webhooks:
        meta = hook.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = meta.get("labels") or {}
        tag, revision = labels.get(LABEL_TAG), labels.get(c.LABEL_REVISION)
        if not name.startswith(TAG_WEBHOOK_PREFIX) or not tag or not revision:
            continue
        named = name == f"{TAG_WEBHOOK_PREFIX}{tag}"
        if tag in exact and not named:
            continue
        out[str(tag)] = str(revision)
        if named:
            exact.add(str(tag))
    return out


@dataclass(frozen=True)
class RevisionChoice:
    """Which istiod revision a waypoint talks to, and what said so."""

    # None: the mesh's own choice, spec.istiod.revision unset (the Service `istiod`).
    revision: str | None
    source: Source
    # The label's value, when it named a tag.
    tag: str | None = None


def resolve(value: str, tags: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(revision, tag) an istio.io/rev value names; revision None for `default`."""
    tag = value if value in tags else None
    revision = tags.get(value, value)
    return (None if revision == DEFAULT_REVISION else revision), tag


def waypoint_revision(
    gateway_labels: Mapping[str, str],
    namespace_labels: Mapping[str, str],
    mesh_revision: str | None,
    tags: Mapping[str, str],
) -> RevisionChoice:
    """The revision a waypoint talks to: its Gateway's label, its namespace's, or the mesh's."""
    sources: tuple[tuple[Source, Mapping[str, str]], ...] = (
        ("gateway", gateway_labels),
        ("namespace", namespace_labels),
    )
    for source, labels in sources:
        value = labels.get(c.LABEL_REVISION)
        if value:
            revision, tag = resolve(value, tags)
            return RevisionChoice(revision, source, tag)
    # As the agents read it: the Service istiod-<revision>, no tag lookup.
    return RevisionChoice(mesh_revision or None, "mesh")


def at_revision(spec: AmbientMeshSpec, revision: str | None) -> AmbientMeshSpec:
    """`spec` with istiod at `revision` (None: the Service istiod).

    The revision picks the Service `istiod-<revision>` (spec.istiod.service);
    an explicit spec.istiod.serviceName or address still wins, and then only
    istio.io/rev says the revision.
    """
    if revision == spec.istiod.revision:
        return spec
    return spec.model_copy(update={"istiod": spec.istiod.model_copy(update={"revision": revision})})


def with_revision(spec: AmbientMeshSpec, choice: RevisionChoice) -> AmbientMeshSpec:
    """`spec` as one waypoint is rendered with: istiod at the chosen revision.

    A revision the Gateway or its namespace names is dialled at its own
    Service (`istiod-<revision>`, `istiod` for default), as istiod's own
    waypoint of that revision dials it: spec.istiod.serviceName names the
    agents' istiod, not that one. Explicit addresses still win.
    """
    if choice.source == "mesh":
        return at_revision(spec, choice.revision)
    istiod = spec.istiod.model_copy(update={"revision": choice.revision, "service_name": None})
    return spec.model_copy(update={"istiod": istiod})


def revision_inputs(
    tags: Mapping[str, str], namespaces: Mapping[str, Mapping[str, Any]]
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """What every waypoint's revision depends on besides its Gateway: the tags (tag ->
    revision), and the namespaces' istio.io/rev labels. A change of it re-renders the
    waypoints."""
    labelled = (
        (name, str(rev))
        for name, ns in namespaces.items()
        if (rev := (ns.get("labels") or {}).get(c.LABEL_REVISION))
    )
    return tuple(sorted(tags.items())), tuple(sorted(labelled))
