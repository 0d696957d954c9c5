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
once kopf's own lists are taken; then one per resync period, so a ghost
lives at most that long. Sweeps only read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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


async def sweep(kube: Kube, targets: Iterable[Target]) -> int:
    """List every target and forget its ghosts; the number forgotten."""
    forgotten = 0
    for target in targets:
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
            forgotten += 1
    return forgotten


async def run_sweeps(
    kube: Kube,
    targets: Callable[[], Iterable[Target]],
    first_seconds: float,
    every_seconds: float,
) -> None:
    """Sweep `first_seconds` after start, then every `every_seconds`, until cancelled."""
    delay = first_seconds
    while True:
        await asyncio.sleep(delay)
        delay = every_seconds
        try:
            await sweep(kube, targets())
        except asyncio.CancelledError:
            raise
        except Exception:
            # A sweep is a safety net: its failure must not end the operator.
            log.exception("sweep failed; trying again at the next one")
