"""spec.networkPolicy, rendered: a policy per agent that selects its Linux pods only.

Upstream's charts (global.networkPolicy.enabled) render one NetworkPolicy per
agent; tests/test_helm_values.py holds ours to theirs field by field. Here:
which of our DaemonSets' pods each policy selects (read from the rendered pod
templates with NetworkPolicy's matchLabels rule), and when none is rendered.
Expected values are literal.
"""

from __future__ import annotations

from typing import Any

import pytest

from ambient_operator.render import RenderResult
from test_render import MIXED, WS2022, render, windows


def policies(result: RenderResult) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in result.objects if o["kind"] == "NetworkPolicy"}


def selected(result: RenderResult, policy: dict[str, Any]) -> set[str]:
    """The DaemonSets whose pods the policy's podSelector matches, in its own namespace."""
    wanted = policy["spec"]["podSelector"]["matchLabels"].items()
    return {
        ds["metadata"]["name"]
        for ds in result.objects
        if ds["kind"] == "DaemonSet"
        and ds["metadata"]["namespace"] == policy["metadata"]["namespace"]
        and wanted <= ds["spec"]["template"]["metadata"]["labels"].items()
    }


def test_each_policy_selects_its_agents_linux_pods_only() -> None:
    result = render(MIXED, {"networkPolicy": {"enabled": True}})
    found = policies(result)
    assert sorted(found) == ["istio-cni", "ztunnel"]
    assert selected(result, found["ztunnel"]) == {"ztunnel"}
    assert selected(result, found["istio-cni"]) == {"istio-cni-node"}
    # The Windows agents' pods carry upstream's selector labels too; ours leaves them out.
    windows_pods = [
        o["spec"]["template"]["metadata"]["labels"]
        for o in result.objects
        if o["kind"] == "DaemonSet" and "windows" in o["metadata"]["name"]
    ]
    assert len(windows_pods) == 4
    assert all(labels.get("app") == "ztunnel" or "k8s-app" in labels for labels in windows_pods)


def test_policies_follow_the_agents_namespace() -> None:
    spec = {"namespace": "mesh-agents", "networkPolicy": {"enabled": True}}
    found = policies(render(MIXED, spec))
    assert {p["metadata"]["namespace"] for p in found.values()} == {"mesh-agents"}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"networkPolicy": {"enabled": False}},
        # Windows agents alone: nothing a policy would act on.
        {"networkPolicy": {"enabled": True}, "platforms": {"linux": {"enabled": False}}},
    ],
    ids=["default", "disabled", "windows-only"],
)
def test_no_policy_unless_asked_for_and_a_linux_agent_runs(spec: dict[str, Any]) -> None:
    result = render((*MIXED, windows("w22b", WS2022)), spec)
    assert policies(result) == {}
    assert [o for o in result.objects if o["kind"] == "DaemonSet"]


def test_the_flag_is_a_strict_bool() -> None:
    with pytest.raises(ValueError, match=r"network_?[pP]olicy\.enabled"):
        render(MIXED, {"networkPolicy": {"enabled": "true"}})
