"""Which pods the ambient data plane is meant to redirect, and whether it does.

Rules from istio.io: a pod is enrolled when its own `istio.io/dataplane-mode`
is `ambient`, or its namespace's is and the pod's is not `none`; a pod with a
sidecar is not redirected by ztunnel (sidecar wins); host-network pods never
are. istio-cni reports the result in `ambient.istio.io/redirection`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import NamespaceEvent
from ambient_operator.api.v1alpha1 import Enrollment, PodCounts
from ambient_operator.cluster.state import PodSummary

VALID_MODES = ("ambient", "none")
SIDECAR_NAMESPACE_LABELS = ("istio-injection", "istio.io/rev")
MAX_EXAMPLES = 5


def namespace_enrolled(labels: Mapping[str, str]) -> bool:
    """The namespace asks for ambient."""
    return labels.get(c.LABEL_DATAPLANE_MODE) == "ambient"


def namespace_sidecar(labels: Mapping[str, str]) -> bool:
    """The namespace asks for sidecar injection."""
    return labels.get("istio-injection") == "enabled" or "istio.io/rev" in labels


def pod_enrolled(pod: PodSummary, namespace_labels: Mapping[str, str]) -> bool:
    """Whether ztunnel is meant to redirect this pod."""
    if pod.host_network or pod.sidecar:
        return False
    if pod.mode == "ambient":
        return True
    return namespace_enrolled(namespace_labels) and pod.mode != "none"


def pod_os(pod: PodSummary, node_os: Mapping[str, str]) -> str:
    """'windows' or 'linux' (the default of Kubernetes itself)."""
    if pod.os:
        return pod.os
    if pod.node and pod.node in node_os:
        return node_os[pod.node]
    return "linux"


def redirection_state(pod: PodSummary) -> str:
    """enabled, pending or missing."""
    if pod.redirection == "enabled":
        return "enabled"
    if pod.redirection == "pending":
        return "pending"
    return "missing"


def summarize(
    pods: Iterable[PodSummary],
    namespaces: Mapping[str, Mapping[str, Any]],
    node_os: Mapping[str, str],
    workaround_misses: int = 0,
) -> Enrollment:
    """Bounded totals of enrolled pods by OS and redirection state."""
    counts: dict[str, dict[str, int]] = {
        "linux": {"enabled": 0, "pending": 0, "missing": 0},
        "windows": {"enabled": 0, "pending": 0, "missing": 0},
    }
    examples: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.phase in ("Succeeded", "Failed"):
            continue
        labels = (namespaces.get(pod.namespace) or {}).get("labels") or {}
        if not pod_enrolled(pod, labels):
            continue
        os_name = "windows" if pod_os(pod, node_os) == "windows" else "linux"
        state = redirection_state(pod)
        counts[os_name][state] += 1
        if state != "enabled" and len(examples) < MAX_EXAMPLES:
            examples.append(f"{pod.namespace}/{pod.name}")
    enrolled_namespaces = sum(
        1 for ns in namespaces.values() if namespace_enrolled(ns.get("labels") or {})
    )
    return Enrollment(
        namespaces=enrolled_namespaces,
        linux_pods=PodCounts(**counts["linux"]),
        windows_pods=PodCounts(**counts["windows"]),
        example_pending_pods=examples,
        workaround_misses=workaround_misses,
    )


def namespace_problems(
    name: str,
    labels: Mapping[str, str],
    waypoint_exists: Mapping[tuple[str, str], bool],
) -> list[tuple[NamespaceEvent, str]]:
    """(reason, message) for each thing wrong with a namespace's ambient labels."""
    problems: list[tuple[NamespaceEvent, str]] = []
    mode = labels.get(c.LABEL_DATAPLANE_MODE)
    if mode is not None and mode not in VALID_MODES:
        problems.append(
            (
                NamespaceEvent.INVALID_DATAPLANE_MODE,
                f"{c.LABEL_DATAPLANE_MODE}={mode!r} is not valid; use 'ambient' or 'none'. "
                "Pods in this namespace are not enrolled.",
            )
        )
    if mode == "ambient" and namespace_sidecar(labels):
        problems.append(
            (
                NamespaceEvent.SIDECAR_AND_AMBIENT,
                "sidecar injection is also enabled on this namespace; injected pods keep "
                "their sidecar and are not redirected by ztunnel (sidecar wins)",
            )
        )
    waypoint = labels.get(c.LABEL_USE_WAYPOINT)
    if waypoint and waypoint != "none":
        target_ns = labels.get(c.LABEL_USE_WAYPOINT_NAMESPACE) or name
        found = waypoint_exists.get((target_ns, waypoint))
        if found is None:
            problems.append(
                (
                    NamespaceEvent.WAYPOINT_NOT_FOUND,
                    f"{c.LABEL_USE_WAYPOINT}={waypoint} names Gateway {target_ns}/{waypoint}, "
                    "which does not exist; traffic skips the waypoint",
                )
            )
        elif not found:
            problems.append(
                (
                    NamespaceEvent.NOT_A_WAYPOINT,
                    f"{c.LABEL_USE_WAYPOINT}={waypoint} names Gateway {target_ns}/{waypoint}, "
                    "which is not a waypoint (no HBONE listener on 15008); traffic skips it",
                )
            )
    return problems
