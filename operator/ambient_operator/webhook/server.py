"""The HTTPS admission server, on a thread of its own.

The server runs on a thread of its own with its own event loop, beside
kopf rather than inside it. Measured (bench/webhook_latency.py on a 2-CPU
machine), kopf's admission pipeline cost about 1.5 ms per review (it diffs
the whole pod twice) and shared one event loop with the watch handlers and
the reconcile loop, so every reconcile pass stalled pod creation in enrolled
namespaces; the lean handler (review.py) decides from a snapshot of the
caches and writes its JSON patch directly. kopf still feeds the caches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from ambient_operator.api import metrics
from ambient_operator.api.conditions import BadReviewReason
from ambient_operator.kube.resources import shown
from ambient_operator.webhook import intake
from ambient_operator.webhook.config import HANDLER_ID

log = logging.getLogger(__name__)
SERVER_START_SECONDS = 10.0


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
