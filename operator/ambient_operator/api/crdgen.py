"""Turn the pydantic models into a CustomResourceDefinition.

The models are the single source: this module only translates JSON Schema
into the structural OpenAPI subset the API server accepts (no $ref, no
anyOf for optionals, no titles, no `additionalProperties: false`).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshCondition
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, AmbientMeshStatus

_DROP = {"title", "default", "$defs"}


def _key_rule(names: dict[str, Any]) -> dict[str, str]:
    """The CEL rule that says what a map's propertyNames schema says of its keys."""
    if "enum" in names:
        allowed = ", ".join(f"'{name}'" for name in names["enum"])
        return {
            "rule": f"self.all(k, k in [{allowed}])",
            "message": f"keys must be one of {allowed}",
        }
    checks, said = [], []
    if "pattern" in names:
        # CEL string literals take the pattern's backslashes as escapes: double them.
        pattern = names["pattern"].replace("\\", "\\\\")
        checks.append(f"k.matches('{pattern}')")
        said.append(f"match {names['pattern']}")
    if "maxLength" in names:
        checks.append(f"size(k) <= {names['maxLength']}")
        said.append(f"be at most {names['maxLength']} characters")
    if not checks:
        raise ValueError(f"propertyNames {names} has no rule the CRD can state")
    return {
        "rule": f"self.all(k, {' && '.join(checks)})",
        "message": f"keys must {' and '.join(said)}",
    }


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        # `X | None` is an optional field in the API, not a nullable value.
        kept = [branch for branch in any_of if branch != {"type": "null"}]
        if len(kept) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return _resolve({**kept[0], **rest}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields instead
        if key == "propertyNames":
            # CRD schemas have no propertyNames; say the same thing in CEL.
            rules = out.setdefault("x-kubernetes-validations", [])
            rules.append(_key_rule(_resolve(value, defs)))
            continue
        if key == "patternProperties":
            # Structural schemas have no patternProperties: one value schema for
            # every key, and the key pattern in CEL.
            if len(value) != 1:
                raise ValueError(f"patternProperties {sorted(value)}: one pattern only")
            ((pattern, sub),) = value.items()
            out["additionalProperties"] = _resolve(sub, defs)
            out.setdefault("x-kubernetes-validations", []).append(_key_rule({"pattern": pattern}))
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {name: _resolve(sub, defs) for name, sub in value.items()}
            continue
        out[key] = _resolve(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Structural OpenAPI v3 schema of a model, as a CRD wants it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _resolve(raw, defs)
    schema.setdefault("type", "object")
    return schema


def _printer_columns() -> list[dict[str, Any]]:
    def cond(kind: str) -> str:
        return f'.status.conditions[?(@.type=="{kind}")].status'

    return [
        {"name": "Ready", "type": "string", "jsonPath": cond(MeshCondition.READY)},
        {"name": "Degraded", "type": "string", "jsonPath": cond(MeshCondition.DEGRADED)},
        {
            "name": "Agents",
            "type": "string",
            "jsonPath": ".status.readyComponents",
            "description": "DaemonSets with every pod updated and ready / all DaemonSets",
        },
        {"name": "Linux", "type": "integer", "jsonPath": ".status.nodes.linux"},
        {"name": "Windows", "type": "integer", "jsonPath": ".status.nodes.windows"},
        {"name": "Unsupported", "type": "integer", "jsonPath": ".status.nodes.unsupported"},
        {
            "name": "Platform",
            "type": "string",
            "jsonPath": ".status.platform.name",
            "description": "The platform the agents are rendered for (status.platform)",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def ambientmesh_crd() -> dict[str, Any]:
    """The AmbientMesh CustomResourceDefinition, generated from the models."""
    root = {
        "type": "object",
        "description": "The Istio ambient data plane of a cluster mixing Linux and Windows nodes.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(AmbientMeshSpec),
            "status": openapi_schema(AmbientMeshStatus),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name == '{c.MESH_NAME}'",
                "message": f"metadata.name: there is one AmbientMesh per cluster, named "
                f"'{c.MESH_NAME}'",
                "reason": "FieldValueInvalid",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{c.PLURAL}.{c.API_GROUP}",
            "labels": {c.LABEL_PART_OF: c.PART_OF},
        },
        "spec": {
            "group": c.API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": c.KIND,
                "listKind": f"{c.KIND}List",
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
                "categories": ["istio-ambient"],
            },
            "versions": [
                {
                    "name": c.API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def all_crds() -> dict[str, dict[str, Any]]:
    """Every CRD we ship, keyed by the file name it is written to."""
    return {"ambientoperator.io_ambientmeshes.yaml": ambientmesh_crd()}


def dump(obj: dict[str, Any]) -> str:
    """YAML text of a CRD, stable across runs."""
    header = "# Generated from the pydantic models by `ambient-operator crd`; do not edit.\n"
    return header + yaml.safe_dump(obj, sort_keys=False, width=100)
