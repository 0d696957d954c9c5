"""Malformed admission requests sent to the real webhook HTTPS server.

Whatever arrives, the answer is well formed: a review that names a uid is
allowed unchanged with a warning (the webhook never blocks a pod), anything
else gets a 4xx with a short Status body. Nothing is logged with a
traceback, and a flood of bad requests costs one log line per kind of
problem per interval. No API server takes part: these bodies are what a
client other than the API server can send to the webhook's port.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client import REGISTRY

from ambient_operator.api import constants as c
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.webhook import certs
from ambient_operator.webhook.config import WebhookOptions
from ambient_operator.webhook.intake import LogLimiter
from ambient_operator.webhook.server import AdmissionServer
from ambient_operator.webhook.upkeep import Webhook
from operator_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_NODES = ROOT / "operator/ambient_operator/samples/nodes-mixed.yaml"
PATH = "/redirection-wait"
BAD_REVIEWS = "ambient_operator_webhook_bad_reviews_total"
# A pod the webhook mutates: enrolled namespace, pinned to a pre-WS2025 build.
WS2022_POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "labels": {}, "annotations": {}},
    "spec": {
        "nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022},
        "containers": [{"name": "app", "image": "app:1"}],
    },
}


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    """Every log record of the process, formatted as it would be printed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))

    @property
    def text(self) -> str:
        return "\n".join(self.texts)

    def count(self) -> int:
        return sum(t.count("\n") + 1 for t in self.texts)


@dataclass
class Served:
    port: int
    ca: bytes
    log: Lines

    def post(
        self, body: bytes, content_type: str | None = "application/json"
    ) -> tuple[int, str, Any]:
        """(status, content type, decoded JSON body) of one POST on a fresh connection."""
        conn = self.connection()
        try:
            return self.send(conn, body, content_type)
        finally:
            conn.close()

    def connection(self) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cadata=self.ca.decode())
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=30)

    @staticmethod
    def send(
        conn: http.client.HTTPSConnection, body: bytes, content_type: str | None
    ) -> tuple[int, str, Any]:
        headers = {"Content-Type": content_type} if content_type else {}
        conn.request("POST", PATH, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        kind = response.getheader("Content-Type") or ""
        return (
            response.status,
            kind,
            json.loads(raw) if kind.startswith("application/json") else raw,
        )


def _state() -> ClusterState:
    state = ClusterState()
    state.nodes = {
        n["metadata"]["name"]: n for n in yaml.safe_load(SAMPLE_NODES.read_text())["items"]
    }
    state.mesh = {"metadata": {"name": "default", "uid": "u"}, "spec": {}}
    state.namespaces["ns"] = {"labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}
    return state


@contextmanager
def _serve(
    review: Callable[[Any], dict[str, Any]], tmp_path: Path, limiter: LogLimiter | None = None
) -> Iterator[Served]:
    """The webhook's HTTPS server on a free loopback port, with the process log captured."""
    material = certs.generate(["127.0.0.1"], datetime.now(UTC))
    pem = tmp_path / "serving.pem"
    pem.write_bytes(material.serving_pem())
    port = free_port()
    server = AdmissionServer(review, "127.0.0.1", port, limiter=limiter)
    server.set_certificate(pem, pem)
    lines = Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(lines)
    root.setLevel(logging.INFO)
    server.start()
    try:
        yield Served(port, material.ca_bundle, lines)
    finally:
        server.stop()
        root.removeHandler(lines)
        root.setLevel(level)


def _webhook(**kwargs: Any) -> Webhook:
    return Webhook(
        _state(), cast(Kube, None), WebhookOptions(url="https://127.0.0.1:9443"), **kwargs
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with _serve(_webhook().review, tmp_path) as out:
        yield out


def _review(request: Any, **envelope: Any) -> bytes:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", **envelope}
    body["request"] = request
    return json.dumps(body).encode()


def _create(pod: Any, **request: Any) -> dict[str, Any]:
    """An AdmissionRequest as the API server sends one for a pod being created."""
    return {
        "uid": "u-7",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": pod,
        **request,
    }


def _pod(**spec: Any) -> dict[str, Any]:
    pod = json.loads(json.dumps(WS2022_POD))
    pod["spec"].update(spec)
    return pod


def _bad(reason: str) -> float:
    return REGISTRY.get_sample_value(BAD_REVIEWS, {"reason": reason}) or 0.0


def _nested(depth: int) -> bytes:
    return b'{"request":' * depth + b"{}" + b"}" * depth


# -- answered without a review: 4xx and a Status body ------------------------------------

# (case id, body, content type, HTTP status, Status reason, our reason, message fragment)
REFUSED: list[tuple[str, bytes, str | None, int, str, str, str]] = [
    (
        "request-is-a-string",
        b'{"request":"x"}',
        "application/json",
        400,
        "BadRequest",
        "NoUID",
        "request",
    ),
    ("no-request", _review(None), "application/json", 400, "BadRequest", "NoUID", "request"),
    (
        "uid-is-a-number",
        _review({"uid": 5}),
        "application/json",
        400,
        "BadRequest",
        "NoUID",
        "request.uid",
    ),
    (
        "empty-uid",
        _review({"uid": ""}),
        "application/json",
        400,
        "BadRequest",
        "NoUID",
        "request.uid",
    ),
    ("not-json", b"hello", "application/json", 400, "BadRequest", "NotJSON", "not JSON"),
    ("empty", b"", "application/json", 400, "BadRequest", "NotJSON", "not JSON"),
    (
        "not-utf-8",
        b'{"request":"\xff\xfe"}',
        "application/json",
        400,
        "BadRequest",
        "NotJSON",
        "not JSON",
    ),
    (
        "nested-10000-arrays",
        b"[" * 10_000 + b"]" * 10_000,
        "application/json",
        400,
        "BadRequest",
        "TooDeep",
        "100 levels",
    ),
    (
        "nested-10000-objects",
        _nested(10_000),
        "application/json",
        400,
        "BadRequest",
        "TooDeep",
        "100 levels",
    ),
    ("nested-101", _nested(100), "application/json", 400, "BadRequest", "TooDeep", "100 levels"),
    (
        "a-list",
        b"[1, 2]",
        "application/json",
        400,
        "BadRequest",
        "NotAdmissionReview",
        "AdmissionReview",
    ),
    (
        "a-pod",
        json.dumps({"apiVersion": "v1", "kind": "Pod", "request": {"uid": "u"}}).encode(),
        "application/json",
        400,
        "BadRequest",
        "NotAdmissionReview",
        "AdmissionReview",
    ),
    (
        "v1beta1",
        _review(_create(_pod()), apiVersion="admission.k8s.io/v1beta1"),
        "application/json",
        400,
        "BadRequest",
        "NotAdmissionReview",
        "admission.k8s.io/v1",
    ),
    (
        "text-plain",
        _review(_create(_pod())),
        "text/plain",
        415,
        "UnsupportedMediaType",
        "UnsupportedMediaType",
        "application/json",
    ),
    (
        "no-content-type",
        _review(_create(_pod())),
        None,
        415,
        "UnsupportedMediaType",
        "UnsupportedMediaType",
        "application/json",
    ),
    (
        "form",
        b"request=x",
        "application/x-www-form-urlencoded",
        415,
        "UnsupportedMediaType",
        "UnsupportedMediaType",
        "application/json",
    ),
    (
        "five-mib",
        b'{"a":"' + b"x" * (5 * 1024 * 1024) + b'"}',
        "application/json",
        413,
        "RequestEntityTooLarge",
        "BodyTooLarge",
        "4194304 bytes",
    ),
]


@pytest.mark.parametrize(
    ("case", "body", "content_type", "status", "status_reason", "reason", "fragment"),
    REFUSED,
    ids=[r[0] for r in REFUSED],
)
def test_what_is_not_a_review_gets_a_4xx_status(
    served: Served,
    case: str,
    body: bytes,
    content_type: str | None,
    status: int,
    status_reason: str,
    reason: str,
    fragment: str,
) -> None:
    before = _bad(reason)
    conn = served.connection()
    try:
        code, kind, answer = served.send(conn, body, content_type)
        # The connection stays usable: the next review on it is answered as usual.
        follow = served.send(conn, _review(_create(_pod())), "application/json")
    finally:
        conn.close()
    assert follow[0] == 200 and "patch" in follow[2]["response"]
    assert (code, kind) == (status, "application/json")
    assert set(answer) == {"apiVersion", "kind", "status", "code", "reason", "message"}
    assert answer["apiVersion"] == "v1" and answer["kind"] == "Status"
    assert (answer["status"], answer["code"], answer["reason"]) == (
        "Failure",
        status,
        status_reason,
    )
    assert answer["message"].startswith(f"{reason}: ")
    assert fragment in answer["message"]
    assert len(answer["message"]) < 200
    assert _bad(reason) == before + 1
    assert "Traceback" not in served.log.text
    assert served.log.count() == 1, served.log.text


def test_the_bounds_leave_what_the_api_server_sends_alone(served: Served) -> None:
    # The API server takes request bodies up to 3 MiB, so a pod can be that big
    # when mutating webhooks see it (validation, which limits annotations,
    # comes after them).
    env = [{"name": "BIG", "value": "x" * (3 * 1024 * 1024)}]
    big = _pod(containers=[{"name": "app", "image": "app:1", "env": env}])
    # 100 levels in all, the review's own two included: as deep as the bound allows.
    deep = _create(_pod(), extra=json.loads(_nested(97)))
    # Brackets inside strings do not nest, escaped quotes and backslashes or not.
    noted = _pod()
    noted["metadata"]["annotations"]["example.com/note"] = '"\\' + "[{" * 300
    # The envelope's apiVersion and kind are optional; the answer is v1.
    bare = json.dumps({"request": _create(_pod())}).encode()
    for body in (_review(_create(big)), _review(deep), _review(_create(noted)), bare):
        code, _, answer = served.post(body)
        assert code == 200
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        response = answer["response"]
        assert response["uid"] == "u-7" and response["allowed"] is True
        ops = json.loads(base64.b64decode(response["patch"]))
        assert ops[0]["path"] == "/spec/initContainers"
        assert ops[0]["value"][0]["name"] == "ambient-redirection-wait"
    assert served.log.count() == 0, served.log.text


# -- answered as a review: allowed, no patch, a warning ----------------------------------

# (case id, request, our reason, fragment of the warning)
ADMITTED: list[tuple[str, Any, str, str]] = [
    (
        "issue-body",
        {"uid": "u-7", "object": {"spec": {"containers": "abc"}}},
        "MalformedRequest",
        "request.operation",
    ),
    ("containers-abc", _create(_pod(containers="abc")), "MalformedPod", "spec.containers"),
    ("container-is-a-number", _create(_pod(containers=[1])), "MalformedPod", "spec.containers[0]"),
    (
        "init-container-resources",
        _create(_pod(initContainers=[{"name": "i", "resources": []}])),
        "MalformedPod",
        "spec.initContainers[0].resources",
    ),
    (
        "node-selector-list",
        _create(_pod(nodeSelector=["windows"])),
        "MalformedPod",
        "spec.nodeSelector",
    ),
    (
        "labels-list",
        _create({**_pod(), "metadata": {"labels": ["a"]}}),
        "MalformedPod",
        "metadata.labels",
    ),
    (
        "affinity-terms-string",
        _create(
            _pod(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}
                    }
                }
            )
        ),
        "MalformedPod",
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms",
    ),
    (
        "tolerations-strings",
        _create(_pod(tolerations=["os"])),
        "MalformedPod",
        "spec.tolerations[0]",
    ),
    ("spec-is-a-list", _create({"metadata": {}, "spec": []}), "MalformedPod", "spec"),
    ("object-is-a-string", _create("pod"), "MalformedRequest", "request.object"),
    (
        "resource-is-a-string",
        _create(_pod(), resource="pods"),
        "MalformedRequest",
        "request.resource",
    ),
    (
        "namespace-is-a-list",
        _create(_pod(), namespace=["ns"]),
        "MalformedRequest",
        "request.namespace",
    ),
]


@pytest.mark.parametrize(
    ("case", "request_", "reason", "fragment"), ADMITTED, ids=[a[0] for a in ADMITTED]
)
def test_a_malformed_review_with_a_uid_is_allowed_unchanged(
    served: Served, case: str, request_: Any, reason: str, fragment: str
) -> None:
    before = _bad(reason)
    code, kind, answer = served.post(_review(request_))
    assert (code, kind) == (200, "application/json")
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert set(response) == {"uid", "allowed", "warnings"}
    assert response["uid"] == "u-7" and response["allowed"] is True
    [warning] = response["warnings"]
    assert warning.startswith(f"ambient-operator redirection-wait webhook: {reason}: ")
    assert fragment in warning and warning.endswith("; the pod is admitted unchanged")
    assert len(warning) <= 256
    assert _bad(reason) == before + 1
    assert "Traceback" not in served.log.text
    assert served.log.count() == 1, served.log.text


# -- a flood costs a handful of lines -------------------------------------------------------


def test_a_thousand_bad_requests_log_a_handful_of_lines(tmp_path: Path) -> None:
    clock = FakeClock()
    hook = _webhook(clock=clock)
    flood = [
        b'{"request":"x"}',  # 15 bytes, as in issue 14
        b"hello",
        _nested(200),
        _review(_create(_pod(containers="abc"))),
    ]
    with _serve(hook.review, tmp_path, hook.limiter) as served:
        before = {r: _bad(r) for r in ("NoUID", "NotJSON", "TooDeep", "MalformedPod")}
        conn = served.connection()
        try:
            codes = [served.send(conn, flood[i % 4], "application/json")[0] for i in range(1000)]
            assert codes == [400, 400, 400, 200] * 250
            assert {r: _bad(r) - before[r] for r in before} == {
                "NoUID": 250,
                "NotJSON": 250,
                "TooDeep": 250,
                "MalformedPod": 250,
            }
            # One line per kind of problem while the clock stands still.
            assert served.log.count() == 4, served.log.text
            clock.now += 10.0
            assert served.send(conn, flood[0], "application/json")[0] == 400
            assert served.log.count() == 5, served.log.text
            assert "249 more" in served.log.texts[-1]
            # The server still does its job.
            code, _, answer = served.send(conn, _review(_create(_pod())), "application/json")
        finally:
            conn.close()
    assert code == 200
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert ops[0]["value"][0]["name"] == "ambient-redirection-wait"
    assert "Traceback" not in served.log.text
    assert served.log.count() == 5, served.log.text


def test_a_bug_of_ours_still_lets_the_pod_through_with_one_traceback(tmp_path: Path) -> None:
    def broken(review: Any) -> dict[str, Any]:
        raise ZeroDivisionError("a bug")

    # The server, answering through a review function that fails.
    with _serve(broken, tmp_path, LogLimiter(clock=FakeClock())) as served:
        answers = [served.post(_review(_create(_pod()))) for _ in range(20)]
        no_uid = served.post(b'{"request":{}}')
    for code, _, answer in answers:
        assert code == 200
        assert answer["response"] == {
            "uid": "u-7",
            "allowed": True,
            "warnings": [
                "ambient-operator redirection-wait webhook: InternalError: the webhook failed; "
                "the pod is admitted unchanged"
            ],
        }
    # Without a uid there is nothing to allow: a 500, the one code kept for bugs.
    code, _, status = no_uid
    assert (code, status["reason"], status["message"]) == (
        500,
        "InternalError",
        "InternalError: the webhook failed",
    )
    # The traceback is the bug's report: one line, once per interval.
    assert len(served.log.texts) == 1, served.log.text
    assert served.log.text.count("Traceback") == 1
    assert "ZeroDivisionError: a bug" in served.log.text


# -- the limiter on its own ---------------------------------------------------------------


def test_log_limiter_lets_one_line_per_reason_per_interval_through() -> None:
    clock = FakeClock(100.0)
    limiter = LogLimiter(interval=10.0, clock=clock)
    assert limiter.admit("NoUID") == 0
    assert limiter.admit("NoUID") is None
    assert limiter.admit("NoUID") is None
    assert limiter.admit("NotJSON") == 0  # each reason has its own interval
    clock.now = 109.9
    assert limiter.admit("NoUID") is None
    clock.now = 110.0
    assert limiter.admit("NoUID") == 3  # the three held back since the last line
    assert limiter.admit("NoUID") is None
    assert limiter.admit("NotJSON") == 0
    clock.now = 500.0
    assert limiter.admit("NoUID") == 1
    assert limiter.admit("NotJSON") == 0
