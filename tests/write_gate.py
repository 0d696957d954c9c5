"""A validating admission webhook that holds one user's writes at a chosen count.

The chaos test kills the operator between two of its writes. Aiming by the
audit log races the operator (a fast machine finishes the pass first); the
gate does not: the API server asks it about every write of the operator's
user, it answers at once until the armed count, then holds that request
until the test has killed the process and refuses it. So the kill lands
exactly after `count - 1` writes of the pass, on any machine.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client

from ambient_operator.webhook import certs
from conftest import ignoring, unique_name, wait_for

HOLD_SECONDS = 25.0  # under the webhook's own 30 s timeout
# Every write the data-plane pass makes: its objects, their pruning, its status.
RULES = [
    {"apiGroups": ["apps"], "resources": ["daemonsets"]},
    {"apiGroups": [""], "resources": ["configmaps", "serviceaccounts"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["clusterroles", "clusterrolebindings"],
    },
    {"apiGroups": ["ambientoperator.io"], "resources": ["ambientmeshes/status"]},
]


class WriteGate:
    """The webhook server and the configuration that sends it one user's writes."""

    def __init__(
        self,
        workdir: Path,
        user: str,
        name: str,
        rules: list[dict[str, Any]] | None = None,
    ) -> None:
        self.user = user
        self.name = name
        # Which writes are counted and held: the data-plane pass's by default.
        self.rules = RULES if rules is None else rules
        self._lock = threading.Lock()
        self._count = 0
        self._hold_at: int | None = None
        self.held = threading.Event()
        self._release = threading.Event()
        self.held_request = ""
        material = certs.generate(["127.0.0.1"], datetime.now(UTC))
        self._ca = material.ca_bundle
        pem = workdir / "gate.pem"
        pem.write_bytes(material.serving_pem())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                allowed = gate._judge(body["request"])
                answer = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": {
                            "uid": body["request"]["uid"],
                            "allowed": allowed,
                            **({} if allowed else {"status": {"message": "held by the test"}}),
                        },
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return  # the API server's requests are no news

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _judge(self, request: dict[str, Any]) -> bool:
        with self._lock:
            self._count += 1
            count, hold_at = self._count, self._hold_at
        if hold_at is None or count < hold_at:
            return True
        if count == hold_at:
            resource = request.get("resource", {}).get("resource", "")
            sub = request.get("subResource")
            self.held_request = (
                f"{request.get('operation')} {resource}{'/' + sub if sub else ''} "
                f"{request.get('namespace') or ''}/{request.get('name') or ''}"
            )
            self.held.set()
            self._release.wait(HOLD_SECONDS)
        return False  # the held write, and any after it, never land

    def arm(self, count: int) -> None:
        """Hold the `count`-th write from now on (1 = the next one)."""
        with self._lock:
            self._count = 0
            self._hold_at = count
        self.held.clear()
        self._release.clear()
        self.held_request = ""

    def disarm(self) -> None:
        """Refuse what is held, and let every later write through."""
        with self._lock:
            self._hold_at = None
        self._release.set()

    @property
    def count(self) -> int:
        """Writes seen since the gate was last armed."""
        with self._lock:
            return self._count

    def configuration(self) -> dict[str, Any]:
        """The ValidatingWebhookConfiguration that routes the user's writes here."""
        rules = [
            {
                **rule,
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "scope": "*",
            }
            for rule in self.rules
        ]
        only_user = f"request.userInfo.username == '{self.user}'"
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": "gate.chaos.test",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/",
                        "caBundle": base64.b64encode(self._ca).decode(),
                    },
                    "rules": rules,
                    "matchConditions": [{"name": "user", "expression": only_user}],
                    # A held write must fail even if the answer came too late.
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "timeoutSeconds": 30,
                }
            ],
        }

    @contextmanager
    def installed(self, api: client.ApiClient, as_user: client.ApiClient) -> Iterator[WriteGate]:
        """Serve, register with the API server, and take both down afterwards.

        `as_user` is a client of the gated user: its dry-run writes show when
        the API server has started calling the gate.
        """
        admission = client.AdmissionregistrationV1Api(api)
        self._thread.start()
        admission.create_validating_webhook_configuration(self.configuration())
        try:
            probe = client.CoreV1Api(as_user)

            def called() -> bool:
                name = unique_name("gate-probe")
                body = {"metadata": {"name": name}}
                probe.create_namespaced_config_map("default", body, dry_run="All")
                return self.count > 0

            wait_for(called, 30, "the API server to call the write gate", interval=0.1)
            yield self
        finally:
            self.disarm()
            with ignoring(404):
                admission.delete_validating_webhook_configuration(self.name)
            self._server.shutdown()
            self._server.server_close()
