"""Checks that cannot pass vacuously.

`all(...)` over an empty list is true, and so is a loop that asserts inside
but never runs: a render that refused, a list the API server returned empty,
a filter that matched nothing. `every` judges the items and that there are
any (or exactly `count` of them), and says which failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def every(
    items: Iterable[T], holds: Callable[[T], object], what: str = "items", count: int | None = None
) -> list[T]:
    """Assert that there is at least one item (exactly `count`, when given) and that
    `holds` is true of each; returns the items, so a caller can go on with them."""
    judged = list(items)
    if count is None:
        assert judged, f"no {what} to judge: the check would pass on nothing"
    else:
        assert len(judged) == count, f"{len(judged)} {what}, expected {count}: {judged!r}"
    failing = [item for item in judged if not holds(item)]
    assert not failing, f"{len(failing)} of {len(judged)} {what} fail the check: {failing!r}"
    return judged
