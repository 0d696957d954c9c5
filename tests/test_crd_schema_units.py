"""An installed AmbientMesh CRD older than the operator is told, and status fits it (offline).

Literal schemas, and the operator's own CRD with fields taken out as an
older release's would lack them. The live run with the real helm is
tests/test_crd_upgrade.py.
"""

from __future__ import annotations

import copy
from typing import Any

from ambient_operator.api.conditions import MeshReason
from ambient_operator.api.crdgen import ambientmesh_crd
from ambient_operator.status.schema import crd_problem, pruned, status_for, unknown_fields

OLD = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "conditions": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"type": {"type": "string"}}},
                }
            },
        },
    },
}


def older(*paths: tuple[str, ...]) -> dict[str, Any]:
    """The operator's CRD without the fields at `paths` (as an older release lacks them)."""
    crd = copy.deepcopy(ambientmesh_crd())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path in paths:
        node = schema
        for part in path[:-1]:
            node = node["properties"][part]
        del node["properties"][path[-1]]
    return crd


def test_fields_the_installed_schema_lacks_are_named_by_path() -> None:
    ours = copy.deepcopy(OLD)
    ours["properties"]["spec"]["properties"]["adopt"] = {
        "type": "object",
        "properties": {"helmReleases": {"type": "array", "items": {"type": "string"}}},
    }
    conditions = ours["properties"]["status"]["properties"]["conditions"]
    conditions["items"]["properties"]["reason"] = {"type": "string"}
    assert unknown_fields(ours, OLD) == ["spec.adopt", "status.conditions[].reason"]
    assert unknown_fields(OLD, OLD) == []
    # A schema that keeps unknown fields lacks none.
    assert unknown_fields(ours, {"x-kubernetes-preserve-unknown-fields": True}) == []


def test_a_status_is_cut_to_what_the_old_schema_declares() -> None:
    status = {
        "conditions": [{"type": "Degraded", "reason": "CrdOutdated"}],
        "adoption": {"taken": []},
    }
    assert pruned(status, OLD["properties"]["status"]) == {"conditions": [{"type": "Degraded"}]}
    labels = {"namespace": "x", "labels": {"a": "1"}, "adopt": {}}
    assert pruned(labels, OLD["properties"]["spec"]) == {"namespace": "x", "labels": {"a": "1"}}


def test_the_operators_own_crd_is_not_outdated() -> None:
    assert crd_problem(ambientmesh_crd()) is None
    assert crd_problem(None) is None  # not read yet: no evidence
    assert status_for(None, {"anything": 1}) == {"anything": 1}


def test_an_older_crd_is_outdated_naming_the_fields_and_the_fix() -> None:
    problem = crd_problem(older(("spec", "adopt"), ("status", "adoption")))
    assert problem is not None
    assert problem.reason == MeshReason.CRD_OUTDATED
    assert "it lacks spec.adopt, status.adoption." in problem.message
    assert problem.message.endswith(
        "apply this release's with kubectl apply --server-side --force-conflicts -f crds/ "
        "(the CRDs of this operator's release)"
    )
    status = {"adoption": {"taken": []}, "conditions": []}
    assert status_for(older(("status", "adoption")), status) == {"conditions": []}
