"""Rendered objects of representative inventories, byte for byte.

After an intended change, regenerate with `UPDATE_GOLDEN=1 pytest tests/test_render_golden.py`
and review the diff like code. That run writes the files and fails on purpose
("regenerated, review the diff"): an update can never turn a run green, and
with `CI` set it refuses to write at all. The next normal run is the check.
"""

from __future__ import annotations

import os

import pytest

from ambient_operator.render import output
from render_cases import CASES, GOLDEN, Case, summary

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
UNDER_CI = bool(os.environ.get("CI"))


def _check(path_name: str, actual: str) -> None:
    path = GOLDEN / path_name
    if UPDATE:
        if UNDER_CI:
            pytest.fail(f"UPDATE_GOLDEN=1 refused with CI set: {path} not written")
        before = path.read_text(encoding="utf-8") if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        change = "unchanged" if before == actual else "changed"
        pytest.fail(
            f"{path} regenerated ({change}), review the diff; run again without UPDATE_GOLDEN"
        )
    if not path.exists():
        pytest.fail(f"{path} missing; run with UPDATE_GOLDEN=1 to create it")
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{path} differs; rerun with UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_objects(case: Case) -> None:
    _check(f"{case.name}.yaml", output.to_yaml(case.render().objects))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_summary(case: Case) -> None:
    _check(f"{case.name}.summary.txt", summary(case.render()))
