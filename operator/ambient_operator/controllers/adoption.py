"""The data plane's take-over of Helm releases and its way back: the reads and writes.

What to take is decided in apply/adopt.py; this module gathers what that
needs from the API server (the release records, the objects they name, and
objects carrying Helm's metadata), and carries out spec.deletionPolicy
Orphan when the AmbientMesh is deleted. Blocking: called in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ambient_operator.apply.adopt import (
    ADOPTED_FROM,
    HELM_MANAGED_BY,
    MANAGED_BY_LABEL,
    TAKEABLE_KINDS,
    Takeover,
    plan_takeover,
    release_key,
)
from ambient_operator.apply.ownership import describe
from ambient_operator.apply.plan import Owner
from ambient_operator.apply.writer import NameConflictError, orphan
from ambient_operator.cluster.helm_releases import ReleaseRecordError, read_releases
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS, ObjectKey, kind_of

log = logging.getLogger(__name__)

# Set on the AmbientMesh while spec.deletionPolicy is Orphan, so that its
# deletion waits for the operator to let go of the agents.
ORPHAN_FINALIZER = "ambientoperator.io/orphan-agents"


def taken_before(ours: Mapping[ObjectKey, Mapping[str, Any]]) -> set[str]:
    """The releases that objects of ours were taken from (their ADOPTED_FROM annotation)."""
    out = set()
    for obj in ours.values():
        origin = ((obj.get("metadata") or {}).get("annotations") or {}).get(ADOPTED_FROM)
        if origin:
            out.add(str(origin))
    return out


def gather_takeover(
    kube: Kube,
    namespace: str,
    wanted: Sequence[str],
    rendered: Collection[ObjectKey],
    owner: Owner,
    ours: Mapping[ObjectKey, Mapping[str, Any]],
) -> Takeover:
    """Read what spec.adopt's releases hold in `namespace`, and decide (apply/adopt.py).

    A record or an object that cannot be read is a refusal, like a missing
    release: nothing is taken on a guess.
    """
    if set(wanted) <= taken_before(ours) and set(rendered) <= ours.keys():
        # Every release named was taken and everything rendered is ours: no record is
        # needed, so the Secrets it would take to read them (adoption.enabled) may be
        # withdrawn and the records forgotten without refusing what is done.
        return Takeover(tuple(wanted))
    live: dict[ObjectKey, Mapping[str, Any] | None] = {}
    labelled: list[Mapping[str, Any]] = []
    try:
        releases = read_releases(kube, namespace)
        for name in wanted:
            release = releases.get(name)
            for obj in release.objects if release is not None else ():
                key = release_key(obj)
                if key not in rendered or key in live:
                    continue  # not read: refused or left with Helm on its key alone
                held = ours.get(key)
                live[key] = held if held is not None else kube.get(KINDS[key[:2]], obj.name, key[2])
        # Objects that claim a release without being in its record, of the
        # kinds a take-over can take.
        for api_version, kind in TAKEABLE_KINDS:
            labelled += kube.list(
                KINDS[(api_version, kind)], namespace, f"{MANAGED_BY_LABEL}={HELM_MANAGED_BY}"
            )
    except ReleaseRecordError as exc:
        return Takeover(tuple(wanted), refused=(str(exc),))
    except KubeError as exc:
        return Takeover(
            tuple(wanted),
            refused=(
                f"what the Helm releases in {namespace} hold cannot be read ({exc.status} "
                f"{exc.reason}: {exc.message}); the operator's chart grants it with "
                f"adoption.enabled=true and agents.namespaces naming {namespace}",
            ),
        )
    return plan_takeover(
        wanted,
        namespace,
        releases,
        live,
        rendered,
        owner,
        labelled=labelled,
        taken_before=taken_before(ours),
    )


def orphan_all(kube: Kube, ours: Mapping[ObjectKey, Mapping[str, Any]], owner: Owner) -> list[str]:
    """Let go of every object of this mesh's data plane; what could not be, with why.

    A write that met a newer version is read again and retried once; an
    object gone meanwhile needs nothing.
    """
    failed = []
    for _, obj in sorted(ours.items()):
        current: Mapping[str, Any] | None = obj
        for attempt in range(2):
            if current is None:
                break
            try:
                orphan(kube, current, owner)
                log.info("orphaned %s", describe(current))
                break
            except NameConflictError as exc:
                failed.append(exc.message)
                break
            except KubeError as exc:
                if exc.status == 404:
                    break
                if exc.status != 409 or attempt:
                    failed.append(f"{describe(current)}: {exc.message}")
                    break
            meta = current["metadata"]
            current = kube.get(kind_of(dict(current)), meta["name"], meta.get("namespace"))
    return failed
