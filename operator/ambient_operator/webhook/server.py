"""The webhook at run time: TLS material, the HTTPS server, the configuration, the caches.

The server runs on a thread of its own with its own event loop, beside
kopf rather than inside it. Measured (bench/webhook_latency.py on a 2-CPU
machine), kopf's admission pipeline cost about 1.5 ms per review (it diffs
the whole pod twice) and shared one event loop with the watch handlers and
the reconcile loop, so every reconcile pass stalled pod creation in enrolled
namespaces; the lean handler here decides from a snapshot of the caches and
writes its JSON patch directly. kopf still feeds the caches.

Everything kopf's managed configuration cannot say (see config.py) the
operator applies itself. The serving certificate comes from a Secret the
operator creates and renews (shared by restarts and replicas), or from a
directory a cert-manager Certificate is mounted into.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.api.conditions import BadReviewReason, ErrorReason
from ambient_operator.apply.plan import prepare, up_to_date
from ambient_operator.apply.writer import create_new, replace, write_by_name
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS, Kind, shown
from ambient_operator.webhook import certs, intake
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import (
    CONFIG_NAME,
    HANDLER_ID,
    SECRET_NAME,
    WebhookOptions,
    webhook_configuration,
)
from ambient_operator.webhook.misses import MissTracker

log = logging.getLogger(__name__)
CONTROLLER = "webhook"
SECRET = KINDS[("v1", "Secret")]
NODE = KINDS[("v1", "Node")]
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]
MWC = KINDS[("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")]
RUNTIME_CLASS = Kind("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False)
SERVING_FILE = "serving.pem"
CA_FILE = "ca.crt"
SERVER_START_SECONDS = 10.0
SECRET_ATTEMPTS = 5


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _decode(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def _status(refused: intake.Refused) -> web.Response:
    return web.Response(
        status=refused.status,
        body=json.dumps(refused.status_body(), separators=(",", ":")).encode(),
        content_type="application/json",
    )


def _unchanged(uid: str, reason: BadReviewReason, problem: str) -> dict[str, Any]:
    """A review response that lets the pod through unchanged, and tells its creator why."""
    # Warnings reach whoever created the pod (kubectl prints them); the API
    # server may truncate one longer than 256 characters.
    warning = f"ambient-operator redirection-wait webhook: {reason}: {problem}"
    return {
        "apiVersion": intake.REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": True,
            "warnings": [f"{warning[:200]}; the pod is admitted unchanged"],
        },
    }


class AdmissionServer:
    """HTTPS on a thread of its own: POST /<handler id> answers AdmissionReviews.

    A certificate change swaps the SSL context new handshakes use (through
    the callback every handshake runs, SNI or not), so rotation never closes
    the listener. A body that is not a review is answered here (see
    intake.py); `review` may refuse one too, by raising intake.Refused.
    """

    def __init__(
        self,
        review: Callable[[Mapping[str, Any]], dict[str, Any]],
        address: str,
        port: int,
        path: str = f"/{HANDLER_ID}",
        *,
        limiter: intake.LogLimiter | None = None,
    ) -> None:
        self.review = review
        self.address = address
        self.port = port
        self.path = path
        self.limiter = limiter or intake.LogLimiter()
        self._current: ssl.SSLContext | None = None
        self._files: tuple[Path, Path] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def set_certificate(self, certfile: Path, keyfile: Path) -> None:
        """Serve this certificate from the next handshake on."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(certfile), str(keyfile))
        self._current = context
        self._files = (certfile, keyfile)

    def _pick_context(self, sslobj: Any, _server_name: str | None, _base: ssl.SSLContext) -> None:
        if self._current is not None:
            sslobj.context = self._current

    async def _read(self, request: web.Request) -> dict[str, Any]:
        if request.content_type != "application/json":
            raise intake.Refused(
                415,
                BadReviewReason.UNSUPPORTED_MEDIA_TYPE,
                f"the body must be application/json, not {shown(request.content_type)}",
            )
        too_large = intake.Refused(
            413, BadReviewReason.BODY_TOO_LARGE, f"the body exceeds {intake.MAX_BODY_BYTES} bytes"
        )
        if (request.content_length or 0) > intake.MAX_BODY_BYTES:
            raise too_large
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        return intake.read_json(body)

    def _refuse(self, request: web.Request, refused: intake.Refused) -> web.Response:
        metrics.WEBHOOK_BAD_REVIEWS.labels(reason=refused.reason).inc()
        self.limiter.warning(
            log,
            refused.reason,
            f"redirection-wait webhook: answered {refused.status} to {request.remote}: {refused}",
        )
        return _status(refused)

    async def _handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        review: dict[str, Any] | None = None
        try:
            review = await self._read(request)
            body = json.dumps(self.review(review), separators=(",", ":"))
            return web.Response(body=body.encode(), content_type="application/json")
        except intake.Refused as refused:
            return self._refuse(request, refused)
        except Exception:
            # A bug of ours, not the sender's: its traceback is worth a line,
            # but not one per request, and the pod must still go through.
            self.limiter.warning(
                log,
                BadReviewReason.INTERNAL_ERROR,
                "redirection-wait webhook failed to answer",
                exc_info=True,
            )
            try:
                _, uid = intake.request_of(review or {})
            except intake.Refused:
                return _status(
                    intake.Refused(500, BadReviewReason.INTERNAL_ERROR, "the webhook failed")
                )
            answer = _unchanged(uid, BadReviewReason.INTERNAL_ERROR, "the webhook failed")
            return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
        finally:
            metrics.WEBHOOK_REQUEST_SECONDS.observe(time.perf_counter() - started)

    def start(self) -> None:
        """Listen; returns once the socket is bound (raises when it cannot be)."""
        if self._current is None:
            raise RuntimeError("set_certificate first")
        self._thread = threading.Thread(target=self._run, name="webhook-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(SERVER_START_SECONDS):
            raise RuntimeError("the webhook server did not start in time")
        if self._error is not None:
            raise RuntimeError(f"the webhook server failed to start: {self._error}")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application(client_max_size=intake.MAX_BODY_BYTES)
        app.router.add_post(self.path, self._handle)
        # access_log None: a line per pod creation is noise, not news.
        # lingering_time: the unread rest of a refused body is drained for 2 s
        # at most, so its sender reads our answer instead of a reset; aiohttp's
        # 10 s holds the connection (and a shutdown) that long after a sender
        # that already left.
        runner = web.AppRunner(app, handle_signals=False, access_log=None, lingering_time=2.0)
        base = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        if self._files is not None:
            base.load_cert_chain(str(self._files[0]), str(self._files[1]))
        base.sni_callback = self._pick_context
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.address, self.port, ssl_context=base)
            loop.run_until_complete(site.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        """Stop listening and wait for the thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(SERVER_START_SECONDS)


class Webhook:
    """State and work of the redirection-wait webhook inside one operator process."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        options: WebhookOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.kube = kube
        self.options = options
        # `clock` paces the log lines about bad reviews (one per reason per interval).
        self.limiter = intake.LogLimiter(clock=clock)
        self.runtime_classes: dict[str, dict[str, Any]] = {}
        self._rc_version = 0
        self._facts: dict[str, tuple[str, NodeFacts]] = {}
        self._context: tuple[Any, d.Context] | None = None
        # The server thread and the kopf loop both ask for the context.
        self._lock = threading.Lock()
        self.server: AdmissionServer | None = None
        self.material: certs.TLSMaterial | None = None
        self.serve_dir: Path | None = None
        self.misses: MissTracker | None = None

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
            ctx = d.Context.build(mesh, self._node_facts(nodes), dict(self.runtime_classes))
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
        return _unchanged(uid, reason, problem)

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
                return _unchanged(
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

    # -- start-up --------------------------------------------------------------
    def prime(self) -> None:
        """Fill the caches the decision reads before the first request arrives.

        kopf starts its watches and the webhook server together, so without
        this the first pods after a restart would be judged on empty caches.
        """
        try:
            for node in self.kube.list(NODE):
                self.state.nodes.setdefault(node["metadata"]["name"], node)
            if self.state.mesh is None:
                self.state.mesh = self.kube.get(MESH, c.MESH_NAME)
        except KubeError as exc:
            log.warning("could not prime the node and mesh caches: %s", exc)
        try:
            for rc in self.kube.list(RUNTIME_CLASS):
                self.runtime_class_event("ADDED", rc)
        except KubeError as exc:
            log.warning("could not list RuntimeClasses: %s", exc)
        self.state.poke()

    # -- TLS --------------------------------------------------------------------
    def secret_namespace(self) -> str:
        """Where the TLS Secret lives: the flag, else the AmbientMesh's namespace."""
        if self.options.secret_namespace:
            return self.options.secret_namespace
        spec = (self.state.mesh or {}).get("spec") or {}
        return str(spec.get("namespace") or os.environ.get("POD_NAMESPACE") or "istio-system")

    def hosts(self) -> list[str]:
        """Names the serving certificate must carry."""
        spec = (self.state.mesh or {}).get("spec") or {}
        return self.options.hosts(str(spec.get("clusterDomain") or "cluster.local"))

    def _secret_body(
        self, namespace: str, material: certs.TLSMaterial, resource_version: str | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": SECRET_NAME,
            "namespace": namespace,
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY, c.LABEL_COMPONENT: "webhook"},
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in material.as_data().items()},
        }

    def ensure_secret(self, current: certs.TLSMaterial | None) -> certs.TLSMaterial:
        """The Secret's material, creating or renewing it; safe against other replicas.

        Create-if-absent and replace-at-resourceVersion: whoever loses a race
        reads the winner's material and uses it.
        """
        namespace, hosts = self.secret_namespace(), self.hosts()
        for _ in range(SECRET_ATTEMPTS):
            now = datetime.now(UTC)
            live = self.kube.get(SECRET, SECRET_NAME, namespace)
            if live is None:
                usable = current is not None and certs.renewal_reason(current, hosts, now) is None
                material = current if usable and current else certs.generate(hosts, now)
                try:
                    create_new(self.kube, self._secret_body(namespace, material))
                except KubeError as exc:
                    if exc.status == 409:
                        continue
                    raise
                log.info("created webhook TLS Secret %s/%s", namespace, SECRET_NAME)
                return material
            stored: certs.TLSMaterial | None
            try:
                stored = certs.TLSMaterial.from_data(_decode(live.get("data")))
                reason = certs.renewal_reason(stored, hosts, now)
            except ValueError as exc:
                stored, reason = None, f"unreadable: {exc}"
            if reason is None and stored is not None:
                return stored
            material = certs.renewed(stored, hosts, now)
            body = self._secret_body(namespace, material, live["metadata"].get("resourceVersion"))
            try:
                replace(self.kube, body)
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("renewed webhook TLS Secret %s/%s: %s", namespace, SECRET_NAME, reason)
            return material
        raise KubeError(409, "Conflict", f"Secret {namespace}/{SECRET_NAME} kept changing")

    def _from_cert_dir(self) -> certs.TLSMaterial:
        folder = Path(self.options.cert_dir or "")
        return certs.TLSMaterial.from_data(
            {
                name: (folder / name).read_bytes()
                for name in (certs.KEY_TLS_CRT, certs.KEY_TLS_KEY, certs.KEY_CA_CRT)
                if (folder / name).exists()
            }
        )

    def load_material(self) -> certs.TLSMaterial:
        """Current TLS material from the cert dir or the Secret.

        When the Secret cannot be used (no namespace yet, no permission), the
        process serves with material of its own and keeps trying to store it.
        """
        if self.options.cert_dir:
            return self._from_cert_dir()
        try:
            return self.ensure_secret(self.material)
        except KubeError as exc:
            log.error(
                "webhook TLS Secret unavailable (%s); serving with a private certificate", exc
            )
            now = datetime.now(UTC)
            if self.material is None or certs.renewal_reason(self.material, self.hosts(), now):
                return certs.generate(self.hosts(), now)
            return self.material

    def serving_paths(self) -> tuple[Path, Path, Path]:
        """(certfile, keyfile, cafile) for kopf's server."""
        if self.options.cert_dir:
            folder = Path(self.options.cert_dir)
            return folder / certs.KEY_TLS_CRT, folder / certs.KEY_TLS_KEY, folder / certs.KEY_CA_CRT
        if self.serve_dir is None:
            self.serve_dir = Path(tempfile.mkdtemp(prefix="ambient-operator-webhook-"))
        serving = self.serve_dir / SERVING_FILE
        return serving, serving, self.serve_dir / CA_FILE

    def sync(self) -> None:
        """Converge the served certificate and the MutatingWebhookConfiguration on the material."""
        self.install(self.load_material())
        if self.material is not None:
            self.apply_configuration(self.material.ca_bundle)

    def install(self, material: certs.TLSMaterial) -> None:
        """Serve this material (no-op when it is what is served already)."""
        if material == self.material:
            return
        certfile, keyfile, cafile = self.serving_paths()
        if not self.options.cert_dir:
            _write_atomically(cafile, material.ca_bundle)
            _write_atomically(certfile, material.serving_pem())
        if self.server is not None:
            self.server.set_certificate(certfile, keyfile)
        self.material = material

    def apply_configuration(self, ca_bundle: bytes) -> bool:
        """Server-side apply of the webhook configuration when it differs; True when written."""
        desired = prepare(
            webhook_configuration(self.options.client_config(ca_bundle)), None, CONTROLLER
        )
        live = self.kube.get(MWC, CONFIG_NAME)
        if up_to_date(desired, live):
            return False
        # Ours by field manager: a configuration of that name made by anyone
        # else is refused (NameConflictError), not taken over.
        write_by_name(self.kube, desired, live)
        metrics.OBJECTS_APPLIED.labels(kind="MutatingWebhookConfiguration").inc()
        log.info("applied MutatingWebhookConfiguration %s", CONFIG_NAME)
        return True

    async def maintain(self) -> None:
        """Re-check the material and the configuration every sync period."""
        while True:
            await asyncio.sleep(self.options.sync_seconds)
            try:
                await asyncio.to_thread(self.sync)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook sync failed; retrying in %ss", self.options.sync_seconds)

    def start_server(self) -> None:
        """Bind the HTTPS server with the current material."""
        certfile, keyfile, _cafile = self.serving_paths()
        server = AdmissionServer(
            self.review, self.options.listen_address, self.options.port, limiter=self.limiter
        )
        server.set_certificate(certfile, keyfile)
        server.start()
        self.server = server
        log.info(
            "serving the redirection-wait webhook on %s:%s",
            self.options.listen_address,
            self.options.port,
        )

    def cleanup(self) -> None:
        """Stop serving; remove the private serving files (the Secret stays for the next start)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.serve_dir is not None:
            shutil.rmtree(self.serve_dir, ignore_errors=True)
            self.serve_dir = None
