"""Wiring of the admission webhook: its start, and its clean-up on the kopf registry.

Its RuntimeClass watch is a row of the watch table (`Webhook.watches`);
app/operator.py primes the table, then calls `start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.status.events import EventRecorder
from ambient_operator.webhook.config import WebhookOptions
from ambient_operator.webhook.misses import MissTracker
from ambient_operator.webhook.upkeep import Webhook

log = logging.getLogger(__name__)


def register(
    reg: kopf.OperatorRegistry,
    state: ClusterState,
    kube: Kube,
    events: EventRecorder,
    options: WebhookOptions,
    report_misses: Callable[[int, int], None],
    default_registry: str | None = None,
) -> Webhook:
    """Create the webhook and add its clean-up to the operator's kopf registry.

    The misses check always runs (pods admitted without the workaround are
    news whether or not this process serves the webhook); the server runs
    only when --webhook-url or --webhook-service says how to reach it.
    """
    webhook = Webhook(state, kube, options, default_registry=default_registry)
    webhook.misses = MissTracker(state, events, webhook.context, report_misses)

    @kopf.on.cleanup(registry=reg)
    async def webhook_cleanup(memo: kopf.Memo, **_: Any) -> None:
        task = memo.get("webhook-maintain")
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(webhook.cleanup)

    # Pods reach `misses` from the operator's pod informer (ambient_operator.cluster.pods).
    return webhook


async def start(webhook: Webhook, memo: kopf.Memo) -> None:
    """Serve admission reviews, once the watch table is primed (app/operator.py calls it).

    Started only after priming, so the first pods after a restart are
    never judged on empty caches. Once per process: kopf retries a failed
    start-up handler, and the caller's may fail after this ran.
    """
    options = webhook.options
    if not options.enabled or "webhook-maintain" in memo:
        return
    try:
        await asyncio.to_thread(webhook.sync)
    except Exception:
        # The server must still start; the maintain loop retries the rest.
        log.exception("webhook set-up incomplete; retrying every %ss", options.sync_seconds)
        if webhook.material is None and not options.cert_dir:
            from ambient_operator.webhook import certs  # cryptography: only with the server

            webhook.install(certs.generate(webhook.hosts(), datetime.now(UTC)))
    await asyncio.to_thread(webhook.start_server)
    memo["webhook-maintain"] = asyncio.create_task(webhook.maintain(), name="webhook-maintain")
