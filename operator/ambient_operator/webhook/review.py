"""The webhook's answer to one review, decided from a snapshot of the caches.

kopf's watches keep the caches (ClusterState and the RuntimeClasses here)
current from its own threads; `prime` fills them before the first request.
The decision context is rebuilt only when the mesh, a node or a
RuntimeClass changed, so a review costs a decision and a JSON patch.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ambient_operator.api import metrics
from ambient_operator.api.conditions import BadReviewReason, ErrorReason
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import Watched
from ambient_operator.kube.client import Kube
from ambient_operator.kube.resources import Kind, shown
from ambient_operator.webhook import decide as d
from ambient_operator.webhook import intake, server

log = logging.getLogger(__name__)
RUNTIME_CLASS = Kind("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False)


class Reviewer:
    """The decision half of the webhook: its caches, its decisions and its reviews."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        *,
        clock: Callable[[], float] = time.monotonic,
        default_registry: str | None = None,
    ) -> None:
        self.state = state
        self.kube = kube
        # The operator's --default-registry, for a mesh that names none.
        self.default_registry = default_registry
        # `clock` paces the log lines about bad reviews (one per reason per interval).
        self.limiter = intake.LogLimiter(clock=clock)
        self.runtime_classes: dict[str, dict[str, Any]] = {}
        self._rc_version = 0
        self._facts: dict[str, tuple[str, NodeFacts]] = {}
        self._context: tuple[Any, d.Context] | None = None
        # The server thread and the kopf loop both ask for the context.
        self._lock = threading.Lock()

    # -- the decision's view of the cluster --------------------------------
    def _node_facts(self, nodes: list[tuple[str, dict[str, Any]]]) -> tuple[NodeFacts, ...]:
        out = []
        for name, node in nodes:
            rv = str((node.get("metadata") or {}).get("resourceVersion", ""))
            cached = self._facts.get(name)
            if cached is None or cached[0] != rv:
                try:
                    cached = (rv, NodeFacts.from_node(node))
                except ValueError:
                    continue  # a malformed Node is the data plane's to report
                self._facts[name] = cached
            out.append(cached[1])
        for gone in set(self._facts) - {name for name, _ in nodes}:
            del self._facts[gone]
        return tuple(out)

    def context(self) -> d.Context:
        """The decision context, rebuilt only when the mesh, a node or a RuntimeClass changed."""
        # list() copies in one step under the GIL; kopf's handlers update the
        # caches from its executor threads while this one reads them.
        nodes = list(self.state.nodes.items())
        mesh = self.state.mesh
        meta = (mesh or {}).get("metadata") or {}
        key = (
            meta.get("uid"),
            meta.get("resourceVersion"),
            tuple(
                (name, (node.get("metadata") or {}).get("resourceVersion")) for name, node in nodes
            ),
            self._rc_version,
        )
        with self._lock:
            if self._context is not None and self._context[0] == key:
                return self._context[1]
            ctx = d.Context.build(
                mesh,
                self._node_facts(nodes),
                dict(self.runtime_classes),
                default_registry=self.default_registry,
            )
            self._context = (key, ctx)
            return ctx

    def namespace_labels(self, namespace: str | None) -> Mapping[str, str] | None:
        """Labels of a cached namespace; None when it is not in the cache (yet)."""
        ns = self.state.namespaces.get(namespace or "")
        return None if ns is None else (ns.get("labels") or {})

    def decide(self, pod: Mapping[str, Any], namespace: str | None) -> d.Decision | None:
        """The decision for one pod being created; None when deciding failed.

        Never raises: a failure here must not deny a pod, so it is logged and
        the pod goes through unchanged (and is then reported as a miss). The
        pod's shape has been checked (intake.pod_problem), so a failure is a
        bug of ours: its traceback is logged, once per interval.
        """
        started = time.perf_counter()
        try:
            decision = d.decide(pod, self.namespace_labels(namespace), self.context())
        except Exception:
            self.limiter.warning(
                log,
                BadReviewReason.DECISION_FAILED,
                "redirection-wait webhook failed; the pod is admitted unchanged",
                exc_info=True,
            )
            metrics.WEBHOOK_REVIEWS.labels(action="error", reason=ErrorReason.EXCEPTION).inc()
            return None
        finally:
            metrics.WEBHOOK_SECONDS.observe(time.perf_counter() - started)
        metrics.WEBHOOK_REVIEWS.labels(action=decision.action, reason=decision.reason).inc()
        return decision

    def _malformed(self, uid: str, reason: BadReviewReason, problem: str) -> dict[str, Any]:
        metrics.WEBHOOK_BAD_REVIEWS.labels(reason=reason).inc()
        self.limiter.warning(
            log,
            reason,
            f"redirection-wait webhook: review {shown(uid)}: {reason}: {problem}; "
            "the pod is admitted unchanged",
        )
        return server._unchanged(uid, reason, problem)

    def review(self, review: Mapping[str, Any]) -> dict[str, Any]:
        """The AdmissionReview response: always allowed, with our patch when the pod needs it.

        Raises intake.Refused when `review` is no review or names no uid.
        """
        request, uid = intake.request_of(review)
        problem = intake.request_problem(request)
        if problem:
            return self._malformed(uid, BadReviewReason.MALFORMED_REQUEST, problem)
        response: dict[str, Any] = {"uid": uid, "allowed": True}
        pod = request.get("object")
        if (
            request["operation"] == "CREATE"
            and request["resource"].get("resource") == "pods"
            and not request.get("subResource")
            and pod is not None
        ):
            problem = intake.pod_problem(pod)
            if problem:
                return self._malformed(uid, BadReviewReason.MALFORMED_POD, problem)
            namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
            decision = self.decide(pod, namespace)
            if decision is None:
                return server._unchanged(
                    uid, BadReviewReason.DECISION_FAILED, "the webhook failed to decide"
                )
            if decision.action != "none":
                ops = json.dumps(d.json_patch(pod, decision), separators=(",", ":"))
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(ops.encode()).decode("ascii")
        return {
            "apiVersion": intake.REVIEW_API_VERSION,
            "kind": "AdmissionReview",
            "response": response,
        }

    def runtime_class_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Keep the RuntimeClass scheduling cache current."""
        name = str((body.get("metadata") or {}).get("name") or "")
        old = self.runtime_classes.get(name)
        if event_type == "DELETED":
            self.runtime_classes.pop(name, None)
        else:
            self.runtime_classes[name] = dict(body.get("scheduling") or {})
        if old != self.runtime_classes.get(name):
            self._rc_version += 1

    def watches(self) -> list[Watched]:
        """The webhook's row of the watch table: RuntimeClasses, for their scheduling.

        Nodes and the AmbientMesh come from the cluster state's rows; all rows
        are listed before the server starts, so the first pods after a
        restart are never judged on empty caches.
        """
        return [Watched("webhook-runtimeclasses", RUNTIME_CLASS, self.runtime_class_event)]
