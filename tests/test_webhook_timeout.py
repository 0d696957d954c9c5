"""A webhook endpoint that accepts connections and never answers (issue 15, point 6).

docs/windows-redirection-wait.md: "The webhook never blocks pod creation:
failurePolicy: Ignore, timeoutSeconds: 3". The operator is told the API server
reaches it at a loopback port where a socket accepts connections and then says
nothing; the pod must still be admitted, untouched, once the 3 s are up. The
connection-refused path is tests/test_webhook.py's outage test.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import create_namespace, ws2022_pod
from ambient_operator.api import constants as c
from conftest import ignoring, unique_name, wait_for
from operator_harness import RunningOperator, free_port, webhook_args

CONFIG = "ambient-operator"
DOCUMENTED_TIMEOUT = 3.0
# What the API server waits when a configuration names no timeout (admissionregistration/v1).
KUBERNETES_DEFAULT_TIMEOUT = 10.0


class Silent:
    """A listening socket that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def _timed_create(core: client.CoreV1Api, namespace: str, name: str) -> tuple[float, Any]:
    started = time.monotonic()
    core.create_namespaced_pod(namespace, ws2022_pod(name))
    took = time.monotonic() - started
    return took, core.read_namespaced_pod(name, namespace)


def test_a_webhook_that_never_answers_holds_a_pod_for_its_timeout_only(
    cluster: LocalCluster, k8s: client.ApiClient, silent: Silent, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    admission = client.AdmissionregistrationV1Api(k8s)
    enrolled = create_namespace(k8s, unique_name("hang"), {c.LABEL_DATAPLANE_MODE: "ambient"})
    plain = create_namespace(k8s, unique_name("hang"))
    tls = create_namespace(k8s, unique_name("hang"))
    op = RunningOperator(
        cluster,
        tmp_path,
        extra_args=webhook_args(free_port(), tls, url=f"https://127.0.0.1:{silent.port}"),
    )
    try:
        with op.running():

            def pointed() -> Any:
                config = admission.read_mutating_webhook_configuration(CONFIG)
                urls = {w.client_config.url for w in config.webhooks}
                return (
                    config
                    if urls == {f"https://127.0.0.1:{silent.port}/redirection-wait"}
                    else None
                )

            config = wait_for(pointed, 60, "the configuration to name the silent endpoint")
            assert [w.timeout_seconds for w in config.webhooks] == [3, 3]
            assert {w.failure_policy for w in config.webhooks} == {"Ignore"}

            # The same pod where the webhook is not called: what a create costs in this run.
            baseline, _ = _timed_create(core, plain, "baseline")
            took, stored = _timed_create(core, enrolled, "held")
            assert silent.accepted, "the API server never called the endpoint"
            # It waited for the answer the configured time, then admitted the pod as it was.
            assert took >= DOCUMENTED_TIMEOUT, f"{took:.2f}s: the call did not wait"
            assert took - baseline < KUBERNETES_DEFAULT_TIMEOUT, (took, baseline)
            names = [ct.name for ct in stored.spec.init_containers or []]
            assert "ambient-redirection-wait" not in names
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]
    finally:
        with ignoring(404):
            admission.delete_mutating_webhook_configuration(CONFIG)
        for name in (enrolled, plain, tls):
            with ignoring(404):
                core.delete_namespace(name)
