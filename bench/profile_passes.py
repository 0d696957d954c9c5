"""Where a pass's time goes: py-spy samples of the operator during reaction trials.

    .venv/bin/python bench/profile_passes.py [--trials 40] [--rate 250] [--raw FILE]

Runs bench/reaction_latency.py's trials (a namespace label, a Gateway, a
Node each, isolated, interleaved) on a private cluster while py-spy samples
the operator process from outside (it adds no code to the process, and
its sampling costs the operator little). Each sample is one thread's stack;
a sample belongs to a job when its stack holds the job's entry point:

- gateway: one waypoint's pass (`WaypointGateways._reconcile_gateway`),
- node: the data plane's pass (`DataplaneController.reconcile`),
- namespace: the namespace checks (`NamespaceChecker.check`),
- admission: one webhook review (`Reviewer.review`), when pods are created;
- requests: the API calls the passes hand to worker threads (whose stacks
  do not hold the pass that asked), named by the function the thread runs.

py-spy records busy samples only (a thread blocked on a socket is idle),
so the figures are the operator's own work: per job, the milliseconds of
samples per trial and the functions with the most samples below the
entry point, inclusive (the function or anything it called) and self (the
frame at the top). py-spy comes from PyPI (`pip install py-spy`); it
needs to be allowed to read the process's memory (ptrace).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ambient_devcluster import LocalCluster, default_bin_dir
from benchlib import py_spy
from reaction_latency import ReactionBench, prepare

# The entry point of each job, as py-spy names frames: "function (file:line)".
JOBS = {
    "gateway": "_reconcile_gateway",
    "node": "DataplaneController.reconcile",
    "namespace": "NamespaceChecker.check",
    "admission": "Reviewer.review",
}
# The frame a worker thread runs its task from: the next frame names the task.
WORKER = ("_worker (thread.py)", "_WorkItem.run (thread.py)")


@dataclass
class Profile:
    """Samples of one job: inclusive and self counts by function."""

    samples: int = 0
    inclusive: Counter[str] = field(default_factory=Counter)
    own: Counter[str] = field(default_factory=Counter)


def _function(frame: str) -> str:
    """`name (module.py)`: a frame without its line number, so one function is one entry."""
    name, _, where = frame.partition(" (")
    path = where.split(":", 1)[0]
    return f"{name} ({path.rsplit('/', 1)[-1]})" if path else name


def stacks(lines: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output, `frame;frame;... count` with the outermost frame
    first, as (frames, count); lines of any other shape are passed over."""
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if stack and count_text.isdigit():
            yield stack.split(";"), int(count_text)


def overall(lines: Iterable[str]) -> Profile:
    """Every sample, whatever its job: the whole process's busy samples by function."""
    profile = Profile()
    for frames, count in stacks(lines):
        _add(profile, frames, count)
    return profile


def summarize(lines: Iterable[str]) -> dict[str, Profile]:
    """The samples of each job (JOBS, and the requests of worker threads), counted from the
    job's entry frame up."""
    profiles: dict[str, Profile] = {}
    for frames, count in stacks(lines):
        job, start = _job(frames)
        if job is not None:
            _add(profiles.setdefault(job, Profile()), frames[start:], count)
    return profiles


def _add(profile: Profile, frames: list[str], count: int) -> None:
    """One stack's samples: inclusive once per function however deep it recurs, and own
    for the frame on top."""
    profile.samples += count
    for name in dict.fromkeys(_function(frame) for frame in frames):
        profile.inclusive[name] += count
    profile.own[_function(frames[-1])] += count


def _job(frames: list[str]) -> tuple[str | None, int]:
    """The job a stack belongs to and the index of its entry frame."""
    for job, entry in JOBS.items():
        for i, frame in enumerate(frames):
            if entry in frame.split(" (", 1)[0]:
                return job, i
    names = [_function(frame) for frame in frames]
    for i in range(len(names) - 2):
        if (names[i], names[i + 1]) == WORKER:
            return "requests", i + 2
    return None, 0


def report(profiles: dict[str, Profile], trials: int, rate: int, top: int = 12) -> str:
    """The summary as text."""
    out = []
    for job, profile in profiles.items():
        if not profile.samples:
            continue
        per_trial = profile.samples / max(trials, 1) / rate * 1000
        out.append(f"\n{job}: {profile.samples} samples, {per_trial:.1f} ms of work per trial")
        out.append("  inclusive                                             self")
        inclusive = profile.inclusive.most_common(top)
        own = profile.own.most_common(top)
        for i in range(max(len(inclusive), len(own))):
            left = (
                f"{inclusive[i][1] / profile.samples:5.0%} {inclusive[i][0]}"
                if i < len(inclusive)
                else ""
            )
            right = f"{own[i][1] / profile.samples:5.0%} {own[i][0]}" if i < len(own) else ""
            out.append(f"  {left[:52]:52}  {right[:60]}")
    return "\n".join(out)


def as_json(profiles: dict[str, Profile], trials: int, rate: int, top: int = 8) -> dict[str, Any]:
    """The summary as data: per job, ms of work per trial and the top functions' shares."""
    out: dict[str, Any] = {"trials": trials, "rate": rate, "jobs": {}}
    for job, profile in profiles.items():
        if not profile.samples:
            continue
        out["jobs"][job] = {
            "samples": profile.samples,
            "ms_per_trial": profile.samples / max(trials, 1) / rate * 1000,
            "inclusive": [(f, n / profile.samples) for f, n in profile.inclusive.most_common(top)],
            "self": [(f, n / profile.samples) for f, n in profile.own.most_common(top)],
        }
    return out


def record(trials: int, rate: int, raw: Path | None = None, progress: Any = print) -> str:
    """py-spy's raw stacks of the operator during `trials` reaction trials, on a private cluster."""
    with (
        tempfile.TemporaryDirectory(prefix="profile-bench-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=default_bin_dir(), verbose=False) as cluster,
        cluster.api_client() as api,
    ):
        op = prepare(cluster, api, Path(tmp))
        raw = raw or Path(tmp) / "stacks.txt"
        try:
            bench = ReactionBench(api, op)
            try:
                bench.run(1, lambda _msg: None)  # warm-up, not sampled
                assert op.proc is not None
                with py_spy(op.proc.pid, raw, rate):
                    bench.run(trials, progress)
            finally:
                bench.close()
        finally:
            op.stop()
        return raw.read_text() if raw.exists() else ""


def measure(trials: int = 40, rate: int = 250, progress: Any = print) -> dict[str, Any]:
    """Profile the operator during reaction trials; the summary as data (for bench/run_all.py)."""
    text = record(trials, rate, progress=progress)
    return as_json(summarize(text.splitlines()), trials, rate)


def main(argv: list[str] | None = None) -> int:
    """Profile the operator during reaction trials and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--raw", help="also keep py-spy's collapsed stacks in this file")
    args = parser.parse_args(argv)
    try:
        text = record(args.trials, args.rate, Path(args.raw) if args.raw else None)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report(summarize(text.splitlines()), args.trials, args.rate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
