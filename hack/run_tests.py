"""`make test`'s run: the builds, the checks and pytest, with the image build beside them.

    .venv/bin/python hack/run_tests.py [--workers N] [-- PYTEST_ARGS...]

A cold image build is mostly two Rust builds of ztunnel (tens of CPU-minutes,
with long single-threaded link steps), and only three test files read images.
Run one after the other, as `make test` used to, the builds left a core idle
through their link steps and pytest left most of one idle while it waited on
control planes. So the image build starts first, in the background at the
lowest priority (`nice 19`: what the builds and the tests leave over), longest
image first; `make bins lint typecheck` and then pytest run in the foreground
at once. The image build's end is written to a status folder that pytest is
given (AMBIENT_IMAGES_STATUS); the fixtures that read images wait on it
(tests/conftest.py `images_built`), the rest never do.

The run fails when any part does; the image build's log is printed at its end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = REPO / ".venv" / "bin" / "python"
# Read by tests/conftest.py: the folder holding `images.json` once the build ends.
STATUS_ENV = "AMBIENT_IMAGES_STATUS"
STATUS_DIR = REPO / ".cache" / "test-run"


class Background:
    """The image build, running beside the rest; `images.json` is written when it ends."""

    def __init__(self, argv: list[str], env: dict[str, str], status: Path) -> None:
        self.status = status
        self.log = status / "images.log"
        self.began = time.monotonic()
        with self.log.open("wb") as out:
            # A session of its own, so that stopping it stops cargo and go beneath it.
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.rc: int | None = None
        self._thread = threading.Thread(target=self._reap, name="images", daemon=True)
        self._thread.start()

    def _reap(self) -> None:
        # wait4's rusage covers every process the build waited for (cargo, go, rustc).
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.rc = self.proc.returncode
        result = {
            "rc": self.rc,
            "wall_s": round(time.monotonic() - self.began, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "log": str(self.log),
        }
        tmp = self.status / "images.json.tmp"
        tmp.write_text(json.dumps(result) + "\n")
        tmp.replace(self.status / "images.json")

    def wait(self) -> int:
        """Wait for the build's end; its exit status."""
        self._thread.join()
        assert self.rc is not None
        return self.rc

    def stop(self) -> None:
        """Stop the build and everything it started, if it still runs."""
        if self.rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self._thread.join(timeout=30)
            if self.rc is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self._thread.join()


def run(argv: list[str], env: dict[str, str]) -> int:
    """Run a foreground step, its output passed through; its exit status."""
    print(f"run_tests: {' '.join(argv)}", flush=True)
    return subprocess.run(argv, cwd=REPO, env=env, check=False).returncode


def main() -> int:
    """Run `make test`'s steps; 0 when every one passed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", default=os.environ.get("TEST_WORKERS", "2"))
    ap.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = ap.parse_args()

    STATUS_DIR.mkdir(parents=True, exist_ok=True)
    for stale in STATUS_DIR.iterdir():
        stale.unlink()
    env = dict(os.environ)
    # mcr.microsoft.com is out of reach where the tests run: stand-in Windows bases.
    env.setdefault("AMBIENT_IMAGE_BASES", "stand-in")
    images = Background(
        ["nice", "-n", "19", str(PY), "-m", "ambient_images", "--longest-first"], env, STATUS_DIR
    )
    print(f"run_tests: the image build runs beside the rest (log {images.log})", flush=True)
    rc = 1
    try:
        rc = run(["make", "bins", "lint", "typecheck"], env)
        if rc == 0:
            workers = ["-n", args.workers, "--dist", "loadfile"] if args.workers != "0" else []
            rc = run(
                [str(REPO / ".venv" / "bin" / "pytest"), "-q", *workers, *args.pytest_args],
                {**env, STATUS_ENV: str(STATUS_DIR)},
            )
            # Every image is part of `make test`, whether or not a test read it.
            images_rc = images.wait()
            rc = rc or images_rc
    finally:
        images.stop()
        result = images.status / "images.json"
        print(f"\n=== the image build's log ({images.log})", flush=True)
        sys.stdout.write(images.log.read_text(errors="replace"))
        if result.is_file():
            done = json.loads(result.read_text())
            print(
                f"run_tests: the image build ended with {done['rc']} after {done['wall_s']} s"
                f" ({done['cpu_s']} s of CPU)",
                flush=True,
            )
        else:
            print("run_tests: the image build was stopped before its end", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
