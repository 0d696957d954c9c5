"""Reading API objects as they come: any field may be missing or of the wrong type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata, or an empty mapping."""
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def spec_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """An object's spec, or an empty mapping (also for no object)."""
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, Mapping) else {}


def str_map(value: Any) -> dict[str, str]:
    """A label or annotation map as strings; anything but a mapping is empty."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}
