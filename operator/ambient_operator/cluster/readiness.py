"""Node readiness gating: which nodes may lose their readiness taint. Pure.

A node carrying the taint (matched by key and effect, any value) is released
once one ztunnel and one istio-cni pod of ours, in the agents' namespace and
on that node, are both Ready: pods scheduled on it from then on are
redirected from their first packet. Upstream's untaint controller (in
istiod) waits for istio-cni alone and only on Linux; ztunnel not yet serving
means the same bypass (istio/istio#61490). Nodes that get no agent keep the
taint: they never become ready for the mesh, and the status already names
them as unsupported or excluded.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.cluster.facts import Taint
from ambient_operator.cluster.state import AGENTS, PodSummary

MAX_EXAMPLES = 5


def taints_of(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """spec.taints of a Node as the API server holds it ([] when it has none)."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [dict(t) for t in taints if isinstance(t, Mapping)]


def carries(node: Mapping[str, Any], key: str, effect: str) -> bool:
    """Whether the node has a taint of this key and effect (any value)."""
    return any((t.key, t.effect) == (key, effect) for t in map(Taint.from_dict, taints_of(node)))


@dataclass(frozen=True)
class Gate:
    """The nodes to release now, and the tainted nodes still waiting for their agents."""

    release: tuple[str, ...]
    waiting: tuple[str, ...]

    def examples(self) -> list[str]:
        """A few waiting nodes, by name, for the status."""
        return list(self.waiting[:MAX_EXAMPLES])


def judge(
    nodes: Mapping[str, Mapping[str, Any]],
    served: Collection[str],
    pods: Iterable[PodSummary],
    namespace: str,
    key: str,
    effect: str,
) -> Gate:
    """Which tainted nodes to release and which still wait, both in name order.

    `served` are the nodes the render gives agents; `namespace` is where the
    agents run (spec.namespace).
    """
    ready: dict[str, set[str]] = {}
    for pod in pods:
        if pod.ready and pod.agent and pod.node and pod.namespace == namespace:
            ready.setdefault(pod.node, set()).add(pod.agent)
    release: list[str] = []
    waiting: list[str] = []
    for name in sorted(nodes):
        if name not in served or not carries(nodes[name], key, effect):
            continue
        if ready.get(name, set()) >= set(AGENTS):
            release.append(name)
        else:
            waiting.append(name)
    return Gate(tuple(release), tuple(waiting))
