"""Taking over a Helm release's objects, with consent by name (spec.adopt.helmReleases).

The one way the operator comes to own an object it did not create. Pure:
the controller reads the release records and the live objects, and these
functions decide.

- :func:`plan_takeover` decides, for all named releases at once, which live
  objects may be taken: each object of a release's record that exists must
  carry that release's Helm ownership metadata and be one the operator
  renders (RBAC of the chart that it does not render is left with Helm); an
  object carrying the metadata of a named release that is not in its record
  is somebody's hand-made addition. Any refusal takes nothing.
- :func:`as_adopted` turns a rendered object into what is written over one
  taken from Helm when it rolls. Its selector stays what Helm made, because
  a DaemonSet's selector cannot change. Until the user asks for a change or
  approves it, a DaemonSet keeps the pod template it runs, so no agent
  restarts: apply/held.py's rule, the same as for an operator upgrade.
- :func:`absorbs` names the field manager entries the take-over makes ours,
  so that a later apply can drop what Helm set and we do not.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.apply.ownership import conflict, describe
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.helm_releases import HelmRelease, ReleaseObject
from ambient_operator.kube.resources import ObjectKey, key_of

HELM_RELEASE_NAME = "meta.helm.sh/release-name"
HELM_RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
HELM_MANAGED_BY = "Helm"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Kept on each object taken over: which release it came from, for status and
# for the way back (docs/migration.md).
ADOPTED_FROM = c.ADOPTED_FROM
# Istio's charts whose releases can be taken over (Chart.yaml names).
CHARTS = frozenset({"ztunnel", "cni"})
# RBAC kinds: the istio-cni chart splits its permissions over roles the
# operator does not render (its own chart grants them in one ClusterRole,
# and the operator holds no RBAC writes). Left with Helm, they grant the
# same account what it already has.
RBAC_GROUP = "rbac.authorization.k8s.io/v1"
RBAC_KINDS = frozenset({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})
# The kinds the operator renders in the agents' namespace: the only ones a
# take-over can take, so the only ones looked at for objects that claim a
# release without being in its record.
TAKEABLE_KINDS = (
    ("apps/v1", "DaemonSet"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("v1", "ResourceQuota"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)


@dataclass(frozen=True)
class Takeover:
    """What a pass may take over, or why it takes nothing."""

    releases: tuple[str, ...] = ()
    # Each live object to take (by key), with the release it is taken from.
    taken: Mapping[ObjectKey, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    left_with_helm: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()

    def allows(self, live: Mapping[str, Any] | None) -> str | None:
        """The release `live` may be taken from, if this take-over holds exactly it (by UID)."""
        if live is None or self.refused:
            return None
        held = self.taken.get(key_of(live))
        if held is None:
            return None
        release, checked = held
        same = (checked.get("metadata") or {}).get("uid") == (live.get("metadata") or {}).get("uid")
        return release if same and helm_release_of(live) == (release, _namespace(checked)) else None


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(HELM_RELEASE_NAMESPACE))


def helm_release_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(release, namespace) of Helm's ownership metadata on `obj`, or None when it has none.

    Helm writes both annotations and the managed-by label on every object
    of a release; its own upgrade refuses an object missing any of them.
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    name, namespace = annotations.get(HELM_RELEASE_NAME), annotations.get(HELM_RELEASE_NAMESPACE)
    if not name or not namespace or labels.get(MANAGED_BY_LABEL) != HELM_MANAGED_BY:
        return None
    return str(name), str(namespace)


def release_key(obj: ReleaseObject) -> ObjectKey:
    """The key of an object of a release record, as key_of gives it for the live one."""
    return (obj.api_version, obj.kind, obj.namespace or "", obj.name)


def plan_takeover(
    wanted: Iterable[str],
    namespace: str,
    releases: Mapping[str, HelmRelease],
    live: Mapping[ObjectKey, Mapping[str, Any] | None],
    rendered: Collection[ObjectKey],
    owner: Owner,
    *,
    labelled: Iterable[Mapping[str, Any]] = (),
    taken_before: Collection[str] = (),
) -> Takeover:
    """Which objects of the `wanted` releases in `namespace` may be taken, or why none.

    `live` holds what the API server has under each key of the releases'
    records (None: not there); `rendered` the keys the operator renders;
    `labelled` the live objects of the kinds it renders that carry Helm's
    metadata (an object that names a release without being in its record
    is refused: Helm did not make it, and the user's consent named the
    release, not it). A release in `taken_before` (objects of ours carry its
    name in ADOPTED_FROM) may be gone: once its objects are ours, the user
    is told to have Helm forget it.
    """
    names = tuple(dict.fromkeys(wanted))
    taken: dict[ObjectKey, tuple[str, Mapping[str, Any]]] = {}
    left: list[str] = []
    refused: list[str] = []
    recorded: set[ObjectKey] = set()
    for name in names:
        release = releases.get(name)
        where = f"Helm release {namespace}/{name}"
        if release is None:
            if name not in taken_before:
                refused.append(
                    f"{where}: not found (no Secret sh.helm.release.v1.{name}.v<N> with "
                    "status deployed in the namespace)"
                )
            continue
        if release.chart not in CHARTS:
            refused.append(
                f"{where}: is of chart {release.chart}, not Istio's ztunnel or istio-cni (cni)"
            )
            continue
        for obj in release.objects:
            key = release_key(obj)
            recorded.add(key)
            if key not in rendered:
                if obj.api_version == RBAC_GROUP and obj.kind in RBAC_KINDS:
                    left.append(obj.describe())
                    continue
                refused.append(
                    f"{obj.describe()}: in {where}, and the operator renders no such object "
                    "(take it out of the release, or leave the release to Helm)"
                )
                continue
            current = live.get(key)
            if current is None or conflict(current, owner) is None:
                continue  # nothing to take (the operator creates its own), or taken before
            owned_by = helm_release_of(current)
            if owned_by != (name, namespace):
                said = f"release {owned_by[1]}/{owned_by[0]}" if owned_by else "no Helm release"
                refused.append(
                    f"{describe(current)}: in {where}'s record, but its ownership metadata "
                    f"names {said}: Helm would not manage it either"
                )
                continue
            taken[key] = (name, current)
    for claimed in labelled:
        held = helm_release_of(claimed)
        if held is None or held[1] != namespace or held[0] not in releases:
            continue
        if held[0] in names and key_of(claimed) not in recorded:
            refused.append(
                f"{describe(claimed)}: carries Helm release {namespace}/{held[0]}'s ownership "
                "metadata but is not in its record, so Helm did not make it; remove that "
                "metadata or the object"
            )
    if refused:
        return Takeover(names, {}, tuple(sorted(left)), tuple(refused))
    return Takeover(names, taken, tuple(sorted(left)), ())


def as_adopted(
    rendered: Mapping[str, Any], live: Mapping[str, Any] | None, release: str | None
) -> Mapping[str, Any]:
    """What to write over `live` when it rolls: `rendered`, with what a take-over keeps of it.

    `release` is set when `live` is being taken from that release in this
    pass. An object taken before keeps its ADOPTED_FROM annotation. A
    DaemonSet keeps its live selector (immutable), and gets the selector's
    labels added to its pod template, so the kept selector still selects
    its pods. Whether its running template is kept instead is apply/held.py's
    rule, the same as for an operator upgrade.
    """
    if live is None:
        return rendered
    live_annotations = (live.get("metadata") or {}).get("annotations") or {}
    origin = release or live_annotations.get(ADOPTED_FROM)
    if not origin:
        return rendered
    out = dict(rendered)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    annotations[ADOPTED_FROM] = str(origin)
    if rendered.get("kind") != "DaemonSet":
        return out
    spec = out["spec"] = dict(out.get("spec") or {})
    selector = (live.get("spec") or {}).get("selector")
    if selector is not None:
        spec["selector"] = selector
    spec["template"] = next_template(rendered, live)
    return out


def next_template(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template a DaemonSet taken over gets once the render is rolled.

    The render's, with the labels of the live selector added, so the
    selector Helm made (which cannot change) still selects the new pods.
    """
    template = dict((rendered.get("spec") or {}).get("template") or {})
    template_meta = template["metadata"] = dict(template.get("metadata") or {})
    selector = (live.get("spec") or {}).get("selector") or {}
    template_meta["labels"] = {
        **(template_meta.get("labels") or {}),
        **(selector.get("matchLabels") or {}),
    }
    return template


def absorbs(entry: Mapping[str, Any], helm_managers: Collection[str]) -> bool:
    """Whether a managedFields entry is Helm's, for a take-over to make ours."""
    return (
        entry.get("manager") in helm_managers
        and entry.get("operation") == "Update"
        and not entry.get("subresource")
    )


def helm_managers(obj: Mapping[str, Any]) -> frozenset[str]:
    """The field managers that set Helm's ownership annotation on `obj`.

    Helm names itself after its binary (pkg/kube getManagedFieldsManager),
    so the manager is found by what it wrote, not by a fixed name.
    """
    out = set()
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        fields = (entry.get("fieldsV1") or {}).get("f:metadata") or {}
        if f"f:{HELM_RELEASE_NAME}" in (fields.get("f:annotations") or {}):
            out.add(str(entry.get("manager")))
    return frozenset(out)
