"""status.windows (status/windows.py): the Windows data plane's reported limits, each with
its source, and the nodes past the per-node pod limit (issue 43, item 5). Literal cases."""

from __future__ import annotations

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.status.windows import pod_limit_message, windows_status

SPEC = AmbientMeshSpec()


def _spec(limit: int) -> AmbientMeshSpec:
    return AmbientMeshSpec.model_validate(
        {"platforms": {"windows": {"enrolledPodsPerNodeLimit": limit}}}
    )


def test_no_windows_node_no_status() -> None:
    assert windows_status(SPEC, [], {"win-1": 40}) is None


def test_each_limit_names_its_source() -> None:
    status = windows_status(SPEC, ["win-1"], {})
    assert status is not None
    sources = ["istio/ztunnel#1608", "microsoft/hcsshim#2571", "IPV6_ENABLED=false", "#1584"]
    assert [[s for s in sources if s in limit] for limit in status.limits] == [
        ["istio/ztunnel#1608", "microsoft/hcsshim#2571"],
        ["microsoft/hcsshim#2571"],
        ["IPV6_ENABLED=false"],
        ["#1584"],
    ]
    assert status.limits[0].startswith("enrollment on Windows is not fail-closed")
    assert "TCP and IPv4 only" in status.limits[2] and "amd64 only" in status.limits[3]


def test_the_default_limit_is_15_and_only_more_than_it_counts() -> None:
    pods = {"win-a": 15, "win-b": 16, "win-c": 40, "linux-1": 99}
    status = windows_status(SPEC, ["win-c", "win-b", "win-a"], pods)
    assert status is not None
    assert (status.pod_limit, status.nodes_over_pod_limit) == (15, 2)
    assert status.example_nodes_over_pod_limit == [
        "win-b: 16 enrolled pods",
        "win-c: 40 enrolled pods",
    ]
    message = pod_limit_message(status)
    assert message is not None
    assert message.startswith(
        "2 Windows node(s) hold more than 15 enrolled pods (win-b: 16 enrolled pods; "
        "win-c: 40 enrolled pods): "
    )
    assert "microsoft/hcsshim#2571" in message
    assert "spec.platforms.windows.enrolledPodsPerNodeLimit" in message


def test_under_the_limit_no_warning() -> None:
    status = windows_status(_spec(3), ["win-a"], {"win-a": 3})
    assert status is not None and status.nodes_over_pod_limit == 0
    assert status.example_nodes_over_pod_limit == []
    assert pod_limit_message(status) is None


def test_more_nodes_than_shown() -> None:
    nodes = [f"win-{i}" for i in range(7)]
    status = windows_status(_spec(1), nodes, dict.fromkeys(nodes, 2))
    assert status is not None and status.nodes_over_pod_limit == 7
    assert len(status.example_nodes_over_pod_limit) == 5
    assert " and 2 more): " in (pod_limit_message(status) or "")
