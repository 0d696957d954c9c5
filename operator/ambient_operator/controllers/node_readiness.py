"""Node readiness gating (opt-in): release a node's taint once both of its agents are Ready.

The judgement is cluster/readiness.py's; the one write, apply/writer.py's
`remove_taint`. This module runs them in a data-plane pass and says what
came of it: the status block (nodes still waiting, with examples) and a
Degraded problem when the API server refused a removal.
"""

from __future__ import annotations

import asyncio
import logging

from ambient_operator.api.conditions import MeshReason, Problem
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, NodeReadinessStatus
from ambient_operator.apply.writer import remove_taint
from ambient_operator.cluster.readiness import MAX_EXAMPLES, judge
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import resource_version
from ambient_operator.render import RenderResult

log = logging.getLogger(__name__)


class NodeReadinessGate:
    """Removes the readiness taint of nodes whose ztunnel and istio-cni are Ready."""

    def __init__(self, state: ClusterState, kube: Kube) -> None:
        self.state = state
        self.kube = kube
        # Node -> resourceVersion our removal produced. Until the watch brings
        # that version to the cache, the cache still shows the taint: no
        # second patch (it could only fail its test) for what is done.
        self._sent: dict[str, int] = {}

    async def reconcile(
        self, spec: AmbientMeshSpec, result: RenderResult
    ) -> tuple[NodeReadinessStatus | None, list[Problem]]:
        """One pass: release what is ready; the status block (None when disabled) and problems."""
        gating = spec.node_readiness
        if not gating.enabled:
            return None, []
        key, effect = gating.taint.key, gating.taint.effect
        served = {v.node for v in result.verdicts if v.supported}
        gate = judge(
            self.state.nodes, served, self.state.pods.values(), spec.namespace, key, effect
        )
        refused: dict[tuple[bool, str], list[str]] = {}
        for name in gate.release:
            node = self.state.nodes.get(name)
            if node is None:
                continue
            if resource_version(node) < self._sent.get(name, 0):
                continue
            try:
                live = await asyncio.to_thread(remove_taint, self.kube, node, key, effect)
            except KubeError as exc:
                # A 422 is the patch's test failing: the taints changed since our
                # cache saw them; the watch brings the new ones and the next pass
                # judges again. Anything else is told in Degraded as well.
                log.warning("node %s: taint %s:%s not removed: %s", name, key, effect, exc)
                if exc.status != 422:
                    refused.setdefault((exc.status == 403, exc.message), []).append(name)
                continue
            if live is not None:
                self._sent[name] = resource_version(live)
                log.info("node %s: both agents Ready; removed taint %s:%s", name, key, effect)
        self._sent = {n: v for n, v in self._sent.items() if n in self.state.nodes}
        still = [*gate.waiting, *(n for names in refused.values() for n in names)]
        status = NodeReadinessStatus(
            taint=f"{key}:{effect}",
            waiting=len(still),
            example_waiting_nodes=sorted(still)[:MAX_EXAMPLES],
        )
        problems = [
            Problem(
                MeshReason.NODE_TAINT_NOT_REMOVED,
                f"taint {key}:{effect} not removed from {len(names)} node(s) whose agents are "
                f"Ready ({', '.join(names[:MAX_EXAMPLES])}): {cause}. "
                + (
                    "Set the chart value nodeReadiness.enabled=true, which grants the operator "
                    "patch on Nodes, or turn spec.nodeReadiness.enabled off"
                    if forbidden
                    else "Retried on every pass"
                ),
            )
            for (forbidden, cause), names in refused.items()
        ]
        return status, problems
