"""`make test`'s image build beside the rest (hack/run_tests.py) and the barrier the
tests that read images wait on (conftest.images_built), with real processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import conftest
import run_tests  # on the path through conftest
from conftest import wait_for


def test_the_build_beside_writes_its_end_and_its_log(tmp_path: Path) -> None:
    build = run_tests.Background(
        ["sh", "-c", "echo compiling; echo broken >&2; exit 3"], dict(os.environ), tmp_path
    )
    assert build.wait() == 3
    done = json.loads((tmp_path / "images.json").read_text())
    assert done["rc"] == 3
    assert done["wall_s"] >= 0 and done["cpu_s"] >= 0
    assert (tmp_path / "images.log").read_text() == "compiling\nbroken\n"


def test_stopping_the_build_stops_what_it_started(tmp_path: Path) -> None:
    # A child of its own, as cargo's rustc and go's compile are: the stop reaches it too.
    child_file = tmp_path / "child"
    build = run_tests.Background(
        ["sh", "-c", f"sleep 600 & echo $! > {child_file}; wait"], dict(os.environ), tmp_path
    )
    pid = int(wait_for(lambda: child_file.read_text().strip(), 10, "the child's pid"))
    build.stop()
    assert build.rc is not None and build.rc != 0
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, f"the build's child {pid} to end")
    assert json.loads((tmp_path / "images.json").read_text())["rc"] == build.rc


def test_the_barrier_passes_once_the_build_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "images.json").write_text(json.dumps({"rc": 0, "log": str(tmp_path / "log")}))
    monkeypatch.setenv(conftest.IMAGES_STATUS_ENV, str(tmp_path))
    conftest.images_built()


def test_the_barrier_fails_with_the_end_of_a_failed_builds_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "images.log"
    log.write_text("".join(f"line {n}\n" for n in range(100)) + "error: linker failed\n")
    (tmp_path / "images.json").write_text(json.dumps({"rc": 101, "log": str(log)}))
    monkeypatch.setenv(conftest.IMAGES_STATUS_ENV, str(tmp_path))
    with pytest.raises(pytest.fail.Exception) as failed:
        conftest.images_built()
    message = str(failed.value)
    assert "exit 101" in message
    assert message.endswith("line 99\nerror: linker failed\n")
    assert "line 60\n" not in message


def test_without_make_test_the_barrier_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(conftest.IMAGES_STATUS_ENV, raising=False)
    conftest.images_built()
