"""List and watch one kind on a thread of its own, handing small records to the event loop.

kopf runs every watch event through a per-object worker: cause detection,
diff bases, deep copies of the body, and the body kept until the worker
idles out. For pods, the busiest stream of any cluster, that was most of the
operator's CPU under pod churn (a profile during bench/webhook_latency.py:
about 60 % of the event loop's samples) and its start-up memory peak, while
the operator keeps only a few fields per pod. This reader parses the stream
itself, turns each object into a small record on its own thread, and hands
the records to the event loop in batches, so whole objects never queue.

The semantics are an informer's: a paged list, then a watch from the list's
resourceVersion with bookmarks; a broken connection resumes the watch from
the last version seen; an expired version (410) lists again, and objects
gone meanwhile are delivered as deletions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import urllib3

from ambient_operator.kube.client import LIST_PAGE_SIZE, Kube, KubeError
from ambient_operator.kube.resources import Kind

log = logging.getLogger(__name__)
T = TypeVar("T")
Key = tuple[str, str]
# The API server ends a watch after this; we open the next one from the last version.
WATCH_SECONDS = 300
# Bookmarks arrive about once a minute: silence for this long is a dead connection.
READ_TIMEOUT_SECONDS = WATCH_SECONDS + 30.0
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True)
class Change(Generic[T]):
    """One object added, modified or deleted; `record` is None for a deletion."""

    type: str
    key: Key
    record: T | None


class _ExpiredError(Exception):
    """The resourceVersion we watch from is too old: list again."""


def key_of(obj: Mapping[str, Any]) -> Key:
    """(namespace, name) of an object; namespace "" when cluster-scoped."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The newline-separated JSON documents of a watch, as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        while True:
            end = pending.find(b"\n")
            if end < 0:
                break
            line, pending = pending[:end], pending[end + 1 :]
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class Informer(Generic[T]):
    """Keeps a consumer on the event loop current with every object of one kind.

    `record` runs on the informer's thread and must be pure: it turns a whole
    object into what the consumer keeps. `deliver` runs on the event loop
    with a batch of changes, in the order the API server sent them.
    """

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        record: Callable[[Mapping[str, Any]], T],
        deliver: Callable[[list[Change[T]]], None],
        loop: asyncio.AbstractEventLoop,
        *,
        label_selector: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.record = record
        self.deliver = deliver
        self.loop = loop
        self.label_selector = label_selector
        self.page_size = page_size
        self.synced = threading.Event()
        self.lists = 0  # how many times the whole kind was listed (1 + relists)
        self._known: set[Key] = set()  # what the consumer was told exists
        self._pending: list[Change[T] | None] = []  # None: the end of a list
        self._scheduled = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._thread: threading.Thread | None = None

    # -- control --------------------------------------------------------------------
    def start(self) -> None:
        """List and watch from now on, until `stop`."""
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.kind.plural}", daemon=True
        )
        self._thread.start()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until the first complete list reached the consumer."""
        return self.synced.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching; an open watch is cut so the thread ends promptly."""
        self._stopping.set()
        response = self._response
        if response is not None:
            # Closing from another thread makes the blocked read fail at once. The
            # thread may have closed it meanwhile (the watch ended): nothing to cut.
            with contextlib.suppress(OSError):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                failures = 0
            except _ExpiredError:
                log.info("%s: watch expired; listing again", self.kind.plural)
                version = None
            except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stopping.is_set():
                    return
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning(
                    "%s: watch interrupted (%s); resuming in %.1fs", self.kind.plural, exc, delay
                )
                self._stopping.wait(delay)

    def _list(self) -> str:
        seen: set[Key] = set()
        version = ""
        changes: list[Change[T] | None] = []
        for page in self.kube.pages(
            self.kind, label_selector=self.label_selector, page_size=self.page_size
        ):
            self._emit(changes)  # the previous page, now that this one came
            changes = []
            for obj in page.get("items") or []:
                key = key_of(obj)
                seen.add(key)
                changes.append(Change("ADDED", key, self.record(obj)))
            version = str((page.get("metadata") or {}).get("resourceVersion") or "")
        # Objects deleted while we were not watching: the consumer must forget them.
        changes += [Change("DELETED", key, None) for key in self._known - seen]
        changes.append(None)
        self._known = seen
        self.lists += 1
        self._emit(changes)
        return version

    def _watch(self, version: str) -> str:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        if self.label_selector:
            query.append(("labelSelector", self.label_selector))
        try:
            response = self.kube.open_stream(self.kind.collection(), query, READ_TIMEOUT_SECONDS)
        except KubeError as exc:
            if exc.status == 410:
                raise _ExpiredError() from None
            raise
        self._response = response
        try:
            for line in _lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _ExpiredError()
                    raise KubeError(
                        int(obj.get("code") or 0), "WatchError", str(obj.get("message"))
                    )
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                key = key_of(obj)
                if kind == "DELETED":
                    self._known.discard(key)
                    self._emit([Change("DELETED", key, None)])
                else:
                    self._known.add(key)
                    self._emit([Change(str(kind), key, self.record(obj))])
        finally:
            self._response = None
            response.release_conn()
        return version

    # -- handing over to the event loop ------------------------------------------------
    def _emit(self, changes: list[Change[T] | None]) -> None:
        if not changes:
            return
        with self._lock:
            self._pending.extend(changes)
            if self._scheduled:
                return
            self._scheduled = True
        # A closed loop: the operator is stopping.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            self._scheduled = False
        changes = [change for change in batch if change is not None]
        if changes:
            self.deliver(changes)
        if len(changes) < len(batch):
            self.synced.set()
