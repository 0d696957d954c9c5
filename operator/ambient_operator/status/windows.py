"""status.windows: what the Windows data plane does not promise, and nodes past its pod
limit. Pure.

Each limit names its source, so that a user can follow it and tell when it
no longer holds (docs/windows-support.md has the same list).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ambient_operator.api.v1alpha1 import AmbientMeshSpec, WindowsStatus

# The limits as reported upstream; checked against each source (issue 43).
NOT_FAIL_CLOSED = (
    "enrollment on Windows is not fail-closed: ztunnel acknowledges a new pod to istio-cni "
    "before its listeners exist and sets them up on a retry (istio/ztunnel#1608), and a pod "
    "whose HNS L4WFPPROXY policy failed to apply, although the HNS call succeeded, reaches "
    "the network without ztunnel and without an error (microsoft/hcsshim#2571)"
)
POD_LIMIT = (
    "the HNS L4WFPPROXY policy was reported to fail beyond about 15 pods per node "
    "(microsoft/hcsshim#2571, on AKS Windows Server 2022): nodesOverPodLimit counts the "
    "Windows nodes with more enrolled pods than spec.platforms.windows."
    "enrolledPodsPerNodeLimit"
)
TCP_IPV4 = (
    "Windows redirection is TCP and IPv4 only: the L4WFPPROXY policy istio-cni writes "
    "filters TCP, and ztunnel on Windows runs with IPV6_ENABLED=false; UDP and IPv6 traffic "
    "of an enrolled Windows pod is not redirected"
)
AMD64_ONLY = (
    "Windows agents are amd64 only: ztunnel is not built for Windows on arm64 (istio/ztunnel#1584)"
)
LIMITS = (NOT_FAIL_CLOSED, POD_LIMIT, TCP_IPV4, AMD64_ONLY)
EXAMPLES = 5


def windows_status(
    spec: AmbientMeshSpec, windows_nodes: Iterable[str], pods_by_node: Mapping[str, int]
) -> WindowsStatus | None:
    """status.windows, or None when no Windows node runs the agents.

    `windows_nodes` are the nodes the render gives Windows agents;
    `pods_by_node` the enrolled Windows pods on each node (cluster/enrollment.py).
    """
    served = set(windows_nodes)
    if not served:
        return None
    limit = spec.platforms.windows.enrolled_pods_per_node_limit
    # Every status pass asks: only the nodes with pods are walked, not every
    # Windows node, and only those over the limit are sorted.
    over = sorted(
        (node, count) for node, count in pods_by_node.items() if count > limit and node in served
    )
    return WindowsStatus(
        limits=list(LIMITS),
        pod_limit=limit,
        nodes_over_pod_limit=len(over),
        example_nodes_over_pod_limit=[
            f"{node}: {count} enrolled pods" for node, count in over[:EXAMPLES]
        ],
    )


def pod_limit_message(status: WindowsStatus) -> str | None:
    """The Warning Event's message while Windows nodes are past the pod limit, or None."""
    if not status.nodes_over_pod_limit:
        return None
    shown = "; ".join(status.example_nodes_over_pod_limit)
    more = status.nodes_over_pod_limit - len(status.example_nodes_over_pod_limit)
    return (
        f"{status.nodes_over_pod_limit} Windows node(s) hold more than "
        f"{status.pod_limit} enrolled pods ({shown}{f' and {more} more' if more > 0 else ''}): "
        "the HNS L4WFPPROXY policy that redirects each pod was reported to fail beyond about "
        "15 pods per node (microsoft/hcsshim#2571), and a pod whose policy failed bypasses "
        "ztunnel without an error. Spread the enrolled pods over more Windows nodes (a lower "
        "maxPods, or topology spread), or raise spec.platforms.windows."
        "enrolledPodsPerNodeLimit once your nodes are known to hold more"
    )
