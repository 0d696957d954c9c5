"""The watch table (cluster/watches.py) on the operator's informers: one list and watch per kind.

Every kind the table names is listed and watched by a kube/informer.py of
its own, however many rows read it (the rows of Services share one watch).
The informer's first list is the prime: it fills every cache before the
first pass. Each event reaches the rows whose filters it passes, on the
event loop, like the passes that read the caches and the asyncio.Event
they set.

kopf watched these kinds before. Its per-object workers held each body
through its handlers, and at a restart that was every Namespace, Node and
ConfigMap of the cluster at once: measured at 500 nodes, 1,000 namespaces,
200 waypoints and 6,000 pods, the restart's resident set was 185 MiB
watched by kopf and 155 MiB without its watches. kopf also listed each kind
apart from the prime, and did not report what a relist found gone, which a
periodic sweep had to find; an informer reports both, and each complete
list forgets what the caches hold that it no longer does (`ghosts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ambient_operator.api import metrics
from ambient_operator.cluster.watches import Watched
from ambient_operator.kube.client import Kube
from ambient_operator.kube.informer import Change, Informer, Listed, ghosts
from ambient_operator.kube.resources import Kind

Body = Mapping[str, Any]


def _whole(obj: Body) -> Body:
    # The rows copy what they keep, on the event loop.
    return obj


def _selects(row: Watched, body: Body) -> bool:
    meta = body.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    if row.labels and not all(
        key in labels and (value is None or labels[key] == value)
        for key, value in row.labels.items()
    ):
        return False
    return row.when is None or row.when(
        str(meta.get("name") or ""), str(meta.get("namespace") or ""), labels
    )


def server_selector(rows: Sequence[Watched]) -> str | None:
    """The label selector every row of one kind asks for, for the API server to apply.

    Only when every row filters on labels and none needs every name of the
    kind: what they have in common (our own DaemonSets, never the cluster's
    others). The rows still apply their own filters to what comes.
    """
    if not rows or any(not row.labels or row.every_name for row in rows):
        return None
    common = set.intersection(*({*(row.labels or {}).items()} for row in rows))
    return ",".join(k if v is None else f"{k}={v}" for k, v in sorted(common)) or None


def _stub(kind: Kind, key: tuple[str, str]) -> dict[str, Any]:
    meta = {"name": key[1], **({"namespace": key[0]} if key[0] else {})}
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}


class KindFeed:
    """The rows of one kind, fed by one informer."""

    def __init__(self, kind: Kind, rows: Sequence[Watched]) -> None:
        self.kind = kind
        self.rows = tuple(rows)

    def deliver(self, changes: list[Change[Body]]) -> None:
        """A batch of the informer's changes, to every row they concern."""
        for change in changes:
            body = change.record
            if body is None:  # found gone by a list: no last state to filter on
                for row in self.rows:
                    self._forget(row, change.key)
                continue
            for row in self.rows:
                if _selects(row, body):
                    row.record(change.type, body)

    def unchanged(self, body: Body) -> bool:
        """Whether a modified body changes nothing any row keeps (`Watched.unchanged`):
        each row that selects it says so. Asked on the informer's thread."""
        return all(
            row.unchanged is not None and row.unchanged(body)
            for row in self.rows
            if _selects(row, body)
        )

    def listed(self, listed: Listed) -> None:
        """After a complete list: forget what a cache holds that the list did not."""
        metrics.WATCH_LISTS.labels(kind=self.kind.kind).inc()
        for row in self.rows:
            if row.cached is None:
                continue
            for key in ghosts(row.cached(), listed):
                self._forget(row, key)

    def _forget(self, row: Watched, key: tuple[str, str]) -> None:
        if row.forget is None:
            row.record("DELETED", _stub(self.kind, key))
            return
        if row.cached is not None and key not in row.cached():
            return  # another row's object, or one this row never kept
        metrics.forgotten_ghost(self.kind.kind, "/".join(key))
        row.forget(key)


class Watches:
    """Every watched row of the table, listed and watched until stopped."""

    def __init__(self, kube: Kube, table: Sequence[Watched]) -> None:
        self.kube = kube
        by_kind: dict[Kind, list[Watched]] = {}
        for row in table:
            by_kind.setdefault(row.kind, []).append(row)
        self.feeds = [KindFeed(kind, rows) for kind, rows in by_kind.items()]
        self.informers: list[Informer[Body]] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """One informer per kind, each on its own thread; does nothing when started."""
        if self.informers:
            return
        for feed in self.feeds:
            informer: Informer[Body] = Informer(
                self.kube,
                feed.kind,
                _whole,
                feed.deliver,
                loop,
                label_selector=server_selector(feed.rows),
                listed=feed.listed,
                # Only where a row can answer: else every event would be asked about.
                unchanged=(feed.unchanged if any(row.unchanged for row in feed.rows) else None),
            )
            informer.start()
            self.informers.append(informer)

    def seen(self, kind: Kind, key: tuple[str, str]) -> bool | None:
        """Whether an object of `kind` exists under `key` (namespace, name), as watched.

        None when that is not known here: the kind is not watched, its
        informer is filtered by labels, or it has not listed yet. A False is
        as fresh as the watch, so the write it lets go ahead still checks
        (a POST refuses a taken name).
        """
        for informer in self.informers:
            if informer.kind == kind:
                if informer.label_selector is not None or not informer.synced.is_set():
                    return None
                return informer.holds(key)
        return None

    def stop(self) -> None:
        """Stop every watch (blocking: run it in a thread)."""
        for informer in self.informers:
            informer.stop()
        self.informers = []
