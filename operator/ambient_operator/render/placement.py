"""Where each DaemonSet runs: node requirements, tolerations, selector and affinity.

OS, architecture and build pinning are decided here and nowhere else, so no
template can forget them. The rendered selection is built to pick exactly
the nodes the verdicts assign to a platform, including nodes that lack a
label the selection would normally use (their facts came from nodeInfo).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, Toleration
from ambient_operator.cluster import scheduling
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.render.model import PLATFORM_LINUX

LINUX_ARCHES = ("amd64", "arm64")
WINDOWS_ARCHES = ("amd64",)

# Together these tolerate every taint: an agent missing from a node breaks
# that node's pods, which is worse than running where others may not.
STANDARD_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"effect": "NoSchedule", "operator": "Exists"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"effect": "NoExecute", "operator": "Exists"},
)
WINDOWS_TOLERATION: dict[str, str] = {
    "key": "os",
    "operator": "Equal",
    "value": "windows",
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class Requirement:
    """A label requirement every node of a platform must meet (key In values)."""

    key: str
    values: tuple[str, ...]

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels meet it."""
        return labels.get(self.key) in self.values

    def expression(self) -> dict[str, Any]:
        """The requirement as a node-selector expression."""
        return {"key": self.key, "operator": "In", "values": list(self.values)}


def _user_requirements(selector: Mapping[str, str] | None) -> list[Requirement]:
    return [Requirement(k, (v,)) for k, v in sorted((selector or {}).items())]


def linux_requirements(spec: AmbientMeshSpec) -> list[Requirement]:
    """Label requirements of the Linux DaemonSets."""
    return [
        Requirement(c.LABEL_OS, ("linux",)),
        Requirement(c.LABEL_ARCH, LINUX_ARCHES),
        *_user_requirements(spec.platforms.linux.node_selector),
    ]


def windows_requirements(spec: AmbientMeshSpec, build: str) -> list[Requirement]:
    """Label requirements of the DaemonSets of one Windows build."""
    return [
        Requirement(c.LABEL_OS, ("windows",)),
        Requirement(c.LABEL_ARCH, WINDOWS_ARCHES),
        Requirement(c.LABEL_WINDOWS_BUILD, (build,)),
        *_user_requirements(spec.platforms.windows.node_selector),
    ]


def _dump(tolerations: Sequence[Toleration]) -> list[dict[str, Any]]:
    return [t.model_dump(by_alias=True, exclude_none=True) for t in tolerations]


def _with(tolerations: list[dict[str, Any]], extra: dict[str, str]) -> list[dict[str, Any]]:
    if extra in tolerations:
        return tolerations
    return [*tolerations, extra]


def tolerations(spec: AmbientMeshSpec, platform: str) -> list[dict[str, Any]]:
    """Tolerations of both agents of a platform ("linux" or a Windows build).

    User tolerations replace the standard set; the standard set tolerates
    everything, so the only reason to set them is to keep agents off nodes.
    """
    if platform == PLATFORM_LINUX:
        user = spec.platforms.linux.tolerations
        if user is None:
            return [dict(t) for t in STANDARD_TOLERATIONS]
        # istio-cni uses the host network, so the DaemonSet controller lets
        # it onto nodes whose network is not ready yet; ztunnel must follow,
        # because a node with only one agent of the pair breaks its pods.
        return _with(_dump(user), dict(scheduling.HOST_NETWORK_DAEMON_TOLERATION))
    user = spec.platforms.windows.tolerations
    base = [dict(t) for t in STANDARD_TOLERATIONS] if user is None else _dump(user)
    # Windows nodes of mixed clusters commonly carry this taint to keep Linux
    # workloads off; the Windows agents always tolerate it.
    return _with(base, dict(WINDOWS_TOLERATION))


def effective_tolerations(spec: AmbientMeshSpec, platform: str) -> list[Mapping[str, Any]]:
    """What a daemon pod of the platform tolerates once the DaemonSet controller adds its own."""
    return scheduling.daemon_pod_tolerations(
        {"tolerations": tolerations(spec, platform), "hostNetwork": True}
    )


@dataclass(frozen=True)
class Placement:
    """nodeSelector and required node affinity of one DaemonSet's pods."""

    node_selector: dict[str, str]
    affinity: dict[str, Any] | None


def placement(requirements: Sequence[Requirement], nodes: Sequence[NodeFacts]) -> Placement:
    """Selection that admits every given node and nothing else that lacks the requirements.

    Single-valued requirements every intended node meets by label go into
    nodeSelector; the rest become the first affinity term. Intended nodes
    that miss a label get a term of their own by name, ORed with the first
    (the API server takes one name per field requirement, hence a term each).
    """
    unlabeled: list[str] = []
    missing: set[Requirement] = set()
    for node in nodes:
        failed = [r for r in requirements if not r.holds(node.labels)]
        if failed:
            unlabeled.append(node.name)
            missing.update(failed)
    unlabeled.sort()
    selector: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    for req in requirements:
        if len(req.values) == 1 and req.key not in selector and req not in missing:
            selector[req.key] = req.values[0]
        else:
            expressions.append(req.expression())
    if not expressions:
        return Placement(selector, None)
    terms: list[dict[str, Any]] = [{"matchExpressions": expressions}]
    terms.extend(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
        for name in unlabeled
    )
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    return Placement(selector, affinity)
