"""The Node cache, which remembers which Nodes changed, and the per-node reads kept from it.

A node's arrival, departure or change is keyed (cluster/watches.py): its
pass must cost that node, not the cluster. At 5,000 nodes, walking every
Node to find the one that changed, twice (facts and platform marks), with
the platform guessed again from every mark, was over a third of a full
node pass's CPU (bench/pass_cost.py: 26.4 ms, 16.5 ms without). `NodeTable`
is a dict that also keeps the order in which its names last changed, so
`PerNode` catches up with the changed names alone.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# Names kept in the change log beyond the live ones (those of deleted Nodes,
# mostly) before the oldest are forgotten; a reader further behind than that
# reads every Node once.
LOG_SLACK = 1024


class NodeTable(dict[str, dict[str, Any]]):
    """Nodes by name, as a dict, that also logs the order in which names changed.

    Every change goes through `__setitem__`, `__delitem__` or `pop` (the
    watches' only writes); the other writers of a dict are closed, so that
    no change can bypass the log.
    """

    def __init__(self, nodes: Mapping[str, dict[str, Any]] | None = None) -> None:
        super().__init__()
        # Counts changes; each logged name carries the count at its last change.
        self.version = 0
        self._log: OrderedDict[str, int] = OrderedDict()
        # Changes up to this count may have been forgotten.
        self._floor = 0
        for name, node in (nodes or {}).items():
            self[name] = node

    def _note(self, name: str) -> None:
        self.version += 1
        self._log[name] = self.version
        self._log.move_to_end(name)
        if len(self._log) > len(self) + LOG_SLACK:
            _, self._floor = self._log.popitem(last=False)

    def __setitem__(self, name: str, node: dict[str, Any]) -> None:
        super().__setitem__(name, node)
        self._note(name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._note(name)

    def pop(self, name: str, *default: Any) -> Any:
        """dict.pop, logged when something was removed."""
        if name in self:
            node = super().pop(name)
            self._note(name)
            return node
        if default:
            return default[0]
        raise KeyError(name)

    def _closed(self, *_: Any, **__: Any) -> Any:
        raise TypeError("NodeTable changes one name at a time: use [name] =, del or pop")

    update = setdefault = popitem = clear = __ior__ = _closed

    def changed_since(self, version: int) -> list[str] | None:
        """Names changed (set or removed) after `version`, latest first; None when some
        of those changes were forgotten (read every name instead)."""
        if version < self._floor:
            return None
        out = []
        for name, at in reversed(self._log.items()):
            if at <= version:
                break
            out.append(name)
        return out


# Serials of `Readings`, unique among every PerNode's.
_SERIALS = itertools.count(1)


class Readings(tuple[T, ...]):
    """One `PerNode.update`'s readings in name order: a tuple that also knows which
    names may have changed since the readings made before it.

    A consumer that kept what it made of those earlier readings (render's
    VerdictMemo) catches up from `changed_since` instead of comparing every
    node; any other consumer sees a tuple.
    """

    serial: int
    _base: int
    _changed: frozenset[str] | None

    def __new__(
        cls, items: Iterable[T], serial: int, base: int, changed: frozenset[str] | None
    ) -> Readings[T]:
        """Readings `serial`, of `items`; `changed`: the names that may differ from
        readings `base` (None: any may)."""
        out = super().__new__(cls, items)
        out.serial, out._base, out._changed = serial, base, changed
        return out

    def changed_since(self, serial: int) -> frozenset[str] | None:
        """Names whose reading may differ from those of readings `serial` (a name
        in neither is not among them); None when that is not known."""
        if serial == self.serial:
            return frozenset()
        if serial != self._base or not serial:
            return None
        return self._changed


class PerNode(Generic[T]):
    """What `read` makes of each Node, in name order, read again only for a changed Node.

    The caches replace a Node's object on each of its events: an unchanged
    Node is the same object. From a `NodeTable` only the names changed since
    the last call are looked at; from another mapping, every name (a look-up
    per Node).
    """

    def __init__(
        self,
        read: Callable[[Mapping[str, Any]], T],
        changed: Callable[[str, T | None], None] | None = None,
    ) -> None:
        self._read = read
        # Told each node's new reading as it is made, and None when a node goes:
        # for a tally kept beside (cluster/platform.py's MarkTally).
        self._changed = changed
        self._names: list[str] = []
        # Beside _names: each node's object and what `read` made of it.
        self._nodes: list[Mapping[str, Any]] = []
        self._out: list[T] = []
        # The table caught up with, and its version then.
        self._table: NodeTable | None = None
        self._version = 0
        # The serial of the last `Readings` made (0: none yet).
        self._serial = 0
        # Nodes read, for tests that count the work.
        self.reads = 0

    def update(self, nodes: Mapping[str, Mapping[str, Any]]) -> Readings[T]:
        """What `read` makes of each of `nodes` (by name), in name order, as `Readings`
        that tell the next caller which names changed since these."""
        changed = self.catch_up(nodes)
        readings = Readings(self._out, next(_SERIALS), self._serial, changed)
        self._serial = readings.serial
        return readings

    def catch_up(self, nodes: Mapping[str, Mapping[str, Any]]) -> frozenset[str] | None:
        """Read the nodes of `nodes` that changed since the last call; the names looked
        at, or None when every name was (`nodes` is not the table caught up with)."""
        changed = (
            nodes.changed_since(self._version)
            if isinstance(nodes, NodeTable) and nodes is self._table
            else None
        )
        if changed is None:
            self._catch_up(nodes, sorted(nodes.keys() | set(self._names)))
        else:
            self._catch_up(nodes, changed)
        if isinstance(nodes, NodeTable):
            self._table, self._version = nodes, nodes.version
        else:
            self._table = None
        return None if changed is None else frozenset(changed)

    def _catch_up(self, nodes: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> None:
        for name in names:
            at = bisect.bisect_left(self._names, name)
            known = at < len(self._names) and self._names[at] == name
            node = nodes.get(name)
            if node is None:
                if known:
                    del self._names[at], self._nodes[at], self._out[at]
                    self._tell(name, None)
                continue
            if known and self._nodes[at] is node:
                continue
            value = self._read(node)
            self.reads += 1
            if known:
                self._nodes[at], self._out[at] = node, value
            else:
                self._names.insert(at, name)
                self._nodes.insert(at, node)
                self._out.insert(at, value)
            self._tell(name, value)

    def _tell(self, name: str, value: T | None) -> None:
        if self._changed is not None:
            self._changed(name, value)
