"""Forget cached objects that were deleted while no watch was looking.

The caches are filled by one list at start-up and kept current by kopf's
watches, which list again on their own once start-up is done. An object
deleted between the two lists is in neither kopf's list nor its watch: no
deletion event ever comes, and the cache keeps a ghost (seen in the suite: a
node deleted a second after the operator started was counted in the status
for good). kopf also lists again after an expired watch (410) without
reporting what disappeared meanwhile.

A sweep lists each kind and forgets what the cache holds, the list does not,
and the cache last saw at or before the list's resourceVersion: such an
object was deleted before the list was taken. Anything cached from an event
newer than the list is kept. The first sweep runs seconds after start-up,
once kopf's own lists are taken; then one per resync period, and one of a
kind soon after kopf listed it again, so a ghost lives seconds after a relist
and never longer than the period. Sweeps only read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import metrics
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import Kind, resource_version

log = logging.getLogger(__name__)
Key = tuple[str, str]


@dataclass(frozen=True)
class Target:
    """One cache of one kind, and how to forget an entry of it.

    `cached` returns the cache as {(namespace, name): object}; each object
    carries the resourceVersion it was last seen at. `forget` does what a
    deletion event would have done (on the event loop).
    """

    kind: Kind
    cached: Callable[[], Mapping[Key, Mapping[str, Any]]]
    forget: Callable[[Key], None]
    label_selector: str | None = None
    field_selector: str | None = None


def ghosts(cached: Mapping[Key, Mapping[str, Any]], listed: set[Key], version: int) -> list[Key]:
    """Keys cached, absent from a list taken at `version`, and not seen since. Pure."""
    return sorted(
        key
        for key, obj in cached.items()
        if key not in listed and 0 < resource_version(obj) <= version
    )


def list_keys(kube: Kube, target: Target) -> tuple[set[Key], int]:
    """The keys of every object of a target's kind, and the list's resourceVersion."""
    keys: set[Key] = set()
    version = 0
    for page in kube.pages(
        target.kind,
        label_selector=target.label_selector,
        field_selector=target.field_selector,
    ):
        for item in page.get("items") or []:
            meta = item.get("metadata") or {}
            keys.add((str(meta.get("namespace") or ""), str(meta.get("name") or "")))
        version = resource_version(page)
    return keys, version


async def sweep(kube: Kube, targets: Iterable[Target], cause: str = "period") -> int:
    """List every target and forget its ghosts; the number forgotten."""
    forgotten = 0
    for target in targets:
        metrics.CACHE_SWEEPS.labels(kind=target.kind.kind, cause=cause).inc()
        try:
            listed, version = await asyncio.to_thread(list_keys, kube, target)
        except KubeError as exc:
            if exc.status != 404:  # 404: the kind is not served (Gateway API missing)
                log.warning("sweep of %s failed: %s", target.kind.plural, exc)
            continue
        for key in ghosts(target.cached(), listed, version):
            log.info(
                "forgetting %s %s: deleted while not watched",
                target.kind.kind,
                "/".join(part for part in key if part),
            )
            target.forget(key)
            metrics.CACHE_GHOSTS.labels(kind=target.kind.kind).inc()
            forgotten += 1
    return forgotten


class Sweeps:
    """Sweeps every target once per period, and a target soon after its watch listed again.

    kopf reports a list it takes again (a watch that expired with 410, or a
    stream that broke) as events of no type, and never what vanished in the
    gap; :meth:`relisted` is told so, and the kind is swept `settle` seconds
    later, when the burst of that list has been recorded. A ghost then lives
    seconds after a relist instead of up to the resync period.
    """

    def __init__(
        self,
        kube: Kube,
        targets: Callable[[], Mapping[str, Target]],
        first_seconds: float,
        every_seconds: float,
        settle_seconds: float = 1.0,
    ) -> None:
        self.kube = kube
        self.targets = targets
        self.first_seconds = first_seconds
        self.every_seconds = every_seconds
        self.settle_seconds = settle_seconds
        self.relisted_ids: set[str] = set()
        self._wake = asyncio.Event()

    def relisted(self, target_id: str) -> None:
        """A watch listed its kind again; call on the event loop."""
        self.relisted_ids.add(target_id)
        self._wake.set()

    async def _due(self, deadline: float) -> set[str] | None:
        """The ids to sweep next, or None for all of them (the period ended)."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return None
        await asyncio.sleep(self.settle_seconds)
        self._wake.clear()
        due, self.relisted_ids = self.relisted_ids, set()
        return due

    async def run(self) -> None:
        """Sweep until cancelled: after `first_seconds`, every `every_seconds`, and on relists."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.first_seconds
        while True:
            due = await self._due(deadline)
            if due is None:
                deadline = loop.time() + self.every_seconds
            targets = self.targets()
            try:
                await sweep(
                    self.kube,
                    [t for i, t in targets.items() if due is None or i in due],
                    "period" if due is None else "relist",
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                # A sweep is a safety net: its failure must not end the operator.
                log.exception("sweep failed; trying again at the next one")
