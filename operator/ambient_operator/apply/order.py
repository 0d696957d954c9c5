"""In what order a pass's writes go, and how many at once.

A pass's objects are written in stages, one stage after the other; the
objects of a stage are independent of each other and go together, at most
WRITERS at a time, so that a pass of many objects does not wait on each
request in turn, nor floods the API server (which answers a flood with 429,
waited out by apply/writer.patient). The stages are what the objects need of
each other:

0. what the rest names: ServiceAccounts, Roles and ClusterRoles,
   ConfigMaps, ResourceQuotas (pods are refused until they exist),
   NetworkPolicies, Multus's attachment;
1. RoleBindings and ClusterRoleBindings: a binding to a role that does not
   exist yet is refused to a writer that may not `bind` it;
2. DaemonSets and Deployments, whose pods use all of the above; and a
   DaemonSet is not written when what it uses was refused in an earlier
   stage, which is complete by then.

The rollout across platforms (Linux first, then the Windows builds oldest
first) is render's, from pass to pass (render/rollout.py): a pass writes only
the platforms whose turn it is. A move's prunes come after every write
(controllers/dataplane.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from ambient_operator.apply.ownership import describe

# Writes in flight at once, per pass.
WRITERS = 6
_BINDINGS = frozenset({"RoleBinding", "ClusterRoleBinding"})
_POD_CARRIERS = frozenset({"DaemonSet", "Deployment"})

T = TypeVar("T", bound=Mapping[str, Any])
M = TypeVar("M")


def stage(obj: Mapping[str, Any]) -> int:
    """The stage an object is written in (see the module's docstring)."""
    kind = obj.get("kind")
    if kind in _POD_CARRIERS:
        return 2
    if kind in _BINDINGS:
        return 1
    return 0


def stages(objects: Iterable[T]) -> list[list[T]]:
    """The objects by stage, each stage in the order given; empty stages left out."""
    out: dict[int, list[T]] = {}
    for obj in objects:
        out.setdefault(stage(obj), []).append(obj)
    return [out[k] for k in sorted(out)]


async def write_in_order(
    objects: Iterable[T], one: Callable[[T], Awaitable[None]], limit: int = WRITERS
) -> None:
    """Await `one(obj)` for each object: stage after stage, at most `limit` at once in a stage.

    `one` reports its own outcome (it should not raise); an exception is
    raised here once the rest of its stage is done, and no later stage starts.
    """
    gate = asyncio.Semaphore(limit)

    async def guarded(obj: T) -> None:
        async with gate:
            await one(obj)

    for group in stages(objects):
        results = await asyncio.gather(*(guarded(obj) for obj in group), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


def in_pass_order(
    objects: Iterable[Mapping[str, Any]], reports: Iterable[M], text: Callable[[M], str]
) -> list[M]:
    """`reports` (each naming an object first, as `Kind namespace/name`) in the order of `objects`.

    Writes that went together finish in any order; what a pass reports of
    them (its status message) must not change with it, or an unchanged
    cluster would get its status written again. A report that names no
    object goes last, in its place among those.
    """
    rank: dict[str, int] = {}
    for index, obj in enumerate(objects):
        rank.setdefault(describe(obj), index)
    longest = sorted(rank, key=len, reverse=True)

    def place(report: M) -> int:
        said = text(report)
        for name in longest:
            if said.startswith(name) and said[len(name) : len(name) + 1] in ("", " ", ":"):
                return rank[name]
        return len(rank)

    return sorted(reports, key=place)
