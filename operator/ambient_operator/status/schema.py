"""Whether the installed AmbientMesh CRD knows every field this operator reads and writes. Pure.

`helm upgrade` never updates a chart's `crds/`, so after an operator upgrade
the API server can still serve the old schema. Then a field the user sets
that the old schema lacks is pruned on write (clients that ask for no strict
validation, the Python client among them, are told nothing), and the
operator's own status, written by server-side apply, is refused whole
("field not declared in schema"). :func:`crd_problem` says so in Degraded,
with the command that fixes it; :func:`pruned` cuts a status down to what
the installed schema declares, so that the condition saying so can be
written at all.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshReason, Problem
from ambient_operator.api.crdgen import ambientmesh_crd

# What fixes it, as docs/upgrades.md gives it (the chart's copy is the same).
FIX = "kubectl apply --server-side --force-conflicts -f crds/ (the CRDs of this operator's release)"
SHOWN = 10
_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def served_schema(crd: Mapping[str, Any] | None, version: str = c.API_VERSION) -> Any:
    """The openAPIV3Schema a CRD serves `version` with, or None."""
    for entry in ((crd or {}).get("spec") or {}).get("versions") or []:
        if isinstance(entry, Mapping) and entry.get("name") == version:
            return ((entry.get("schema") or {}).get("openAPIV3Schema")) or None
    return None


@functools.cache
def _ours() -> Any:
    return served_schema(ambientmesh_crd())


def unknown_fields(ours: Any, installed: Any, path: str = "") -> list[str]:
    """Paths of fields `ours` declares that `installed` does not (nor keeps as unknown)."""
    if not isinstance(ours, Mapping) or not isinstance(installed, Mapping):
        return []
    if installed.get(_PRESERVE):
        return []
    out: list[str] = []
    theirs = installed.get("properties") or {}
    for name, sub in (ours.get("properties") or {}).items():
        where = f"{path}.{name}" if path else str(name)
        if name not in theirs:
            out.append(where)
            continue
        out += unknown_fields(sub, theirs[name], where)
    if isinstance(ours.get("items"), Mapping):
        out += unknown_fields(ours["items"], installed.get("items"), f"{path}[]")
    if isinstance(ours.get("additionalProperties"), Mapping):
        out += unknown_fields(
            ours["additionalProperties"], installed.get("additionalProperties"), f"{path}.*"
        )
    return out


def crd_problem(crd: Mapping[str, Any] | None) -> Problem | None:
    """CrdOutdated when the installed CRD lacks fields this operator knows; None otherwise.

    None too when the CRD cannot be read (no watch answer yet): that is not
    evidence of an old schema.
    """
    installed = served_schema(crd)
    if installed is None:
        return None
    missing = [p for p in unknown_fields(_ours(), installed) if p.startswith(("spec.", "status."))]
    if not missing:
        return None
    shown = ", ".join(missing[:SHOWN]) + (
        f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    )
    return Problem(
        MeshReason.CRD_OUTDATED,
        f"the installed AmbientMesh CRD is older than this operator: it lacks {shown}. The "
        "API server drops those fields from what is written (a client that asks for no strict "
        "validation is not told), so the operator may not see what you set. helm upgrade "
        f"never updates a chart's CRDs: apply this release's with {FIX}",
    )


def pruned(value: Any, schema: Any) -> Any:
    """`value` without what `schema` does not declare (a status the old schema can take)."""
    if not isinstance(schema, Mapping) or schema.get(_PRESERVE):
        return value
    if isinstance(value, Mapping):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if isinstance(props, Mapping):
            return {k: pruned(v, props[k]) for k, v in value.items() if k in props}
        if isinstance(extra, Mapping):
            return {k: pruned(v, extra) for k, v in value.items()}
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [pruned(item, schema["items"]) for item in value]
    return value


def status_for(crd: Mapping[str, Any] | None, status: Mapping[str, Any]) -> Mapping[str, Any]:
    """`status` as the installed CRD can take it (unchanged when its schema is unknown)."""
    installed = served_schema(crd)
    if installed is None:
        return status
    schema = (installed.get("properties") or {}).get("status")
    out = pruned(status, schema)
    return out if isinstance(out, Mapping) else status
