"""Cold `make test`: a fresh clone with every cache empty, timed phase by phase.

    .venv/bin/python bench/cold_test.py [--builds-only] [--nice N] [--keep] [--out DIR]

CI's budget (DEVELOPERS.md) is under 60 minutes for a cold run on 2 cores. This
clones HEAD into a temporary folder and runs `make venv` and then `make test`
there, with nothing reused from this machine's caches: the build store
(AMBIENT_BIN_CACHE via XDG_CACHE_HOME, pip's cache included), Go's build and
module caches and Cargo's registry all point into the temporary folder. What a
fresh machine has anyway is kept: the Go and Rust toolchains, Debian's
packages, and the pinned source archives (AMBIENT_SOURCES, as .ci/run sets it).

For each phase it records the wall time and the CPU time of the phase's
processes (user + system, from wait4). On a machine shared with other work
the wall times are inflated; the CPU times are not, and CPU / cores bounds
what the phase needs on a quiet machine of that many cores.

Results: `--out` (bench/out/cold) holds results.json and the log; the table is printed.
`--builds-only` runs the builds alone instead, one after the other, for their CPU
time (`make test` runs the image build beside the rest: see hack/run_tests.py).
`--keep` leaves the temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Phase:
    """One step of `make test`, as measured."""

    name: str
    argv: list[str]
    wall_s: float = 0.0
    cpu_s: float = 0.0
    rc: int | None = None


def phases(builds_only: bool) -> list[Phase]:
    """`make venv`, then `make test` whole (hack/run_tests.py builds the images
    beside the rest), or with `builds_only` the builds alone, one after the other."""
    steps = [Phase("venv", ["make", "venv"])]
    if builds_only:
        steps.append(Phase("bins (control plane, node, registry)", ["make", "bins"]))
        steps.append(
            Phase(
                "images",
                ["env", "AMBIENT_IMAGE_BASES=stand-in", ".venv/bin/python", "-m", "ambient_images"],
            )
        )
    else:
        workers = os.environ.get("TEST_WORKERS", "2")
        steps.append(Phase("make test", ["make", "test", f"TEST_WORKERS={workers}"]))
    return steps


def run_phase(phase: Phase, cwd: Path, env: dict[str, str], nice: int, log: Path) -> None:
    """Run one phase to its end, recording wall and CPU time (its whole process tree)."""
    began = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n=== {phase.name}: {' '.join(phase.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            ["nice", "-n", str(nice), *phase.argv], cwd=cwd, env=env, stdout=out, stderr=out
        )
        # wait4's rusage covers the child and every descendant it waited for,
        # which is how make, go and cargo end their jobs.
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    phase.wall_s = round(time.monotonic() - began, 1)
    phase.cpu_s = round(usage.ru_utime + usage.ru_stime, 1)
    phase.rc = proc.returncode


def main() -> int:
    """Measure a cold `make test` and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--builds-only", action="store_true", help="stop before pytest")
    ap.add_argument("--nice", type=int, default=0, help="niceness of every phase")
    ap.add_argument("--keep", action="store_true", help="leave the temporary folder")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "cold")
    args = ap.parse_args()

    sources = os.environ.get("AMBIENT_SOURCES") or str(REPO.parent / "shared" / "sources")
    if not Path(sources, "MANIFEST").is_file():
        print(f"cold_test: no source archives at {sources} (set AMBIENT_SOURCES)", file=sys.stderr)
        return 2
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    top = Path(tempfile.mkdtemp(prefix="ambient-cold-"))
    work = top / "ambient-operator"
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    subprocess.run(["git", "checkout", "-q", head], cwd=work, check=True)
    env = {
        **os.environ,
        "AMBIENT_SOURCES": sources,
        "XDG_CACHE_HOME": str(top / "xdg"),
        "GOCACHE": str(top / "go-build"),
        "GOMODCACHE": str(top / "go-mod"),
        "CARGO_HOME": str(top / "cargo"),
        "PATH": f"{Path.home() / '.cargo' / 'bin'}:{os.environ.get('PATH', '')}",
        "CI": "true",
    }
    env.pop("AMBIENT_BIN_CACHE", None)
    log = top / "cold.log"
    steps = phases(args.builds_only)
    started = datetime.now(UTC)
    print(f"cold make test of {head[:12]} in {work} (log {log})", flush=True)
    for phase in steps:
        run_phase(phase, work, env, args.nice, log)
        print(
            f"  {phase.name:<40} wall {phase.wall_s:>8.1f} s  cpu {phase.cpu_s:>8.1f} s"
            f"  rc {phase.rc}",
            flush=True,
        )
        if phase.rc != 0:
            break
    # The image build's own figures, from beside the rest (hack/run_tests.py).
    images_status = work / ".cache" / "test-run" / "images.json"
    images = json.loads(images_status.read_text()) if images_status.is_file() else None
    if images:
        print(
            f"  {'(of which the image build, beside the rest)':<40} wall {images['wall_s']:>8.1f} s"
            f"  cpu {images['cpu_s']:>8.1f} s  rc {images['rc']}"
        )
    wall = sum(p.wall_s for p in steps)
    cpu = sum(p.cpu_s for p in steps)
    cores = os.cpu_count() or 1
    load = os.getloadavg()
    print(f"  {'total':<40} wall {wall:>8.1f} s  cpu {cpu:>8.1f} s  ({cores} cores)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "commit": head,
                "started": started.isoformat(timespec="seconds"),
                "cores": cores,
                "nice": args.nice,
                "load_at_end": load,
                "phases": [asdict(p) for p in steps],
                "images_beside": images,
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
            },
            indent=2,
        )
        + "\n"
    )
    shutil.copyfile(log, args.out / "cold.log")
    if args.keep:
        print(f"kept {top}")
    else:
        # Go's module cache is read-only on disk.
        subprocess.run(["chmod", "-R", "u+w", str(top)], check=False)
        shutil.rmtree(top, ignore_errors=True)
    return 0 if all(p.rc == 0 for p in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
