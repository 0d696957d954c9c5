"""An API server kept in a dict, for in-process passes that count their own work.

Only what a data-plane pass asks of `kube/client.Kube` with nothing in its
way: create, apply, the status subresource, get and delete, each object with
a uid and a growing resourceVersion. No admission, no controllers, no field
ownership: tests of what the API server does use the real one (conftest).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from ambient_operator.kube.client import KubeError
from ambient_operator.kube.resources import Kind, key_of


class MemoryKube:
    """Objects by key; every write returns the object as stored."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self._versions = itertools.count(1000)

    def _store(self, obj: Mapping[str, Any], verb: str) -> dict[str, Any]:
        out = copy.deepcopy(dict(obj))
        meta = out.setdefault("metadata", {})
        key = key_of(out)
        held = self.objects.get(key)
        meta["uid"] = (held or {}).get("metadata", {}).get("uid") or f"uid-{meta['name']}"
        meta["resourceVersion"] = str(next(self._versions))
        meta["generation"] = int((held or {}).get("metadata", {}).get("generation", 0)) + 1
        self.objects[key] = out
        self.writes.append((verb, out["kind"], meta["name"]))
        return copy.deepcopy(out)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST: 409 when the name is taken."""
        if key_of(dict(obj)) in self.objects:
            raise KubeError(409, "AlreadyExists", f"{obj['metadata']['name']} exists")
        return self._store(obj, "create")

    def apply(self, obj: Mapping[str, Any], *, force: bool = True, **_: Any) -> dict[str, Any]:
        """Server-side apply, as a replace of all but the status; a resourceVersion in `obj`
        is a precondition (a creation carries one that nothing has)."""
        held = self.objects.get(key_of(dict(obj))) or {}
        wanted = obj["metadata"].get("resourceVersion")
        if wanted and held and held["metadata"]["resourceVersion"] != wanted:
            raise KubeError(409, "Conflict", f"{obj['metadata']['name']} was modified")
        out = {**dict(obj), **({"status": held["status"]} if "status" in held else {})}
        return self._store(out, "apply")

    def apply_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The status subresource: only the status changes."""
        held = self.objects.get(key_of(dict(obj)))
        if held is None:
            raise KubeError(404, "NotFound", f"{obj['metadata']['name']} not found")
        out = copy.deepcopy(held)
        out["status"] = copy.deepcopy(dict(obj["status"]))
        out["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key_of(out)] = out
        self.writes.append(("status", out["kind"], out["metadata"]["name"]))
        return copy.deepcopy(out)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """An object somebody else made (the test's AmbientMesh)."""
        return self._store(obj, "put")

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object of that kind and name, or None."""
        for key, obj in self.objects.items():
            if key[1] == kind.kind and key[2] == (namespace or "") and key[3] == name:
                return copy.deepcopy(obj)
        return None

    def delete(
        self, kind: Kind, name: str, namespace: str | None = None, uid: str | None = None
    ) -> bool:
        """DELETE by name (and uid)."""
        for key in list(self.objects):
            if key[1] == kind.kind and key[2] == (namespace or "") and key[3] == name:
                del self.objects[key]
                self.writes.append(("delete", kind.kind, name))
                return True
        return False
