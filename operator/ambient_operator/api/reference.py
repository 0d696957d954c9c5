"""docs/ambientmesh-reference.md, generated from the same models as the CRD.

The structure, types and constraints come from the CRD schema (what the API
server enforces); defaults come from the models (what the operator applies
when it reads the object). `hack/gen_reference.py` writes the file and a
test fails when it drifts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api import crdgen
from ambient_operator.api.types import (
    IMAGE_PATTERN,
    PERCENT_OR_INT_PATTERN,
    QUANTITY_PATTERN,
    REPOSITORY_PATTERN,
    TAG_PATTERN,
)
from ambient_operator.api.v1alpha1 import DEFAULT_WHEN_UNSET, AmbientMeshSpec

# Long regular expressions read better by name; the CRD has them verbatim.
_PATTERN_NAMES = {
    IMAGE_PATTERN: "an image reference (`registry/path[:tag][@sha256:digest]`)",
    REPOSITORY_PATTERN: "an image repository (`registry/path`)",
    TAG_PATTERN: "an image tag",
    QUANTITY_PATTERN: "a non-negative quantity (`100m`, `512Mi`, `2`)",
    PERCENT_OR_INT_PATTERN: "a count or a percentage (`1`, `10%`)",
}
HEADER = """\
<!-- Generated from the pydantic models by `hack/gen_reference.py`; do not edit. -->
# AmbientMesh reference

`{group}/{version}`, kind `{kind}`, cluster-scoped, short name `{short}`.
There is one per cluster and it must be named `{name}`. Fields left out take
the default shown; defaults are applied by the operator when it reads the
object, not stored, so an upgrade of the operator can change them. The API
server checks every constraint below when the object is written.

```sh
kubectl get ambientmesh            # READY, DEGRADED, AGENTS, LINUX, WINDOWS, UNSUPPORTED
kubectl explain ambientmesh.spec   # the same descriptions, from the CRD
```
"""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _prose(text: str) -> str:
    """Model descriptions are plain text: `<revision>` must not read as HTML."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" and "properties" in schema


def _type(schema: Mapping[str, Any], path: str) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if _is_object(schema):
        return f"[object](#{_anchor(path)})"
    kind = str(schema.get("type", "any"))
    if kind == "array":
        items = schema.get("items") or {}
        inner = f"[object](#{_anchor(path + '[]')})" if _is_object(items) else _type(items, path)
        return f"list of {inner}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return f"map of string to {_type(schema['additionalProperties'], path)}"
    return kind


def _constraints(schema: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    if "enum" in schema:
        out.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    pattern = schema.get("pattern")
    if pattern:
        out.append(_PATTERN_NAMES.get(pattern, f"matches `{pattern}`"))
    for key, word in (
        ("minimum", "at least"),
        ("maximum", "at most"),
        ("maxLength", "at most {} characters"),
        ("maxItems", "at most {} items"),
        ("maxProperties", "at most {} entries"),
    ):
        if key in schema:
            out.append(word.format(schema[key]) if "{}" in word else f"{word} {schema[key]}")
    if schema.get("format") == "date-time":
        out.append("RFC 3339 time")
    for rule in schema.get("x-kubernetes-validations") or []:
        out.append(str(rule.get("message") or rule["rule"]))
    items = schema.get("items")
    if isinstance(items, Mapping) and not _is_object(items):
        out += [f"each: {text}" for text in _constraints(items)]
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping):
        out += [f"each value: {text}" for text in _constraints(values)]
    return out


def _anchor(path: str) -> str:
    return path.replace(".", "").replace("[]", "").lower()


def _default(defaults: Any, name: str, schema: Mapping[str, Any]) -> str:
    if not isinstance(defaults, Mapping) or name not in defaults or _is_object(schema):
        return ""
    value = defaults[name]
    if value is None:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value, separators=(', ', ': '))}`"


def _sections(
    schema: Mapping[str, Any], path: str, defaults: Any, read_only: bool
) -> Iterator[str]:
    lines = [f"## `{path}`", ""]
    description = schema.get("description")
    if description:
        lines += [_escape(_prose(str(description))), ""]
    for rule in schema.get("x-kubernetes-validations") or []:
        lines += [f"Rule: {rule.get('message') or rule['rule']}", ""]
    columns = (
        ["Field", "Type", "Description"]
        if read_only
        else ["Field", "Type", "Default", "Description"]
    )
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    nested: list[tuple[Mapping[str, Any], str, Any]] = []
    for name, sub in (schema.get("properties") or {}).items():
        sub_path = f"{path}.{name}"
        constraints = _constraints(sub)
        text = " ".join(
            part
            for part in (
                _prose(str(sub.get("description") or "")),
                f"Constraints: {'; '.join(constraints)}." if constraints else "",
            )
            if part
        )
        cells = [f"`{name}`", _type(sub, sub_path)]
        if not read_only:
            # A field that follows something else when unset has no fixed default to show.
            follows = DEFAULT_WHEN_UNSET.get(sub_path)
            cells.append(follows if follows is not None else _default(defaults, name, sub))
        cells.append(_escape(text))
        lines.append("| " + " | ".join(cells) + " |")
        child_defaults = defaults.get(name) if isinstance(defaults, Mapping) else None
        if _is_object(sub):
            nested.append((sub, sub_path, child_defaults))
        elif sub.get("type") == "array" and _is_object(sub.get("items") or {}):
            nested.append((sub["items"], f"{sub_path}[]", None))
    yield "\n".join(lines) + "\n"
    for sub, sub_path, child_defaults in nested:
        yield from _sections(sub, sub_path, child_defaults, read_only)


def reference_markdown() -> str:
    """The whole reference page."""
    version = crdgen.ambientmesh_crd()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    defaults = AmbientMeshSpec().model_dump(by_alias=True, mode="json")
    parts = [
        HEADER.format(
            group=c.API_GROUP,
            version=c.API_VERSION,
            kind=c.KIND,
            short=c.SHORT_NAMES[0],
            name=c.MESH_NAME,
        )
    ]
    parts += list(_sections(root["spec"], "spec", defaults, read_only=False))
    parts.append(
        "# Status\n\nWritten by the operator only (the status subresource). "
        "[troubleshooting.md](troubleshooting.md) explains every condition reason.\n"
    )
    parts += list(_sections(root["status"], "status", None, read_only=True))
    columns = version["additionalPrinterColumns"]
    rows = [
        f"| {col['name'].upper()} | `{col['jsonPath']}` | {_escape(col.get('description', ''))} |"
        for col in columns
    ]
    parts.append(
        "# `kubectl get` columns\n\n| Column | From | Meaning |\n|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    return "\n".join(parts)
