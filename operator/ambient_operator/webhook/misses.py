"""Pods the webhook should have mutated but did not see (it was down, or timed out).

failurePolicy Ignore keeps pod creation going when the webhook cannot
answer; this is the other half of that bargain: such pods are found from the
pod watch, counted, shown in the AmbientMesh status and told about with a
Warning Event on the pod. "Should have" is the webhook's own `decide` on the
stored pod; a pod that carries our container or our annotation was seen.

A pod the webhook withheld the init container from because its image is
known not to exist (ImageUnavailable) is such a pod too, told apart: its
Event and its status count say why, and what to build and set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import bundled, metrics
from ambient_operator.api.conditions import AdmissionReason, PodEvent
from ambient_operator.cluster.facts import node_os
from ambient_operator.cluster.state import SIDECAR_STATUS_ANNOTATION, ClusterState
from ambient_operator.render.values import MULTI_BUILD_IMAGE_FIELD
from ambient_operator.status.events import EventRecorder
from ambient_operator.webhook import decide as d

log = logging.getLogger(__name__)
PodKey = tuple[str, str]


def _trim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What `decide` reads, and the identity an Event needs; pods stay small in memory."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    kept_spec = {
        k: spec[k]
        for k in (
            "os",
            "nodeSelector",
            "tolerations",
            "nodeName",
            "runtimeClassName",
            "hostNetwork",
        )
        if k in spec
    }
    if required is not None:
        kept_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    kept_spec["initContainers"] = [
        {"name": ct.get("name")} for ct in spec.get("initContainers") or []
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k in (d.ANNOTATION, SIDECAR_STATUS_ANNOTATION)
            },
        },
        "spec": kept_spec,
    }


def off_windows(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> bool:
    """The pod is bound to a node known not to run Windows: it needs no workaround.

    Most pods of a cluster are bound to Linux nodes; kept as suspects, each
    cost memory and a decision on every pass (at 50,000 pods, most of a
    pass). A node's OS does not change, so the answer holds for good.
    """
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = nodes.get(str(node_name)) if node_name else None
    return node is not None and node_os(node) not in (None, "windows")


def suspect_of(
    pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any] | None:
    """What to keep of a live pod the webhook may have missed; None when it cannot be.

    Pure; `nodes` (by name) rule out pods bound to non-Windows nodes.
    """
    phase = (pod.get("status") or {}).get("phase")
    if (
        phase in ("Succeeded", "Failed")
        or d.has_container(pod)
        or (d.has_annotation(pod) and not d.withheld(pod))
        or not d.may_target_windows(pod)
        or (nodes is not None and off_windows(pod, nodes))
    ):
        return None
    return _trim(pod)


@dataclass(frozen=True)
class Miss:
    """One pod admitted without the init container it needed."""

    pod: dict[str, Any]
    decision: d.Decision

    @property
    def image_unavailable(self) -> bool:
        """Left without it because its image was unavailable, not because nobody answered."""
        return self.decision.action == "withheld" or d.withheld(self.pod)

    def message(self) -> str:
        """Event text; stable for a pod, so the recorder tells it once."""
        where = f"build {self.decision.build}" if self.decision.build else "pre-WS2025 nodes"
        if self.image_unavailable:
            return (
                f"admitted without the {d.CONTAINER_NAME} init container although it can run "
                f"on {where} ({AdmissionReason.IMAGE_UNAVAILABLE}): no {bundled.REDIRECTION_WAIT} "
                f"image is known ({MULTI_BUILD_IMAGE_FIELD} and {bundled.REGISTRY_FIELD} are "
                "unset, or name a placeholder), and the webhook hands no pod an image that "
                "cannot be pulled. Its containers may start before istio-cni redirects its "
                "traffic, which then bypasses ztunnel. Run "
                f"`{bundled.BUILD_COMMAND}` (docs/images.md), set {bundled.REGISTRY_FIELD} to "
                "that registry, then delete the pod to have it recreated with the workaround."
            )
        return (
            f"admitted without the {d.CONTAINER_NAME} init container although it can run on "
            f"{where} ({self.decision.reason}); the webhook did not answer, e.g. while the "
            "operator was down. Its containers may start before istio-cni redirects its "
            "traffic, which then bypasses ztunnel. Delete the pod to have it recreated "
            "with the workaround."
        )


def _counted(found: Mapping[PodKey, Miss]) -> tuple[int, int]:
    """What status.enrollment says of the misses: all of them, and those for want of an image."""
    return len(found), sum(1 for m in found.values() if m.image_unavailable)


# New misses told with an Event per pass. The pass awaits each post: a
# cluster joined with thousands of Windows pods admitted before the webhook
# (measured: 1,500 at 10,000 pods, bench/growth.py) held the loop for as many
# requests, and a label flipped meanwhile went unanswered. The count is in
# status at once; the Events follow over later passes.
EVENTS_PER_PASS = 20


class MissTracker:
    """Fed by the pod watch; judged by the reconcile loop."""

    def __init__(
        self,
        state: ClusterState,
        events: EventRecorder,
        context: Callable[[], d.Context],
        report: Callable[[int, int], None],
    ) -> None:
        self.state = state
        self.events = events
        self.context = context
        self.report = report
        # Pods that lack both our container and our annotation and might be
        # Windows pods; most are not, and `check` drops them by decision.
        self.suspects: dict[PodKey, dict[str, Any]] = {}
        self.missed: dict[PodKey, Miss] = {}
        self._counted: set[str] = set()

    def suspect_of(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """`suspect_of` with the node cache (run on the pod informer's thread: a lookup)."""
        return suspect_of(pod, self.state.nodes)

    def remember(self, key: PodKey, suspect: dict[str, Any] | None) -> None:
        """Record what `suspect_of` said of a pod (None also for a deleted one)."""
        if suspect is None:
            self.suspects.pop(key, None)
        else:
            self.suspects[key] = suspect

    def observe(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """Record one pod watch event."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self.remember(key, None if event_type == "DELETED" else self.suspect_of(pod))

    def judge(self) -> dict[PodKey, Miss]:
        """The current misses, by the webhook's decision on today's facts."""
        found: dict[PodKey, Miss] = {}
        # Pods seen before their node: bound elsewhere than Windows, they go for good.
        nodes = self.state.nodes
        for key in [k for k, pod in self.suspects.items() if off_windows(pod, nodes)]:
            del self.suspects[key]
        if not self.suspects:
            # No context to build: at 5,000 nodes building it (every node
            # judged for the mesh) was most of a pass's CPU under pod churn
            # (py-spy, bench/growth.py at L), and heartbeats make it new each time.
            return found
        ctx = self.context()
        for key, pod in self.suspects.items():
            ns = self.state.namespaces.get(key[0])
            if ns is None:
                continue  # not seen yet: judged on a later pass
            decision = d.decide(pod, ns.get("labels") or {}, ctx)
            if decision.action in ("inject", "withheld"):
                found[key] = Miss(pod, decision)
        return found

    def _report(self, found: Mapping[PodKey, Miss]) -> None:
        self.report(*_counted(found))

    def count(self) -> None:
        """Report the current number of misses (no API call)."""
        self._report(self.judge())

    async def check(self) -> None:
        """Count, report and tell about misses (EVENTS_PER_PASS new ones at most).

        Pokes the loop when the count changes, and, less urgently, when
        misses are left to tell.
        """
        found = self.judge()
        changed = _counted(found) != _counted(self.missed)
        self.missed = found
        metrics.WEBHOOK_MISSED_PODS.set(len(found))
        self._report(found)
        told, more = 0, False
        for miss in found.values():
            uid = str(miss.pod["metadata"].get("uid") or "")
            if uid in self._counted:
                continue
            if told == EVENTS_PER_PASS:
                more = True
                break
            told += 1
            self._counted.add(uid)
            metrics.WEBHOOK_MISSES.inc()
            meta = miss.pod["metadata"]
            reason = (
                PodEvent.REDIRECTION_WAIT_IMAGE_UNAVAILABLE
                if miss.image_unavailable
                else PodEvent.REDIRECTION_WAIT_MISSING
            )
            log.warning(
                "pod %s/%s was admitted without the redirection-wait init container (%s)",
                meta.get("namespace"),
                meta.get("name"),
                reason,
            )
            await asyncio.to_thread(self.events.post, miss.pod, "Warning", reason, miss.message())
        live = {str(m.pod["metadata"].get("uid") or "") for m in found.values()}
        self._counted &= live  # forget pods that are gone
        if changed:
            # The status shows the count on the next pass, status-only or full.
            self.state.poke(status=True)
        elif more:
            # The rest on a later pass, spaced out like any status churn.
            self.state.poke(urgent=False, status=True)
