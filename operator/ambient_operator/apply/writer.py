"""Writing objects of ours, and only ours: ownership before every write.

:func:`write` creates or updates one prepared object; :func:`prune` deletes
one. Both check ownership (apply/ownership.py) on what the API server holds, and
carry a precondition, so a race with somebody else's write cannot turn into
a takeover:

- A first creation is one server-side apply that carries a resourceVersion
  no stored object has (:data:`NEVER_STORED`): where anything of that name
  exists, the precondition fails (409) instead of merging into it, so it is
  a create that cannot take an object over, and its fields are our apply
  entry's from the start (later applies drop what we stop setting). An
  object an earlier version created by POST carries that POST's entry: its
  next update makes it part of our apply entry first (:func:`claim_for_apply`).
- An update is a forced server-side apply (force only on what we own) with
  the resourceVersion whose ownership we checked; a conflict re-reads the
  object, checks again and retries once.
- A delete names the UID whose ownership we checked.
- A field we stop applying that someone else is to keep setting (a
  Deployment's replicas, once an autoscaler has them) is first handed over
  (:func:`hand_over`), under the same checks.

The one exception to "ours only" is :func:`remove_taint`: with node
readiness gating enabled, a Node's readiness taint, and nothing else of it.

Before any of that, every object written here (write, create_new, replace)
must pin its pods to one OS (apply/placement.py): an object that does not is
refused, with no request.

An answer 429 (the API server's priority and fairness sheds load) is waited
out and asked again, a few times with a growing pause (:func:`patient`):
nothing was written, so the same request is still the right one.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, ParamSpec, TypeVar

from ambient_operator.api import constants as c
from ambient_operator.apply.adopt import ADOPTED_FROM, Takeover, absorbs, helm_managers
from ambient_operator.apply.held import APPROVED, AS_IS, INPUTS, TEMPLATE_BY
from ambient_operator.apply.ownership import conflict, describe, may_prune
from ambient_operator.apply.placement import placement_problem
from ambient_operator.apply.plan import HASH_ANNOTATION, Owner
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS, kind_of

log = logging.getLogger(__name__)
NAME_CONFLICT = "NameConflict"
# etcd's revisions start at 1 and its first write is revision 2, so no stored
# object has this resourceVersion: an apply carrying it creates, or fails 409.
NEVER_STORED = "1"
# Pauses before asking again after a 429, in seconds; then the 429 is the answer.
BACKOFF_SECONDS = (0.25, 0.5, 1.0, 2.0, 4.0)
P = ParamSpec("P")
R = TypeVar("R")
# Co-owns a field we stop applying until its new writer (an autoscaler) takes it.
HANDOVER_FIELD_MANAGER = f"{c.FIELD_MANAGER}-handover"
CLAIM_ATTEMPTS = 5


class NameConflictError(Exception):
    """Something that is not ours holds the name of an object we want."""

    reason = NAME_CONFLICT

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _refuse_unplaced(obj: Mapping[str, Any]) -> None:
    """Raise KubeError 422 Unplaced when the object's pods are not pinned to one OS."""
    # Every DaemonSet and Deployment the operator writes passes through this
    # module, so this is the one place that checks what OS each pod template
    # will run on (the check tigera-operator's component handler makes),
    # whichever renderer or controller built it. Refused before any request.
    problem = placement_problem(obj)
    if problem is not None:
        raise KubeError(422, "Unplaced", f"{describe(obj)}: {problem}; not written")


def _read(kube: Kube, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    return kube.get(kind_of(dict(obj)), meta["name"], meta.get("namespace"))


def _union(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two fieldsV1 sets as one: every field either holds."""
    out = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        out[key] = _union(mine, value) if isinstance(mine, Mapping) else value
    return out


def _as_applied(entries: list[Any], helm: Collection[str] = ()) -> list[Any] | None:
    """The managedFields with our POST's entry made part of our apply entry; None if none is.

    Our create leaves an `Update` entry; kept, its fields would outlive our
    applies that stop setting them (a PodDisruptionBudget would keep its
    minAvailable beside a new maxUnavailable, which the API server refuses).
    One manager has one apply entry, so an apply entry already there takes
    the fields in. A take-over passes the `helm` managers, whose entries are
    made ours the same way: what Helm set and the operator does not is then
    dropped by its next apply, as if the operator had set it.
    """

    def ours(entry: Any, operation: str) -> bool:
        return (
            isinstance(entry, Mapping)
            and entry.get("manager") == c.FIELD_MANAGER
            and entry.get("operation") == operation
            and not entry.get("subresource")
        )

    posted = [
        e
        for e in entries
        if ours(e, "Update") or (isinstance(e, Mapping) and helm and absorbs(e, helm))
    ]
    if not posted:
        return None
    applied = next((e for e in entries if ours(e, "Apply")), None)
    merged = dict(applied if applied is not None else posted[0])
    merged["operation"] = "Apply"
    fields: dict[str, Any] = {}
    for entry in [*posted, *([applied] if applied is not None else [])]:
        fields = _union(fields, entry.get("fieldsV1") or {})
    merged["fieldsV1"] = fields
    merged["manager"] = c.FIELD_MANAGER
    rest = [e for e in entries if not (any(e is p for p in posted) or ours(e, "Apply"))]
    return [*rest, merged]


def claim_for_apply(
    kube: Kube, obj: Mapping[str, Any], helm: Collection[str] = ()
) -> dict[str, Any]:
    """Turn the fields our POST set into fields our server-side apply owns.

    Anyone may write between our POST and this patch (a controller's first
    status, the garbage collector): a conflict is read again and retried, so
    the claim is not lost. A write that failed here earlier is made good on
    the object's next update, which passes through here too.
    """
    uid = obj["metadata"].get("uid")
    current: Mapping[str, Any] | None = obj
    for _ in range(CLAIM_ATTEMPTS):
        if current is None or current["metadata"].get("uid") != uid:
            # Only the object whose ownership was checked is claimed.
            raise KubeError(409, "Conflict", f"{describe(obj)} was replaced while we wrote it")
        meta = current["metadata"]
        entries = _as_applied(list(meta.get("managedFields") or []), helm)
        if entries is None:
            return dict(current)
        patch = {"metadata": {"managedFields": entries, "resourceVersion": meta["resourceVersion"]}}
        try:
            return kube.merge_patch(
                kind_of(dict(current)), meta["name"], meta.get("namespace"), patch
            )
        except KubeError as exc:
            if exc.status != 409:
                raise
        current = _read(kube, current)
    raise KubeError(409, "Conflict", f"{describe(obj)} kept changing while we claimed its fields")


def patient(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn`, asked again after each 429 (too many requests) with the pauses of BACKOFF_SECONDS.

    Runs in the calling thread (the writes run in threads of their own, off
    the event loop), so a pause holds only its own write.
    """

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        for pause in BACKOFF_SECONDS:
            try:
                return fn(*args, **kwargs)
            except KubeError as exc:
                if exc.status != 429:
                    raise
                log.info("429 from the API server; asking again in %.2f s", pause)
            time.sleep(pause)
        return fn(*args, **kwargs)

    return call


def _create(kube: Kube, obj: Mapping[str, Any]) -> dict[str, Any]:
    """One apply that creates `obj`, or fails 409 when anything holds its name."""
    body = dict(obj)
    body["metadata"] = {**obj["metadata"], "resourceVersion": NEVER_STORED}
    return kube.apply(body, force=True)


def _create_or_find(
    kube: Kube,
    obj: Mapping[str, Any],
    refusal: Callable[[Mapping[str, Any] | None], str | None],
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Create `obj` in one request: (the object, the object). When something holds its
    name already (our cache had not seen it, or another replica of ours made it
    meanwhile), (None, that holder) once `refusal` lets it through; refused, a
    NameConflictError."""
    try:
        created = _create(kube, obj)
        return created, created
    except KubeError as exc:
        if exc.status != 409:
            raise
    live = _read(kube, obj)
    why = refusal(live)
    if why is not None:
        raise NameConflictError(why)
    if live is None:
        raise KubeError(409, "Conflict", f"{describe(obj)} changed while we wrote it")
    return None, live


@patient
def write(
    kube: Kube,
    obj: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    owner: Owner | None,
    *,
    takeover: Takeover | None = None,
) -> dict[str, Any]:
    """Create or update `obj` (prepared by apply.prepare); `live` is what the cache holds.

    Raises NameConflictError when the object exists and is not ours, KubeError
    when the API server refuses or the object's pods are not pinned to one OS.
    A creation is one request; an update is one too, unless the object still
    holds fields of a POST of ours (then a claim, made from a fresh read).

    `takeover` (apply/adopt.py) lets through an object that is not ours when
    it is exactly the one the take-over checked (same UID, the same Helm
    release's metadata, read again before the write); Helm's field entries
    are then made ours before the apply.
    """
    _refuse_unplaced(obj)

    def refusal(current: Mapping[str, Any] | None) -> str | None:
        if takeover is not None and takeover.allows(current) is not None:
            return None
        return conflict(current, owner)

    why = refusal(live)
    if why is not None:
        raise NameConflictError(why)
    if live is None:
        created, live = _create_or_find(kube, obj, refusal)
        if created is not None:
            return created
    taking = takeover is not None and conflict(live, owner) is not None
    helm = helm_managers(live) if taking else frozenset()
    if taking or _as_applied(list(live["metadata"].get("managedFields") or [])) is not None:
        # A cache keeps other managers' entries without their fields
        # (kube/resources.cached_copy): the claim writes them back, so it is
        # made from the object as the API server holds it.
        fresh = _read(kube, live)
        if fresh is not None:
            why = refusal(fresh)
            if why is not None:
                raise NameConflictError(why)
            if taking:
                helm = helm_managers(fresh)
            live = claim_for_apply(kube, fresh, helm)
    for attempt in range(2):
        body = copy.deepcopy(dict(obj))
        body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        try:
            return kube.apply(body, force=True)
        except KubeError as exc:
            if exc.status != 409 or attempt:
                raise
        live = _read(kube, obj)
        why = refusal(live) if live is not None else None
        if why is not None:
            raise NameConflictError(why)
        if live is None:
            return write(kube, obj, None, owner)
    raise AssertionError("unreachable")


@patient
def hand_over(
    kube: Kube, live: Mapping[str, Any], owner: Owner | None, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """Have a second field manager apply `fields` of an object of ours, at the values it holds.

    Server-side apply deletes a field that its only manager stops applying,
    and the API server then defaults it: a Deployment whose `replicas` we
    leave to a new autoscaler would drop to 1 pod before the autoscaler acts.
    With this manager holding the field too, our next apply without it keeps
    the value, and the autoscaler's first write takes it over (Kubernetes
    documents this hand-over under "Transferring ownership"). The write
    touches no pod template, so the placement check does not apply; ownership
    is checked and the resourceVersion carried as for every write.
    """
    why = conflict(live, owner)
    if why is not None:
        raise NameConflictError(why)
    meta = live["metadata"]
    body = {
        "apiVersion": live["apiVersion"],
        "kind": live["kind"],
        "metadata": {
            "name": meta["name"],
            **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
            "resourceVersion": meta["resourceVersion"],
        },
        **copy.deepcopy(dict(fields)),
    }
    return kube.apply(body, force=True, field_manager=HANDOVER_FIELD_MANAGER)


def write_by_name(
    kube: Kube, obj: Mapping[str, Any], live: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Create or update an object of ours (by field manager) that RBAC grants by name only.

    The chart may grant `create` of the MutatingWebhookConfiguration only with
    its resourceNames, which a POST cannot carry (the name is in the body, not
    the URL), so this object is created by server-side apply. Ownership is
    checked first, and an update carries the resourceVersion it was checked
    at; a creation carries one no object has (:data:`NEVER_STORED`), so a
    namesake made after our read finding nothing fails it (409) instead of
    being merged into.
    """
    _refuse_unplaced(obj)
    why = conflict(live, None)
    if why is not None:
        raise NameConflictError(why)
    if live is None:
        created, live = _create_or_find(kube, obj, lambda found: conflict(found, None))
        if created is not None:
            return created
    body = copy.deepcopy(dict(obj))
    body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
    return kube.apply(body, force=True)


@patient
def prune(
    kube: Kube,
    obj: Mapping[str, Any],
    owner: Owner | None,
    namespaces: Collection[str] | None,
) -> bool:
    """Delete a prune candidate if it is ours and in scope; False when it was left alone.

    The delete carries the candidate's UID, so a namesake created meanwhile
    survives.
    """
    if not may_prune(obj, owner, namespaces):
        return False
    meta = obj["metadata"]
    kube.delete(kind_of(dict(obj)), meta["name"], meta.get("namespace"), uid=meta.get("uid"))
    return True


def create_new(kube: Kube, obj: Mapping[str, Any]) -> dict[str, Any]:
    """POST an object that must not exist yet (a Lease, the webhook's Secret).

    A KubeError 409 means somebody else made it first: the caller reads theirs.
    """
    _refuse_unplaced(obj)
    return kube.create(obj)


def replace(kube: Kube, obj: Mapping[str, Any]) -> dict[str, Any]:
    """PUT an object at the resourceVersion it was read at; 409 when it changed since."""
    meta = obj["metadata"]
    if not meta.get("resourceVersion"):
        raise ValueError(f"{describe(obj)}: a replace needs the resourceVersion it was read at")
    _refuse_unplaced(obj)
    path = kind_of(dict(obj)).path(meta["name"], meta.get("namespace"))
    result: dict[str, Any] = kube.request("PUT", path, body=dict(obj))
    return result


def remove_taint(
    kube: Kube, node: Mapping[str, Any], key: str, effect: str
) -> dict[str, Any] | None:
    """Remove the taints of `key` and `effect` from a Node, and nothing else; the Node after.

    The one write to an object the operator does not own (node readiness
    gating, opt-in). A JSON patch whose `test` ops require the Node's UID and
    its whole taint list to be exactly what `node` (our cache) holds, then
    replaces the list with the same list minus those taints: a taint someone
    added or removed meanwhile fails the test (422) instead of being lost,
    and the next pass judges the Node again. The resourceVersion is not
    tested: status heartbeats change it every few seconds, and they touch
    neither the taints nor anything this patch writes. None when the Node
    has no such taint (no request).
    """
    meta = node["metadata"]
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [t for t in taints if (t.get("key"), t.get("effect")) != (key, effect)]
    if len(kept) == len(taints):
        return None
    patch = [
        {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    result: dict[str, Any] = kube.request(
        "PATCH",
        KINDS[("v1", "Node")].path(meta["name"]),
        body=patch,
        query=[("fieldManager", c.FIELD_MANAGER)],
        content_type="application/json-patch+json",
    )
    return result


# Our labels and annotations, which orphaning removes: without them nothing
# selects the object as ours, and Helm's --take-ownership finds it bare.
_OURS_LABELS = (c.LABEL_MANAGED_BY, c.LABEL_CONTROLLER)
_OURS_ANNOTATIONS = (HASH_ANNOTATION, ADOPTED_FROM, AS_IS, TEMPLATE_BY, INPUTS, APPROVED)


def orphan(kube: Kube, live: Mapping[str, Any], owner: Owner) -> dict[str, Any]:
    """Let go of an object of ours: its controller reference to `owner`, our labels and
    annotations removed, everything else as it runs (spec.deletionPolicy Orphan).

    A DaemonSet's pod template is not touched, so no pod restarts. Ownership
    is checked and the resourceVersion carried, as for every write.
    """
    why = conflict(live, owner)
    if why is not None:
        raise NameConflictError(why)
    meta = live["metadata"]
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != owner.uid]
    # In a merge patch, null removes a key: the reference list when no other
    # owner is left, and each of our labels and annotations.
    body: dict[str, Any] = {
        "resourceVersion": meta["resourceVersion"],
        "ownerReferences": refs or None,
    }
    labels = {k: None for k in _OURS_LABELS if k in (meta.get("labels") or {})}
    annotations = {k: None for k in _OURS_ANNOTATIONS if k in (meta.get("annotations") or {})}
    if labels:
        body["labels"] = labels
    if annotations:
        body["annotations"] = annotations
    patch = {"metadata": body}
    return kube.merge_patch(kind_of(dict(live)), meta["name"], meta.get("namespace"), patch)


def set_finalizer(kube: Kube, obj: Mapping[str, Any], finalizer: str, present: bool) -> None:
    """Add or remove one finalizer of an object the operator reads (the AmbientMesh).

    The list is written whole at the resourceVersion it was read at, so a
    finalizer somebody else added meanwhile is not lost (409: the next pass
    reads it again).
    """
    meta = obj["metadata"]
    held = list(meta.get("finalizers") or [])
    if (finalizer in held) == present:
        return
    wanted = [*held, finalizer] if present else [f for f in held if f != finalizer]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "finalizers": wanted}}
    kube.merge_patch(kind_of(dict(obj)), meta["name"], meta.get("namespace"), patch)


def apply_requested(kube: Kube, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply of an object a person asked for by name (the waypoint CLI).

    The object is theirs, written under the CLI's own field manager: the
    ownership rule of the operator's objects does not apply.
    """
    return kube.apply(obj, force=True)


def delete_requested(kube: Kube, obj: Mapping[str, Any]) -> bool:
    """Delete an object a person asked for by name (`waypoint delete`); False if already gone.

    Only the incarnation the person was shown is deleted (its UID as a
    precondition), never a namesake made meanwhile. What it owns is left to
    the garbage collector, as `kubectl delete` leaves it.
    """
    meta = obj["metadata"]
    return kube.delete(kind_of(dict(obj)), meta["name"], meta.get("namespace"), uid=meta.get("uid"))
