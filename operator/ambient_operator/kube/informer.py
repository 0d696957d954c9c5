"""List and watch one kind on a thread of its own, handing records to the event loop.

Every kind the operator caches is read this way (app/watches.py for the
watch table, cluster/pods.py for pods). The stream is parsed here, each
object turned into a record on this thread (for pods, a few fields; for
the table's rows, the object, which each row copies what it keeps of),
and the records reach the event loop in batches. kopf's watches, used
before, ran every event through a per-object worker that held the body
through its handlers: most of the operator's CPU under pod churn, and at
a restart every object of the cluster alive at once.

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
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import urllib3

from ambient_operator.kube.client import LIST_PAGE_SIZE, Kube, KubeError
from ambient_operator.kube.resources import Kind, resource_version

log = logging.getLogger(__name__)
T = TypeVar("T")
Key = tuple[str, str]
# The API server ends a watch after this; we open the next one from the last version.
WATCH_SECONDS = 300
# Bookmarks arrive about once a minute: silence for this long is a dead connection.
READ_TIMEOUT_SECONDS = WATCH_SECONDS + 30.0
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
# A kind not served yet (Gateway API not installed) is asked for again this often.
NOT_SERVED_SECONDS = 10.0
# How long a list waits for the event loop to take a page before the next one.
DELIVERY_WAIT_SECONDS = 10.0
# Held by every informer of the process for one page of a list (see _list).
_LISTING = threading.Lock()


@dataclass(frozen=True)
class Change(Generic[T]):
    """One object added, modified or deleted.

    A deletion's `record` is that of the object's last state, or None when
    a list found it gone (its last state was never seen) or the consumer
    asked for no last states.
    """

    type: str
    key: Key
    record: T | None


@dataclass(frozen=True)
class Listed:
    """The end of a complete list: every key it held, and its resourceVersion."""

    keys: frozenset[Key]
    version: int


class _ExpiredError(Exception):
    """The resourceVersion we watch from is too old: list again."""


class _NotServedError(Exception):
    """The kind is not served (its CRD is not installed): ask again later."""


def ghosts(cached: Mapping[Key, Mapping[str, Any]], listed: Listed) -> list[Key]:
    """Keys cached, absent from a list, and last seen at or before it: deleted unseen. Pure.

    A cache may hold what no event told its informer (a write's response);
    anything seen after the list was taken is newer than it, and kept.
    """
    return sorted(
        key
        for key, obj in cached.items()
        if key not in listed.keys and 0 < resource_version(obj) <= listed.version
    )


def not_listed(informers: Iterable[Informer[Any]], timeout: float) -> list[str]:
    """Wait until each informer listed once; the kinds that did not, each with why.

    A kind the API server refuses to list is named with its refusal at once,
    not after `timeout`.
    """
    deadline = time.monotonic() + timeout
    late = []
    for informer in informers:
        if not informer.wait_synced(max(0.0, deadline - time.monotonic())):
            why = f" ({informer.refused})" if informer.refused else ""
            late.append(f"{informer.kind.plural}{why}")
    return late


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
    with a batch of changes, in the order the API server sent them; `listed`,
    when given, runs there after the changes of each complete list. With
    `last_states` False a deletion brings no record (none is made). A kind
    that is not served counts as listed and empty, and is asked for again
    every `not_served_seconds`. `unchanged`, when given, is asked on the
    informer's thread about a modified object while the consumer holds every
    change before it: True drops the event there, without waking the loop.
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
        listed: Callable[[Listed], None] | None = None,
        not_served_seconds: float = NOT_SERVED_SECONDS,
        last_states: bool = True,
        unchanged: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.record = record
        self.deliver = deliver
        self.listed = listed
        self.not_served_seconds = not_served_seconds
        self.last_states = last_states
        self.unchanged = unchanged
        # Modified objects dropped on this thread (`unchanged`), for tests that count them.
        self.dropped = 0
        self.loop = loop
        self.label_selector = label_selector
        self.page_size = page_size
        self.synced = threading.Event()
        # Why the API server refuses to list the kind (a 403: RBAC), until a list succeeds.
        self.refused: str | None = None
        self._settled = threading.Event()  # listed once, or refused
        self.lists = 0  # how many times the whole kind was listed (1 + relists)
        self._served = True  # whether the last list found the kind served
        self._known: set[Key] = set()  # what the consumer was told exists
        self._pending: list[Change[T] | Listed] = []
        self._scheduled = False
        # The loop is delivering a batch it took from _pending.
        self._delivering = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._delivered = threading.Event()  # the loop took what was pending
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
        """Block until the first complete list reached the consumer; whether it did.

        A refused list (`refused`) ends the wait at once: retrying it, as the
        informer does, cannot succeed until someone changes RBAC.
        """
        self._settled.wait(timeout)
        return self.synced.is_set()

    def holds(self, key: Key) -> bool:
        """Whether the last list, or an event since, showed an object under `key`.

        Read from the event loop: a set's membership test is atomic under the
        GIL, and this thread updates the set before it hands the event over,
        so the answer is never older than what the consumer holds.
        """
        return key in self._known

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
            except _NotServedError:
                version = None
                self._stopping.wait(self.not_served_seconds)
            except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stopping.is_set():
                    return
                if isinstance(exc, KubeError) and exc.status == 403 and version is None:
                    self.refused = exc.message
                    self._settled.set()
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning(
                    "%s: watch interrupted (%s); resuming in %.1fs", self.kind.plural, exc, delay
                )
                self._stopping.wait(delay)

    def _list(self) -> str:
        seen: set[Key] = set()
        version = ""
        pages = self.kube.pages(
            self.kind, label_selector=self.label_selector, page_size=self.page_size
        )
        try:
            while True:
                # One page, fetched, recorded and delivered, before any informer's
                # next: a restart lists every kind at once, and the heap a burst
                # grows stays the process's.
                with _LISTING:
                    page = next(pages, None)
                    if page is None:
                        break
                    changes: list[Change[T] | Listed] = []
                    for obj in page.get("items") or []:
                        key = key_of(obj)
                        seen.add(key)
                        # Known before delivered (`holds`); what the list lacks
                        # is taken out at its end.
                        self._known.add(key)
                        changes.append(Change("ADDED", key, self.record(obj)))
                    version = str((page.get("metadata") or {}).get("resourceVersion") or "")
                    page.clear()
                    del page
                    if changes:
                        self._delivered.clear()
                        self._emit(changes)
                        del changes
                        self._delivered.wait(DELIVERY_WAIT_SECONDS)
        except KubeError as exc:
            if exc.status != 404:
                raise
            if self.lists and not self._served:
                raise _NotServedError() from None  # still not served: nothing new to tell
            served = False  # nothing of it exists; what was known is gone with it
        else:
            served = True
        self._served = served
        # Objects deleted while we were not watching: the consumer must forget them.
        ending: list[Change[T] | Listed] = [
            Change("DELETED", key, None) for key in self._known - seen
        ]
        ending.append(Listed(frozenset(seen), int(version) if version.isdigit() else 0))
        self._known = seen
        self.lists += 1
        self.refused = None
        self._emit(ending)
        if not served:
            raise _NotServedError()
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
                    last = self.record(obj) if self.last_states else None
                    self._emit([Change("DELETED", key, last)])
                else:
                    self._known.add(key)
                    if kind == "MODIFIED" and self._unchanged(obj):
                        self.dropped += 1
                        continue
                    self._emit([Change(str(kind), key, self.record(obj))])
        finally:
            self._response = None
            response.release_conn()
        return version

    # -- handing over to the event loop ------------------------------------------------
    def _unchanged(self, obj: Mapping[str, Any]) -> bool:
        # Only a consumer that holds every change before this one can answer:
        # else an earlier change, still on its way, would be judged by a state
        # it replaces (a label set and set back would end set).
        if self.unchanged is None:
            return False
        with self._lock:
            if self._pending or self._delivering:
                return False
        try:
            return self.unchanged(obj)
        except Exception:  # a malformed object is the consumer's to judge, on the loop
            log.debug("%s: unchanged() failed; delivering", self.kind.plural, exc_info=True)
            return False

    def _emit(self, changes: list[Change[T] | Listed]) -> None:
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
            self._delivering = True
        changes: list[Change[T]] = []
        try:
            for item in batch:
                if isinstance(item, Change):
                    changes.append(item)
                    continue
                if changes:
                    self.deliver(changes)
                    changes = []
                if self.listed is not None:
                    self.listed(item)
                self.synced.set()
                self._settled.set()
            if changes:
                self.deliver(changes)
        finally:
            with self._lock:
                self._delivering = False
            # What was delivered is freed before a list fetches its next page.
            batch.clear()
            changes = []  # the consumer's list now: rebound, not cleared
            self._delivered.set()
