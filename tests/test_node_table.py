"""The Node cache that logs its changes, the per-node reads kept from it, and the
platform marks' tally (cluster/node_table.py, cluster/platform.py).

A node event must cost its node: `PerNode` catches up with the names a
`NodeTable` logged since it last looked. Its answer must be what a walk of
every Node gives, whatever happened in between; and `MarkTally`'s guess what
`guess_platform` makes of all the marks.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient_operator.cluster import node_table
from ambient_operator.cluster.node_table import NodeTable, PerNode
from ambient_operator.cluster.platform import (
    MarkTally,
    detect_platform,
    guess_platform,
    node_mark,
)


def _node(name: str, version: int = 1, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(version), "labels": labels}}


def _name(node: Any) -> str:
    return str(node["metadata"]["name"])


def test_the_table_logs_which_names_changed_latest_first() -> None:
    table = NodeTable()
    table["a"] = _node("a")
    table["b"] = _node("b")
    assert (table.version, table.changed_since(0)) == (2, ["b", "a"])
    table["a"] = _node("a", 2)
    assert table.changed_since(2) == ["a"]
    assert table.pop("b")["metadata"]["name"] == "b"
    assert table.pop("b", None) is None  # nothing removed: nothing logged
    assert (table.version, table.changed_since(2)) == (4, ["b", "a"])
    del table["a"]
    assert table.changed_since(4) == ["a"] and table.changed_since(5) == []
    assert dict(table) == {}
    with pytest.raises(KeyError):
        table.pop("gone")


def test_the_table_refuses_writes_that_would_bypass_its_log() -> None:
    table = NodeTable({"a": _node("a")})
    for write in (
        lambda: table.update({"b": _node("b")}),
        lambda: table.setdefault("b", _node("b")),
        table.popitem,
        table.clear,
    ):
        with pytest.raises(TypeError):
            write()
    assert list(table) == ["a"] and table.changed_since(0) == ["a"]


def test_a_reader_too_far_behind_is_told_to_read_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_table, "LOG_SLACK", 2)
    table = NodeTable({"live": _node("live")})
    for i in range(4):  # four nodes come and go: four deleted names in the log
        table[f"n{i}"] = _node(f"n{i}")
        del table[f"n{i}"]
    # Three names are kept, two beyond the one live node: the oldest two (live's, n0's) went.
    assert table.changed_since(table.version - 3) == ["n3", "n2"]
    assert table.changed_since(0) is None


def test_per_node_reads_only_what_changed_in_a_table() -> None:
    table = NodeTable({name: _node(name) for name in ("c", "a", "b")})
    seen: list[tuple[str, str | None]] = []
    reads = PerNode(_name, lambda name, value: seen.append((name, value)))
    first = reads.update(table)
    assert first == ("a", "b", "c") and reads.reads == 3
    # The first readings follow none: a reader must look at every name.
    assert first.changed_since(0) is None
    seen.clear()
    table["b"] = _node("b", 2)
    table["d"] = _node("d")
    del table["a"]
    second = reads.update(table)
    assert second == ("b", "c", "d")
    assert reads.reads == 5
    assert sorted(seen, key=str) == [("a", None), ("b", "b"), ("d", "d")]
    assert second.changed_since(first.serial) == {"a", "b", "d"}
    assert second.changed_since(second.serial) == frozenset()
    # Set again with the very same object: nothing to read.
    table["c"] = table["c"]
    third = reads.update(table)
    assert third == ("b", "c", "d") and reads.reads == 5
    assert third.changed_since(second.serial) == {"c"}
    # Readings further back than the last ones: not known.
    assert third.changed_since(first.serial) is None
    # From a plain mapping, every name is looked at: not known either.
    assert reads.update(dict(table)).changed_since(third.serial) is None


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "touch", "delete"]),
        st.sampled_from([f"n{i}" for i in range(8)]),
        st.sampled_from(["linux", "windows", "eks", "aks", "bare", "aws"]),
    ),
    max_size=40,
)


def _marked(name: str, kind: str, version: int) -> dict[str, Any]:
    node = _node(name, version)
    if kind == "eks":
        node["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = "ng"
    elif kind == "aks":
        node["metadata"]["labels"]["kubernetes.azure.com/cluster"] = "c"
    elif kind == "aws":
        node["spec"] = {"providerID": f"aws:///zone/{name}"}
    else:
        node["metadata"]["labels"]["kubernetes.io/os"] = kind
    return node


@settings(max_examples=150, deadline=None)
@given(_OPS, st.integers(min_value=0, max_value=40))
def test_per_node_and_the_tally_agree_with_a_walk_of_every_node(
    ops: list[tuple[str, str, str]], read_every: int
) -> None:
    """Changes made between reads, read every `read_every` changes (0: after each)."""
    table = NodeTable()
    plain: dict[str, dict[str, Any]] = {}
    tally = MarkTally()
    marks = PerNode(node_mark, tally.set)
    from_plain = PerNode(node_mark)
    for step, (what, name, kind) in enumerate(ops, 1):
        if what == "delete":
            table.pop(name, None)
            plain.pop(name, None)
        elif what == "touch" and name in table:
            table[name] = table[name]  # the same object again
        else:
            table[name] = plain[name] = _marked(name, kind, step)
        if read_every == 0 or step % read_every == 0:
            expected = tuple(node_mark(plain[n]) for n in sorted(plain))
            assert marks.update(table) == expected
            assert from_plain.update(plain) == expected
            assert tally.guess() == detect_platform(plain.values())
    marks.update(table)
    assert tally.guess() == detect_platform(plain.values())


def test_the_tally_says_what_a_walk_of_every_mark_says() -> None:
    nodes = [
        _marked("b", "eks", 1),
        _marked("a", "eks", 1),
        _marked("c", "aks", 1),
        _marked("d", "aws", 1),
        _marked("e", "linux", 1),
    ]
    tally = MarkTally()
    for n in nodes:
        tally.set(_name(n), node_mark(n))
    guess = tally.guess()
    assert guess == guess_platform(m for n in nodes if (m := node_mark(n)) is not None)
    assert (guess.platform, guess.conflicting) == ("generic", True)
    assert guess.evidence == (
        "nodes point at 2 platforms (eks, aks): rendering for generic; set spec.platform "
        "to the one whose paths the Linux nodes use",
        "eks: 2 of 5 node(s), e.g. a: label eks.amazonaws.com/nodegroup",
        "aks: 1 of 5 node(s), e.g. c: label kubernetes.azure.com/cluster",
        "2 node(s) carry no platform's providerID or labels",
        "1 node(s) with providerID aws:// but no eks.amazonaws.com/nodegroup label: "
        "Kubernetes on that cloud's machines, not eks",
    )
    tally.set("c", None)
    tally.set("a", None)
    assert tally.guess().platform == "eks"
    assert (
        tally.guess().evidence[0]
        == "eks: 1 of 3 node(s), e.g. b: label eks.amazonaws.com/nodegroup"
    )
