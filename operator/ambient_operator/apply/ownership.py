"""Whether an object is ours to change or delete. Pure.

Labels only select; ownership decides. An object is ours when its controller
ownerReference points at the owner we reconcile for (the AmbientMesh, or one
Gateway), by UID. An object we keep without an owner in scope (cluster-wide
class defaults, the webhook's own objects) is ours when our field manager
applied it. Anything else that exists under a name we want is somebody
else's: it is never patched, adopted, given an ownerReference or deleted,
and the owner's status names it. istiod's deployment controller follows the
same rule (`canManage`: an existing object without its managed label is
left alone).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.apply.plan import Owner


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller=true, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def applied_by_us(obj: Mapping[str, Any]) -> bool:
    """Whether our field manager holds fields of the object through server-side apply."""
    return any(
        isinstance(entry, Mapping)
        and entry.get("manager") == c.FIELD_MANAGER
        and entry.get("operation") == "Apply"
        for entry in (obj.get("metadata") or {}).get("managedFields") or []
    )


def applies_field(obj: Mapping[str, Any], path: Sequence[str]) -> bool:
    """Whether our field manager applies the field at `path` (say spec, replicas).

    Held by our apply entry, or by our create's entry, which apply/writer.py
    makes part of the apply entry before its next apply.
    """
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if not (
            isinstance(entry, Mapping)
            and entry.get("manager") == c.FIELD_MANAGER
            and entry.get("operation") in ("Apply", "Update")
            and not entry.get("subresource")
        ):
            continue
        node: Any = entry.get("fieldsV1")
        for part in path:
            node = node.get(f"f:{part}") if isinstance(node, Mapping) else None
        if node is not None:
            return True
    return False


def describe(obj: Mapping[str, Any]) -> str:
    """`Kind namespace/name` (or `Kind name` when cluster-scoped), for messages."""
    meta = obj.get("metadata") or {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name', '?')}"


def holders(obj: Mapping[str, Any]) -> str:
    """` (fields managed by helm, kubectl)`, or nothing when no manager is recorded.

    Without a controller reference the field managers are what tells a user
    who made the object.
    """
    managers = [
        str(entry.get("manager"))
        for entry in (obj.get("metadata") or {}).get("managedFields") or []
        if isinstance(entry, Mapping) and entry.get("manager")
    ]
    return f" (fields managed by {', '.join(dict.fromkeys(managers))})" if managers else ""


def conflict(live: Mapping[str, Any] | None, owner: Owner | None) -> str | None:
    """Why we must not write `live`, or None when it is ours (or does not exist)."""
    if live is None:
        return None
    if owner is None:
        if applied_by_us(live):
            return None
        return f"{describe(live)} exists and was not created by {c.FIELD_MANAGER}{holders(live)}"
    ref = controller_of(live)
    if ref is not None and ref.get("uid") == owner.uid:
        return None
    if ref is not None:
        holder = f"{ref.get('kind', '?')} {ref.get('name', '?')}"
        if holder == f"{owner.kind} {owner.name}":
            # Owners are unique by kind and name where an ownerReference can
            # point (its own namespace, or cluster-wide), so a namesake with
            # another uid has been deleted. Its objects normally go within
            # seconds; kube-controller-manager keeps them for good when the
            # deletion and the new owner fell into one re-list of its watch.
            return (
                f"{describe(live)} exists and is controlled by an earlier {holder} "
                f"(uid {ref.get('uid', '?')}), which was deleted; the garbage collector "
                "has not removed it yet. If it stays, delete it and it is made again"
            )
        return (
            f"{describe(live)} exists and is controlled by {holder}, "
            f"not by {owner.kind} {owner.name}"
        )
    return f"{describe(live)} exists and is not owned by {owner.kind} {owner.name}{holders(live)}"


def may_prune(
    obj: Mapping[str, Any], owner: Owner | None, namespaces: Collection[str] | None
) -> bool:
    """Whether a prune candidate (selected by our labels) may be deleted.

    It must be ours by :func:`conflict`, and, when namespaced, live in one of
    the namespaces the owner writes to (`namespaces`; None means any, for
    owners whose objects may be anywhere).
    """
    if conflict(obj, owner) is not None:
        return False
    namespace = (obj.get("metadata") or {}).get("namespace")
    return not namespace or namespaces is None or namespace in namespaces
