"""Prometheus metrics of the operator (served by `ambient-operator run --metrics-port`)."""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "ambient_operator_reconcile_total", "Reconciles run, by controller.", ["controller"]
)
DATAPLANE_PASSES = Counter(
    "ambient_operator_dataplane_passes_total",
    "Data-plane passes by kind: full (render, apply, status), or status (only the status "
    "built again, when only pods or our objects' status changed since the last full pass).",
    ["kind"],
)
LOOP_PASSES = Counter(
    "ambient_operator_loop_passes_total",
    "Passes begun by each reconcile loop; keyed: a keyed change (a Gateway, a namespace's "
    "labels, a node's platform) woke it, and it skipped the spacing under churn.",
    ["loop", "keyed"],
)
RECONCILE_ERRORS = Counter(
    "ambient_operator_reconcile_errors_total",
    "Reconciles that ended in an error, by controller and reason.",
    ["controller", "reason"],
)
RECONCILE_SECONDS = Histogram(
    "ambient_operator_reconcile_duration_seconds",
    "Time a reconcile took, by controller.",
    ["controller"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
OBJECTS_APPLIED = Counter(
    "ambient_operator_objects_applied_total", "Objects written with server-side apply.", ["kind"]
)
OBJECTS_PRUNED = Counter(
    "ambient_operator_objects_pruned_total", "Objects deleted because no longer desired.", ["kind"]
)
API_REQUESTS = Counter(
    "ambient_operator_api_requests_total",
    "API requests made by the operator's own client (kopf's watches excluded; "
    "method WATCH counts the connections of its own pod informer).",
    ["method", "code"],
)
API_WRITES = Counter(
    "ambient_operator_api_writes_total", "Successful write requests, by HTTP method.", ["method"]
)
ENROLLED_NAMESPACES = Gauge(
    "ambient_operator_enrolled_namespaces", "Namespaces labelled istio.io/dataplane-mode=ambient."
)
PODS = Gauge(
    "ambient_operator_enrolled_pods",
    "Enrolled pods by OS and ambient.istio.io/redirection state.",
    ["os", "redirection"],
)
NODES = Gauge(
    "ambient_operator_nodes",
    "Nodes by OS, Windows build and whether the data plane supports them.",
    ["os", "build", "supported"],
)
WATCH_LISTS = Counter(
    "ambient_operator_watch_lists_total",
    "Complete lists of a watched kind, by kind: the first, then one after each "
    "expired watch (410), and one when a kind comes to be served or stops being served.",
    ["kind"],
)
CACHE_GHOSTS = Counter(
    "ambient_operator_cache_ghosts_total",
    "Cached objects forgotten because a list no longer held them, or a read found "
    "them gone: deleted while no watch reported it, by kind.",
    ["kind"],
)


def forgotten_ghost(kind: str, key: str) -> None:
    """Log and count a cached object forgotten because it was deleted unseen."""
    logging.getLogger("ambient_operator.watches").info(
        "forgetting %s %s: deleted while not watched", kind, key
    )
    CACHE_GHOSTS.labels(kind=kind).inc()


EVENTS_POSTED = Counter(
    "ambient_operator_events_total",
    "Kubernetes Events posted, by type and reason.",
    ["type", "reason"],
)


def serve(port: int) -> None:
    """Serve /metrics on all interfaces at `port` (0 disables)."""
    if port:
        start_http_server(port)


WEBHOOK_REVIEWS = Counter(
    "ambient_operator_webhook_reviews_total",
    "Pod admission reviews the redirection-wait webhook answered, by action and reason.",
    ["action", "reason"],
)
WEBHOOK_BAD_REVIEWS = Counter(
    "ambient_operator_webhook_bad_reviews_total",
    "Admission requests the redirection-wait webhook could not read, by reason: answered 4xx "
    "(BodyTooLarge, UnsupportedMediaType, NotJSON, TooDeep, NotAdmissionReview, NoUID), or "
    "allowed unchanged with a warning when they named a uid (MalformedRequest, MalformedPod).",
    ["reason"],
)
WEBHOOK_SECONDS = Histogram(
    "ambient_operator_webhook_decision_seconds",
    "Time the redirection-wait webhook handler took to decide and build its patch.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)
WEBHOOK_REQUEST_SECONDS = Histogram(
    "ambient_operator_webhook_request_seconds",
    "Time from receiving an admission review to answering it (kopf's pipeline included).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
WEBHOOK_MISSES = Counter(
    "ambient_operator_webhook_misses_total",
    "Windows pods found admitted without the redirection-wait init container they need "
    "(each pod counted once per operator process).",
)
WEBHOOK_MISSED_PODS = Gauge(
    "ambient_operator_webhook_missed_pods",
    "Live pods that lack the redirection-wait init container they need.",
)
