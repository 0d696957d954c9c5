"""The watch table (cluster/watches.py) on kopf: one handler per row, one first list.

Only `on.event` handlers are used: they keep no progress annotations and
add no finalizers, so the operator writes nothing on Nodes, Namespaces or
anything else it does not own. Handlers are coroutines: they run on the
event loop, like the passes that read the caches they fill and the
asyncio.Event they set (neither is safe to touch from kopf's executor
threads, where sync handlers run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import kopf

from ambient_operator.cluster.watches import Watched, list_all
from ambient_operator.kube.client import Kube
from ambient_operator.kube.sweep import Target


def register(
    reg: kopf.OperatorRegistry,
    table: Sequence[Watched],
    relisted: Callable[[str], None] | None = None,
) -> None:
    """One kopf event handler per watched row of `table`.

    `relisted` is told a row's id when kopf lists its kind again (events of
    no type), which is when a deletion may have gone unreported.
    """
    for row in table:
        if row.watched:
            _register_row(reg, row, relisted)


def _register_row(
    reg: kopf.OperatorRegistry, row: Watched, relisted: Callable[[str], None] | None
) -> None:
    kind = row.kind
    labels = (
        {k: kopf.PRESENT if v is None else v for k, v in row.labels.items()} if row.labels else None
    )
    test = row.when

    def when(name: str, namespace: str | None, labels: kopf.Labels, **_: Any) -> bool:
        return test is None or test(name, namespace or "", labels)

    @kopf.on.event(
        kind.group,
        kind.api_version.rpartition("/")[2],
        kind.plural,
        labels=labels,
        when=when if test is not None else None,
        registry=reg,
        id=row.id,
    )
    async def handler(type: str | None, body: kopf.Body, **_: Any) -> None:
        row.record(type, body)
        if type is None and relisted is not None:
            relisted(row.id)


async def prime(kube: Kube, table: Sequence[Watched]) -> None:
    """Fill every cache before the first pass; the watches keep them current after.

    Listed in a thread (the calls block), recorded on the event loop, where
    the handlers run too.
    """
    for row, items in await asyncio.to_thread(list_all, kube, table):
        for obj in items:
            row.record("ADDED", obj)


def sweep_targets(table: Sequence[Watched]) -> dict[str, Target]:
    """Every swept row as a target of kube/sweep.py, by the row's id."""
    return {row.id: target for row in table if (target := row.target()) is not None}
