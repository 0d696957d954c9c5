"""One apply layer for everything the operator owns.

Rendered objects get our labels, an owner reference and a hash of what we
asked for. An object is written only when the live copy lacks a field we
want, holds another value there, or was applied from a different desired
state (the hash differs, e.g. a field we used to set was dropped). That is
how a reconcile with nothing to do makes zero write requests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.kube.resources import ObjectKey, key_of, resource_version

HASH_ANNOTATION = "ambientoperator.io/desired-hash"


@dataclass(frozen=True)
class Owner:
    """The object that owns what we apply, for garbage collection."""

    api_version: str
    kind: str
    name: str
    uid: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Owner:
        """Owner reference target from a live object."""
        meta = obj["metadata"]
        return cls(str(obj["apiVersion"]), str(obj["kind"]), str(meta["name"]), str(meta["uid"]))

    def reference(self) -> dict[str, Any]:
        """The ownerReferences entry."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def desired_hash(obj: Mapping[str, Any]) -> str:
    """A stable digest of a desired object."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def prepare(obj: Mapping[str, Any], owner: Owner | None, controller: str) -> dict[str, Any]:
    """The object as we apply it: our labels, owner reference and desired hash.

    Only the metadata is copied: the rest is shared with `obj`, which no
    writer changes (each copies what it sends). A deep copy of every
    rendered object was a seventh of a node pass (bench/profile_passes.py).
    """
    out = dict(obj)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    labels = meta["labels"] = dict(meta.get("labels") or {})
    if "annotations" in meta:
        meta["annotations"] = dict(meta["annotations"] or {})
    labels[c.LABEL_MANAGED_BY] = c.MANAGED_BY
    labels[LABEL_CONTROLLER] = controller
    if owner is not None:
        meta["ownerReferences"] = [owner.reference()]
    meta.setdefault("annotations", {})[HASH_ANNOTATION] = desired_hash(out)
    return out


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field we set has the same value in the live object.

    Empty maps and lists we ask for match an absent field, because the API
    server drops them on the way in.
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return not desired and live is None
        for name, value in desired.items():
            if name not in live:
                if value in ({}, [], None):
                    continue
                return False
            if not is_subset(value, live[name]):
                return False
        return True
    if isinstance(desired, list):
        if live is None:
            return not desired
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, item) for d, item in zip(desired, live, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    return bool(desired == live)


def up_to_date(prepared: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """Whether applying `prepared` would change nothing we care about."""
    if live is None:
        return False
    want = prepared["metadata"]["annotations"][HASH_ANNOTATION]
    have = (live.get("metadata", {}).get("annotations") or {}).get(HASH_ANNOTATION)
    if want != have:
        return False
    # Status is the server's; compare only what we write.
    wanted = {k: v for k, v in prepared.items() if k != "status"}
    return is_subset(wanted, live)


@dataclass
class Plan:
    """What a reconcile must write."""

    apply: list[dict[str, Any]] = field(default_factory=list)
    prune: list[dict[str, Any]] = field(default_factory=list)
    unchanged: int = 0


def plan(
    prepared: Iterable[Mapping[str, Any]],
    live: Mapping[ObjectKey, Mapping[str, Any]],
    memo: PassMemo | None = None,
) -> Plan:
    """Compare desired objects with the live ones of the same prune set.

    `live` must hold only objects of this controller's prune set (selected by
    our labels); whatever there is not desired any more is pruned. `memo`
    remembers what was found up to date, for the next pass.
    """
    result = Plan()
    wanted: set[ObjectKey] = set()
    judge = memo.up_to_date if memo is not None else up_to_date
    for obj in prepared:
        key = key_of(obj)
        wanted.add(key)
        if judge(obj, live.get(key)):
            result.unchanged += 1
        else:
            result.apply.append(dict(obj))
    for key, obj in sorted(live.items()):
        if key not in wanted:
            result.prune.append(dict(obj))
    return result


# A rendered object, the owner and controller it was prepared for, and the result.
_Prepared = tuple[Mapping[str, Any], "Owner | None", str, dict[str, Any]]


class PassMemo:
    """What one controller's last pass prepared and found up to date.

    Each pass renders every object again, and nearly all of them are what
    the pass before rendered, against live objects that have not changed
    since. Both steps are pure functions of those inputs: an object equal
    to the one rendered last time (one dict comparison, in C) gets the same
    prepared object back, without its desired hash; a prepared object
    already found up to date against the same live resourceVersion is up
    to date still, without comparing field by field. Together they were a
    third of a node pass (bench/profile_passes.py). Holds one pass's
    objects: a key not rendered in a pass is forgotten.
    """

    def __init__(self) -> None:
        self._prepared: dict[ObjectKey, _Prepared] = {}
        self._current: dict[ObjectKey, tuple[dict[str, Any], int]] = {}

    def prepare(
        self, objects: Iterable[Mapping[str, Any]], owner: Owner | None, controller: str
    ) -> list[dict[str, Any]]:
        """`prepare` of each object; the very object of the last pass where its input is equal.

        Callers must not change what they get: the next pass may be handed it again.
        """
        kept: dict[ObjectKey, _Prepared] = {}
        out = []
        for obj in objects:
            key = key_of(obj)
            held = self._prepared.get(key)
            if held is not None and held[1] == owner and held[2] == controller and held[0] == obj:
                done = held[3]
            else:
                done = prepare(obj, owner, controller)
            kept[key] = (obj, owner, controller, done)
            out.append(done)
        self._prepared = kept
        self._current = {k: v for k, v in self._current.items() if k in kept}
        return out

    def up_to_date(self, prepared: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
        """`up_to_date`, remembered for this prepared object and the live resourceVersion."""
        if live is None:
            return False
        key = key_of(prepared)
        version = resource_version(live)
        held = self._current.get(key)
        if held is not None and held[0] is prepared and held[1] == version and version:
            return True
        fresh = up_to_date(prepared, live)
        if fresh and isinstance(prepared, dict):
            self._current[key] = (prepared, version)
        else:
            self._current.pop(key, None)
        return fresh
