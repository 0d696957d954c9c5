"""Settings of the webhook and the MutatingWebhookConfiguration the operator keeps.

kopf can manage a webhook configuration itself, but it always writes
timeoutSeconds 30, no namespaceSelector and no reinvocationPolicy; this one
must never stall pod creation and must only see enrolled pods, so the
operator renders it here and applies it through the one apply layer while
kopf only serves the requests.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ambient_operator.api import constants as c
from ambient_operator.webhook.decide import ANNOTATION

CONFIG_NAME = "ambient-operator"
SECRET_NAME = "ambient-operator-webhook-tls"
# kopf routes `POST /<handler id>` to the handler of that id.
HANDLER_ID = "redirection-wait"
WEBHOOK_SUFFIX = "redirection-wait.ambientoperator.io"
# Short: a healthy answer takes milliseconds, and a hung server must not hold
# every pod creation in enrolled namespaces for long (failurePolicy Ignore
# admits the pod when time runs out).
TIMEOUT_SECONDS = 3
DEFAULT_PORT = 9443
DEFAULT_SERVICE_PORT = 443
_SERVICE = re.compile(r"^([a-z0-9-]+)/([a-z0-9-]+)(?::([0-9]{1,5}))?$")


@dataclass(frozen=True)
class WebhookOptions:
    """How the webhook is served and how the API server reaches it."""

    url: str | None = None  # https://host:port[/prefix]
    service: str | None = None  # namespace/name[:port]
    listen_address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    cert_dir: str | None = None  # tls.crt, tls.key, ca.crt from elsewhere
    secret_namespace: str | None = None  # default: the AmbientMesh's namespace
    sync_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.url and self.service:
            raise ValueError("give --webhook-url or --webhook-service, not both")
        if self.url:
            parts = urlsplit(self.url)
            if parts.scheme != "https" or not parts.hostname:
                raise ValueError(f"--webhook-url {self.url!r}: must be https://host[:port][/path]")
            if parts.query or parts.fragment:
                raise ValueError(f"--webhook-url {self.url!r}: no query or fragment allowed")
        if self.service and not _SERVICE.match(self.service):
            raise ValueError(f"--webhook-service {self.service!r}: must be namespace/name[:port]")

    @property
    def enabled(self) -> bool:
        """The webhook is served only when the API server is told how to reach it."""
        return bool(self.url or self.service)

    def client_config(self, ca_bundle: bytes) -> dict[str, Any]:
        """The clientConfig of each webhook entry."""
        config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
        if self.url:
            config["url"] = f"{self.url.rstrip('/')}/{HANDLER_ID}"
            return config
        match = _SERVICE.match(self.service or "")
        if match is None:
            raise ValueError("no webhook URL or Service configured")
        namespace, name, port = match.groups()
        config["service"] = {
            "namespace": namespace,
            "name": name,
            "port": int(port or DEFAULT_SERVICE_PORT),
            "path": f"/{HANDLER_ID}",
        }
        return config

    def hosts(self, cluster_domain: str = "cluster.local") -> list[str]:
        """Names the serving certificate must carry for the API server to accept it."""
        if self.url:
            return [str(urlsplit(self.url).hostname)]
        match = _SERVICE.match(self.service or "")
        if match is None:
            return []
        namespace, name, _ = match.groups()
        return [
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.{cluster_domain}",
            f"{name}.{namespace}",
            name,
        ]


def _entry(
    name: str, client_config: dict[str, Any], namespaces: dict[str, Any], objects: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": namespaces,
        "objectSelector": objects,
        # Server-side filters: these pods are never mutated, so the API
        # server need not call us for them at all.
        "matchConditions": [
            {
                "name": "not-host-network",
                "expression": "!has(object.spec.hostNetwork) || !object.spec.hostNetwork",
            },
            {
                "name": "not-opted-out",
                "expression": "!has(object.metadata.annotations) || "
                f"!('{ANNOTATION}' in object.metadata.annotations) || "
                f"object.metadata.annotations['{ANNOTATION}'].lowerAscii() != 'false'",
            },
        ],
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        # A later webhook (say, one adding its own init container) gets us
        # called again, so ours can stay first; we never add it twice.
        "reinvocationPolicy": "IfNeeded",
    }


def webhook_configuration(client_config: dict[str, Any]) -> dict[str, Any]:
    """The MutatingWebhookConfiguration: enrolled pods only, never blocking.

    Two entries follow the enrollment rule: a pod in an ambient namespace
    that is not `none`, or a pod labelled ambient in any other namespace.
    """
    mode = c.LABEL_DATAPLANE_MODE
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG_NAME},
        "webhooks": [
            _entry(
                f"namespace.{WEBHOOK_SUFFIX}",
                client_config,
                {"matchLabels": {mode: "ambient"}},
                {"matchExpressions": [{"key": mode, "operator": "NotIn", "values": ["none"]}]},
            ),
            _entry(
                f"pod.{WEBHOOK_SUFFIX}",
                client_config,
                {"matchExpressions": [{"key": mode, "operator": "NotIn", "values": ["ambient"]}]},
                {"matchLabels": {mode: "ambient"}},
            ),
        ],
    }
