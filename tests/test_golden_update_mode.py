"""The golden tests' update mode can never make a run green (issue 15, point 1).

The golden module runs in a child pytest over a copy of its inputs, so the
repository's own golden files are never written here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from render_cases import DATA, GOLDEN, SAMPLES, TESTS

BROKEN = "linux-only.yaml"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """tests/ with the golden module, its inputs and the sample nodes it renders."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_render_golden.py", "render_cases.py"):
        shutil.copy(TESTS / name, tests / name)
    shutil.copytree(DATA, tests / DATA.name)
    shutil.copytree(GOLDEN, tests / GOLDEN.name)
    shutil.copytree(SAMPLES, tmp_path / SAMPLES.relative_to(TESTS.parent))
    return tmp_path


def _run(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "UPDATE_GOLDEN")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            "--rootdir",
            str(root),
            str(root / "tests" / "test_render_golden.py"),
        ],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=root,
        check=False,
        timeout=300,
    )


def test_update_mode_writes_then_fails_and_ci_refuses_it(copy: Path) -> None:
    golden = copy / "tests" / GOLDEN.name / BROKEN
    good = golden.read_text(encoding="utf-8")
    broken = good.replace("maxUnavailable: 1", "maxUnavailable: 99", 1)
    assert broken != good
    golden.write_text(broken, encoding="utf-8")

    normal = _run(copy)
    assert normal.returncode == 1, normal.stdout
    assert f"{BROKEN} differs" in normal.stdout

    refused = _run(copy, UPDATE_GOLDEN="1", CI="true")
    assert refused.returncode == 1, refused.stdout
    assert "refused with CI set" in refused.stdout
    assert golden.read_text(encoding="utf-8") == broken

    updated = _run(copy, UPDATE_GOLDEN="1")
    # Every golden test failed (none was skipped or deselected: not exit code 5).
    assert updated.returncode == 1, updated.stdout
    assert "16 failed" in updated.stdout, updated.stdout
    assert "regenerated (changed), review the diff" in updated.stdout
    assert "regenerated (unchanged), review the diff" in updated.stdout
    assert golden.read_text(encoding="utf-8") == good

    again = _run(copy)
    assert again.returncode == 0, again.stdout
    assert "16 passed" in again.stdout
