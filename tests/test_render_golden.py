"""Rendered objects of representative inventories, byte for byte.

After an intended change, regenerate with `UPDATE_GOLDEN=1 pytest tests/test_render_golden.py`
and review the diff like code.
"""

from __future__ import annotations

import os

import pytest

from ambient_operator.render import output
from render_cases import CASES, GOLDEN, Case, summary

UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _check(path_name: str, actual: str) -> None:
    path = GOLDEN / path_name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
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
