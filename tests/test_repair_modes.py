"""spec.istioCni.repairMode, rendered and refused: what istio-cni is told and granted.

Upstream's chart (repair.repairPods, deletePods, labelPods) is the reference
for each mode's ConfigMap keys and grants: tests/test_helm_values.py holds
ours to it through the real helm. Here, on literal data: the grants follow
the mode on Linux, Windows gets none of it, and a Delete mode the operator
was not told it may grant is refused with the fix for each way of installing.
The chart's side (the value that grants it, as the chart's ServiceAccount on
the real API server) is in tests/test_chart_rbac.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.controllers.dataplane import repair_refusal
from ambient_operator.render import RenderResult
from test_render import MIXED, render

POD_DELETE = ("", "pods", "delete")


def grants(result: RenderResult) -> set[tuple[str, str, str]]:
    role = [o for o in result.objects if o["kind"] == "ClusterRole"]
    assert [r["metadata"]["name"] for r in role] == ["istio-cni"]
    return {
        (group, resource, verb)
        for rule in role[0]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def config(result: RenderResult, name: str) -> dict[str, str]:
    (found,) = [o for o in result.objects if o["metadata"]["name"] == name]
    data: dict[str, str] = found["data"]
    return data


@pytest.mark.parametrize(
    ("istio_cni", "deletes", "settings"),
    [
        ({}, False, ("false", "false", "true")),
        ({"repairMode": "Delete"}, True, ("false", "true", "false")),
        ({"repairMode": "Label"}, False, ("true", "false", "false")),
        # Repair off: istio-cni deletes nothing, whatever the mode says.
        ({"repairMode": "Delete", "repair": False}, False, ("false", "true", "false")),
    ],
    ids=["default", "delete", "label", "delete-repair-off"],
)
def test_each_mode_sets_its_key_and_only_delete_grants_pod_delete(
    istio_cni: dict[str, Any], deletes: bool, settings: tuple[str, str, str]
) -> None:
    result = render(MIXED, {"istioCni": istio_cni})
    assert (POD_DELETE in grants(result)) is deletes
    linux = config(result, "istio-cni-config")
    keys = ("REPAIR_LABEL_PODS", "REPAIR_DELETE_PODS", "REPAIR_REPAIR_PODS")
    assert tuple(linux[k] for k in keys) == settings
    # Windows agents run no repair: none of its keys, repair off.
    for tag in ("ltsc2022", "ltsc2025"):
        windows = config(result, f"istio-cni-config-windows-{tag}")
        assert windows["REPAIR_ENABLED"] == "false"
        assert not set(keys) & set(windows)


def test_the_broken_pod_label_is_the_specs() -> None:
    label = {"key": "mesh.example.com/unredirected", "value": "repair-me"}
    linux = config(
        render(MIXED, {"istioCni": {"repairMode": "Label", "brokenPodLabel": label}}),
        "istio-cni-config",
    )
    assert (linux["REPAIR_BROKEN_POD_LABEL_KEY"], linux["REPAIR_BROKEN_POD_LABEL_VALUE"]) == (
        "mesh.example.com/unredirected",
        "repair-me",
    )


def _spec(istio_cni: dict[str, Any]) -> AmbientMeshSpec:
    return AmbientMeshSpec.model_validate({"istioCni": istio_cni})


@pytest.mark.parametrize(
    "istio_cni",
    [{}, {"repairMode": "Label"}, {"repairMode": "Delete", "repair": False}],
    ids=["repair", "label", "delete-repair-off"],
)
def test_only_delete_mode_needs_the_grant(istio_cni: dict[str, Any]) -> None:
    for by_chart in (True, False):
        assert repair_refusal(_spec(istio_cni), may_delete_pods=False, by_chart=by_chart) is None


def test_delete_mode_is_refused_with_the_fix_of_the_install() -> None:
    spec = _spec({"repairMode": "Delete"})
    assert repair_refusal(spec, may_delete_pods=True, by_chart=True) is None
    assert repair_refusal(spec, may_delete_pods=True, by_chart=False) is None
    chart = repair_refusal(spec, may_delete_pods=False, by_chart=True)
    assert chart is not None
    assert "--set istioCniRepair.deletePods=true" in chart
    assert "nothing was changed" in chart
    assert "set spec.istioCni.repairMode to Repair or Label" in chart
    standalone = repair_refusal(spec, may_delete_pods=False, by_chart=False)
    assert standalone is not None
    assert "grant the operator delete on pods" in standalone
    assert "istioCniRepair" not in standalone
