"""Guards against checks that pass on nothing (issue 31).

`checks.every` must refuse an empty list, and the tables of differences must
state both sides' values on every row: a row without them let the tests
that compare our objects with Istio's accept any value at its field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checks import every
from upstream_diff import generator, matches


def test_every_refuses_nothing() -> None:
    with pytest.raises(AssertionError, match="no items to judge"):
        every([], lambda _: True)
    with pytest.raises(AssertionError, match="1 items, expected 2"):
        every([1], lambda _: True, count=2)


def test_every_names_what_fails() -> None:
    with pytest.raises(AssertionError, match=r"1 of 3 numbers fail the check: \[2\]"):
        every([1, 2, 3], lambda n: n % 2, "numbers")
    assert every((1, 3), lambda n: n % 2, "numbers", count=2) == [1, 3]


def test_every_row_states_both_sides() -> None:
    tables = generator().load_tables()
    assert sorted(tables) == ["linux", "platforms", "waypoint", "windows"]
    for name, rows in tables.items():
        every(rows, lambda row: row.upstream is not None and row.ours is not None, f"{name} rows")


@pytest.mark.parametrize(
    "values",
    [{}, {"upstream": "(absent)"}, {"ours": "1"}],
    ids=["neither", "no-ours", "no-upstream"],
)
def test_the_loader_refuses_a_row_without_values(tmp_path: Path, values: dict[str, str]) -> None:
    row = {"object": "ConfigMap/x", "field": "data.a", "reason": "Ours says so.", **values}
    table = tmp_path / "t.yaml"
    table.write_text("- " + "\n  ".join(f"{k}: {v!r}" for k, v in row.items()) + "\n")
    with pytest.raises(ValueError, match="missing keys"):
        generator().load_table(table)


def test_a_placeholder_stands_for_its_part_only() -> None:
    listed = '{"ambientoperator.io/desired-hash": "<hash>"}'
    assert matches(listed, '{"ambientoperator.io/desired-hash": "4081db6b7fb71824b5b6"}')
    assert not matches(listed, '{"ambientoperator.io/desired-hash": ""}')
    assert not matches(listed, '{"ambientoperator.io/desired-hash": "4081db6b7fb71824b5b6", "x"}')
    # The rest is literal text, not a pattern; a row without a value matches nothing.
    assert matches("1.30.4", "1.30.4") and not matches("1.30.4", "1x30x4")
    assert not matches(None, "(absent)")
