"""Where pods run: the one place that pins pod templates to an OS.

Agents are pinned per OS and Windows build (node requirements, tolerations,
selector and affinity of each DaemonSet), waypoints to Linux (`pin_linux`,
for their Deployment and for istiod's istio-waypoint class defaults), and
`pod_os` names the OS of a pinned template for its `spec.os.name`. OS,
architecture and build pinning are decided here and nowhere else, so no
template can forget them or disagree with its own pin. The agents' selection
is built to pick exactly the nodes the verdicts assign to a platform,
including nodes that lack a label the selection would normally use (their
facts came from nodeInfo).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, NodeSelectorTerm, Toleration
from ambient_operator.cluster import scheduling
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.render.model import PLATFORM_LINUX

LINUX_ARCHES = ("amd64", "arm64")
WINDOWS_ARCHES = ("amd64",)
POD_OSES = ("linux", "windows")
# Node labels that name a node's OS (the second is deprecated but still set).
_OS_KEYS = (c.LABEL_OS, "beta.kubernetes.io/os")
# Node labels that can only ever select Windows nodes.
_WINDOWS_ONLY_PREFIX = "node.kubernetes.io/windows-"

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

    def missed_by(self, node: NodeFacts) -> bool:
        """Whether the node's labels do not meet it."""
        return node.labels.get(self.key) not in self.values

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

    @property
    def os(self) -> str:
        """The OS these pods are pinned to, for the template's spec.os.name."""
        return pod_os(self.node_selector, self.affinity)


def placement(
    requirements: Sequence[Requirement],
    missing: Collection[Requirement],
    unlabeled: Sequence[str],
) -> Placement:
    """Selection that admits every intended node and nothing else that lacks the requirements.

    `missing`: the requirements some intended node misses by label
    (`Requirement.missed_by`); `unlabeled`: those nodes' names, in order.
    Single-valued requirements every intended node meets by label go into
    nodeSelector; the rest become the first affinity term. Intended nodes
    that miss a label get a term of their own by name, ORed with the first
    (the API server takes one name per field requirement, hence a term each).
    """
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


def user_affinity(terms: Sequence[NodeSelectorTerm] | None) -> dict[str, Any] | None:
    """The spec's node affinity terms as a pod's affinity, for matching nodes against it."""
    if not terms:
        return None
    dumped = [t.model_dump(by_alias=True, exclude_none=True) for t in terms]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": dumped}
        }
    }


def with_node_affinity(where: Placement, terms: Sequence[NodeSelectorTerm] | None) -> Placement:
    """The placement narrowed to nodes that also match one of the spec's terms.

    Terms are ORed, so each of ours is joined with each of the user's: our
    pins (architecture, nodes by name) hold in every term, and `pod_os` still
    finds the OS in the first one.
    """
    user = user_affinity(terms)
    if user is None:
        return where
    theirs = user["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    ours = (
        where.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        if where.affinity
        else [{}]
    )
    joined = [
        {
            **({"matchFields": mine["matchFields"]} if "matchFields" in mine else {}),
            "matchExpressions": [*mine.get("matchExpressions", []), *term["matchExpressions"]],
        }
        for mine in ours
        for term in theirs
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": joined}
        }
    }
    return Placement(where.node_selector, affinity)


def pod_os(node_selector: Mapping[str, str], affinity: Mapping[str, Any] | None = None) -> str:
    """The OS a pod template's pin names, for its `spec.os.name`.

    The pin is `nodeSelector["kubernetes.io/os"]` or, where `placement`
    moved it because some intended node lacks the label, the single-valued
    OS expression of the first affinity term (the other terms pick nodes by
    name). A template without a pin gets no guessed OS: ValueError.
    """
    named = node_selector.get(c.LABEL_OS)
    if named is None and affinity is not None:
        required = affinity.get("nodeAffinity", {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", {}
        )
        terms = required.get("nodeSelectorTerms") or [{}]
        for expression in terms[0].get("matchExpressions", []):
            values = expression.get("values", [])
            if (
                expression.get("key") == c.LABEL_OS
                and expression.get("operator") == "In"
                and len(values) == 1
            ):
                named = values[0]
    if named not in POD_OSES:
        raise ValueError(f"the pod template does not pin one OS (kubernetes.io/os is {named!r})")
    return str(named)


def pin_linux(
    node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, str], list[dict[str, Any]], tuple[str, ...]]:
    """Scheduling that can only pick Linux nodes, and what had to go to get it.

    Envoy has no Windows build: whatever the user asks, the OS label is
    `linux`, Windows-only node labels are dropped, and tolerations of the
    Windows node taint are dropped (they could only matter on Windows nodes).
    Waypoint Deployments and istiod's istio-waypoint class defaults use it.
    """
    dropped: list[str] = []
    selector: dict[str, str] = {}
    # `dropped` names keys only: the values may come from a ConfigMap, and
    # they end up in an Event.
    for key, value in sorted(node_selector.items()):
        if key in _OS_KEYS:
            if value != "linux":
                dropped.append(f"nodeSelector {key} (not linux)")
            elif key != c.LABEL_OS:
                selector[key] = value  # the deprecated label, but it agrees
            continue
        if key.startswith(_WINDOWS_ONLY_PREFIX):
            dropped.append(f"nodeSelector {key}")
            continue
        selector[key] = value
    selector[c.LABEL_OS] = "linux"
    kept: list[dict[str, Any]] = []
    for toleration in tolerations:
        if toleration.get("key") in ("os", *_OS_KEYS) and toleration.get("value") == "windows":
            dropped.append(f"toleration {toleration.get('key')}=windows")
            continue
        kept.append(dict(toleration))
    return selector, kept, tuple(dropped)
