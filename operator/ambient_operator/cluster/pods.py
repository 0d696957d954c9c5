"""What the operator keeps of each pod, and who is told.

Several parts of the operator follow pods: enrollment counts (a PodSummary
in the cluster state) and consumers the wiring adds (the webhook's misses,
the waypoint controller). One informer (kube/informer.py) reads the pod
stream for all of them; each consumer's `extract` takes what it needs from a
pod on the informer's thread, and `PodFeed` hands the results over on the
event loop. This module knows no consumer: the wiring passes them in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.cluster.state import ClusterState, PodSummary
from ambient_operator.kube.client import Kube
from ambient_operator.kube.informer import Change, Informer
from ambient_operator.kube.resources import KINDS

POD = KINDS[("v1", "Pod")]
PodKey = tuple[str, str]


@dataclass(frozen=True)
class PodConsumer:
    """A part of the operator that keeps something of each pod.

    `extract` is pure and runs on the informer's thread; `remember` runs on the
    event loop with the key and what `extract` kept (None when the pod is gone).
    """

    extract: Callable[[Mapping[str, Any]], Any]
    remember: Callable[[PodKey, Any], None]


@dataclass(frozen=True)
class PodRecord:
    """Everything the operator keeps of one pod: its summary, then one item per consumer."""

    summary: PodSummary
    kept: tuple[Any, ...]


class PodFeed:
    """Applies pod changes to the state and to each consumer, on the event loop."""

    def __init__(self, state: ClusterState, consumers: Sequence[PodConsumer]) -> None:
        self.state = state
        self.consumers = tuple(consumers)

    def record_of(self, pod: Mapping[str, Any]) -> PodRecord:
        """Take from a whole pod what the operator keeps. Pure."""
        return PodRecord(PodSummary.of(pod), tuple(c.extract(pod) for c in self.consumers))

    def apply(self, changes: list[Change[PodRecord]]) -> None:
        """One batch from the informer."""
        pods, tally = self.state.pods, self.state.tally
        changed = agents = False
        for change in changes:
            record = None if change.type == "DELETED" else change.record
            old = pods.get(change.key)
            if record is None:
                if old is not None:
                    del pods[change.key]
                    tally.pod(change.key, None)
                    changed, agents = True, agents or old.agent is not None
            elif old != record.summary:
                pods[change.key] = record.summary
                tally.pod(change.key, record.summary)
                changed = True
                agents = agents or record.summary.agent is not None
                agents = agents or (old is not None and old.agent is not None)
            for i, consumer in enumerate(self.consumers):
                consumer.remember(change.key, record.kept[i] if record else None)
        if changed:
            # Pods only move status along: not urgent. Our agents' pods also
            # decide which nodes' readiness taints go (controllers/
            # node_readiness.py), a write: a full pass.
            self.state.poke(urgent=False, status=not agents)

    def informer(self, kube: Kube, loop: asyncio.AbstractEventLoop) -> Informer[PodRecord]:
        """An informer over every pod of the cluster feeding this."""
        # A deleted pod's last state would only be dropped here: none is made.
        return Informer(kube, POD, self.record_of, self.apply, loop, last_states=False)
