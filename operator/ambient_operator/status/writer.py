"""The one status writer: status subresources and Events.

Status is written by server-side apply of the status subresource. Where a
caller keeps fields from what it last saw (a Gateway's addresses), the write
carries that copy's resourceVersion; a conflict is answered with the fresh
copy, and the caller decides whether to judge again. Events are created
once under a deterministic name (status/events.py decides which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import kind_of


@dataclass(frozen=True)
class StatusWrite:
    """What a status write found: written, or the object as it is now (None: gone)."""

    written: bool
    live: dict[str, Any] | None


def write_status(
    kube: Kube,
    obj: Mapping[str, Any],
    status: Mapping[str, Any],
    *,
    precondition: bool,
) -> StatusWrite:
    """Apply `status` to `obj`'s status subresource.

    With `precondition`, only at the resourceVersion of `obj`: a conflict
    re-reads the object and returns it unwritten. Other refusals raise
    KubeError.
    """
    meta = obj["metadata"]
    target: dict[str, Any] = {"name": meta["name"]}
    if meta.get("namespace"):
        target["namespace"] = meta["namespace"]
    if precondition:
        target["resourceVersion"] = meta.get("resourceVersion")
    body = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": target}
    body["status"] = dict(status)
    try:
        return StatusWrite(True, kube.apply_status(body))
    except KubeError as exc:
        if exc.status == 404:
            return StatusWrite(False, None)
        if exc.status != 409 or not precondition:
            raise
    fresh = kube.get(kind_of(dict(obj)), meta["name"], meta.get("namespace"))
    return StatusWrite(False, fresh)


def create_event(kube: Kube, event: Mapping[str, Any]) -> None:
    """Create one Event; KubeError 409 when that news was told already."""
    kube.create(event)
