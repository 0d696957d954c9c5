"""What the waypoint modules share: constants, the Gateway key, pure helpers.

The modules import these by name, so a test that patches one patches it in
the module that reads it. The own loop's timings are in controller.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.kube.resources import KINDS, Kind

# One logger for the package, named as the module it was split from.
log = logging.getLogger(__name__.rpartition(".")[0])
METRICS_NAME = "waypoints"
GATEWAY = KINDS[(c.GATEWAY_API_VERSION, "Gateway")]
GATEWAY_CLASS = KINDS[(c.GATEWAY_API_VERSION, "GatewayClass")]
CONFIG_MAP = KINDS[("v1", "ConfigMap")]
SERVICE_ACCOUNT = KINDS[("v1", "ServiceAccount")]
NAMESPACE = KINDS[("v1", "Namespace")]
AUTOSCALER = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
DISRUPTION_BUDGET = KINDS[("policy/v1", "PodDisruptionBudget")]
# Gateways reconciled at once; each makes a few API calls from a thread.
CONCURRENCY = 16
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
STATUS_ATTEMPTS = 3
GATEWAY_API_RECHECK_SECONDS = 30.0

GatewayKey = tuple[str, str]
# Whether an object of a kind exists under (namespace, name) as the watches
# see it; None when they cannot tell (app/watches.Watches.seen).
Seen = Callable[[Kind, GatewayKey], bool | None]


def unseen(_kind: Kind, _key: GatewayKey) -> bool | None:
    """A `Seen` that cannot tell: every name is asked for before a write."""
    return None


def placement_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(Gateway name, node) of a scheduled Gateway pod (any class), else None. Pure."""
    gateway = ((pod.get("metadata") or {}).get("labels") or {}).get(c.LABEL_GATEWAY_NAME)
    node = (pod.get("spec") or {}).get("nodeName")
    return (str(gateway), str(node)) if gateway and node else None


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _key(obj: Mapping[str, Any]) -> GatewayKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
