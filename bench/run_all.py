"""Every benchmark in one run: a table, charts, and docs/performance.md.

    .venv/bin/python bench/run_all.py [--quick] [--out DIR] [--doc FILE] [--from-results FILE]

Runs, each on a private local control plane started here:

1. reaction latency (issue 8) and node join (issue 4): bench/reaction_latency.py;
2. scale (issues 8 and 4): bench/scale.py;
3. webhook added latency: bench/webhook_latency.py;
4. waypoint Programmed time: bench/waypoint_programmed.py;
5. render time for 5,000 nodes: bench/render_scale.py (no cluster).

Prints a table of every figure against its target, writes PNG charts of
each latency distribution and results.json into `--out` (bench/out, not
committed), and docs/performance.md (committed) with the table, what was
measured, the machine, and what limits every missed target. `--quick` runs
few trials at a small scale as a smoke test and writes its document into
`--out` instead of docs/. `--from-results` rewrites the outputs from a saved
results.json without measuring anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datapath
import growth
from ambient_operator.kube.client import LIST_PAGE_SIZE

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
DOC = ROOT / "docs" / "performance.md"
MIB = 1024.0


@dataclass(frozen=True)
class Plan:
    """How much of each benchmark to run."""

    trials: int
    join_trials: int
    nodes: int
    namespaces: int
    waypoints: int
    pods: int
    creators: int
    pods_per_creator: int
    dry_runs: int
    waypoint_count: int
    render_nodes: int
    render_runs: int


FULL = Plan(200, 50, 500, 1000, 200, 5000, 20, 30, 200, 50, 5000, 15)
QUICK = Plan(10, 5, 50, 100, 20, 300, 4, 5, 20, 5, 5000, 3)


@dataclass(frozen=True)
class Figure:
    """One row of the summary table."""

    section: str
    name: str
    value: str
    target: str = ""
    met: bool | None = None


def log(message: str) -> None:
    """Progress on stderr with the time of day."""
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# -- measuring ------------------------------------------------------------------------------


def _guarded(results: dict[str, Any], key: str, work: Callable[[], Any]) -> None:
    """Run one benchmark; a failure is recorded and the others still run."""
    began = time.monotonic()
    log(f"{key}: starting")
    try:
        results[key] = work()
    except Exception as exc:
        traceback.print_exc()
        results[key] = {"error": f"{type(exc).__name__}: {exc}"}
    results.setdefault("durations", {})[key] = time.monotonic() - began
    results.setdefault("load", {})[key] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    log(f"{key}: done in {time.monotonic() - began:.0f}s")


PARTS = (
    "reaction",
    "scale",
    "scale_kcm",
    "scale4",
    "webhook",
    "waypoints",
    "waypoints_kcm",
    "istiod",
    "istiod_busy",
    "render",
    "join",
    "profile",
    "memory",
)
# py-spy's view of the operator during reaction trials (bench/profile_passes.py).
PROFILE_TRIALS = 40
# The allocations traced at this share of the scale run's size: tracing all of
# the full scale takes a quarter of an hour per snapshot on 2 cores.
MEMORY_SHARE = 4
# Trials of the race against istiod per reaction trial: each costs four Gateways.
ISTIOD_TRIALS_SHARE = 5
# Issue 4's own scenario: 1,000 namespaces (half enrolled) and 5,000 pods; it
# names no node count and no waypoints, so a tenth of issue 8's nodes and none.
ISSUE4_NODES_SHARE = 10
# The same scale run on a cluster whose kube-controller-manager may make more
# requests (its client defaults to 20/s, burst 30; managed offerings raise it):
# shows what of the convergence time is the controller manager's pace.
FAST_KCM = ["--kube-api-qps=100", "--kube-api-burst=200"]


def _commit() -> str:
    """The operator's code being measured: the commit, marked when the tree differs from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], check=False, cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    return sha + (" (uncommitted changes)" if git("status", "--porcelain", "operator") else "")


def measure(
    plan: Plan,
    quick: bool,
    only: set[str] | None = None,
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every benchmark (or `only` some, over a `previous` run); JSON-friendly.

    "join" alone re-measures the node join on a fresh cluster, without the
    reaction trials that otherwise come first.
    """
    # Imported here: the pure parts (tables, charts, the document) need none of this.
    import istiod_race
    import profile_passes
    import reaction_latency
    import render_scale
    import scale
    import waypoint_programmed
    import webhook_latency
    from ambient_devcluster import LocalCluster, default_bin_dir
    from benchlib import kube_version, machine

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = _commit()
    if previous is not None and only:
        results: dict[str, Any] = dict(previous)
        results.setdefault("remeasured", {}).update(
            dict.fromkeys(sorted(only), f"{now}, commit {commit}")
        )
    else:
        results = {
            "quick": quick,
            "plan": plan.__dict__,
            "started": now,
            "commit": commit,
            "machine": machine(),
        }
    wanted = set(only or PARTS) - ({"join"} if not only else set())
    with tempfile.TemporaryDirectory(prefix="ambient-bench-") as tmp:
        work = Path(tmp)

        def reaction() -> dict[str, Any]:
            with (
                LocalCluster(work / "reaction", bin_dir=default_bin_dir(), verbose=False) as cl,
                cl.api_client() as api,
            ):
                if not only:  # the machine table describes the full run
                    results["machine"] = machine(kube_version(api))
                measured = reaction_latency.measure(
                    cl, api, work, plan.trials, plan.join_trials, progress=log
                )
                # Kept with the figures: the section may be written at a later commit.
                return measured | {"debounce": _debounces()}

        def scaled() -> dict[str, Any]:
            with LocalCluster(work / "scale", bin_dir=default_bin_dir(), verbose=False) as cl:
                size = scale.Scale(plan.nodes, plan.namespaces, plan.waypoints, plan.pods)
                return scale.measure(cl, work, size, progress=log)

        def scaled_fast_kcm() -> dict[str, Any]:
            with LocalCluster(
                work / "scale-kcm",
                bin_dir=default_bin_dir(),
                verbose=False,
                extra_args={"kube-controller-manager": FAST_KCM},
            ) as cl:
                size = scale.Scale(plan.nodes, plan.namespaces, plan.waypoints, plan.pods)
                return scale.measure(cl, work, size, progress=log)

        def scaled_issue4() -> dict[str, Any]:
            with LocalCluster(work / "scale4", bin_dir=default_bin_dir(), verbose=False) as cl:
                size = scale.Scale(plan.nodes // ISSUE4_NODES_SHARE, plan.namespaces, 0, plan.pods)
                return scale.measure(cl, work, size, progress=log)

        def webhook() -> dict[str, Any]:
            return webhook_latency.measure(plan.creators, plan.pods_per_creator, 1, plan.dry_runs)

        def waypoints() -> dict[str, Any]:
            path = work / "waypoints.json"
            waypoint_programmed.main(["--count", str(plan.waypoint_count), "--json", str(path)])
            out: dict[str, Any] = json.loads(path.read_text())
            return out

        def waypoints_fast_kcm() -> dict[str, Any]:
            # The same, with kube-controller-manager allowed more requests: what of
            # a burst's time is its Deployment and ReplicaSet controllers' pace.
            path = work / "waypoints-kcm.json"
            kcm = [f"--kcm-arg={flag}" for flag in FAST_KCM]
            waypoint_programmed.main(
                ["--count", str(plan.waypoint_count), "--json", str(path), *kcm]
            )
            out: dict[str, Any] = json.loads(path.read_text())
            return out

        def istiod() -> dict[str, Any]:
            return istiod_race.measure(max(plan.trials // ISTIOD_TRIALS_SHARE, 3), log)

        def istiod_busy() -> dict[str, Any]:
            # Back to back (istiod_race.py --busy): two Gateways per trial, not four.
            trials = max(2 * plan.trials // ISTIOD_TRIALS_SHARE, 3)
            return istiod_race.measure(trials, log, busy=True)

        def join() -> dict[str, Any]:
            with (
                LocalCluster(work / "join", bin_dir=default_bin_dir(), verbose=False) as cl,
                cl.api_client() as api,
            ):
                op = reaction_latency.prepare(cl, api, work)
                try:
                    return reaction_latency.node_join(api, op, plan.join_trials, log)
                finally:
                    op.stop()

        for key, work_fn in (
            ("reaction", reaction),
            ("scale", scaled),
            ("scale_kcm", scaled_fast_kcm),
            ("scale4", scaled_issue4),
            ("webhook", webhook),
            ("waypoints", waypoints),
            ("waypoints_kcm", waypoints_fast_kcm),
            ("istiod", istiod),
            ("istiod_busy", istiod_busy),
        ):
            if key in wanted:
                _guarded(results, key, work_fn)
        if "join" in wanted:
            _guarded(results, "join", join)
            samples = results.pop("join")
            if "error" not in samples and not _failed(results.get("reaction")):
                results["reaction"]["join"] = samples

        def render() -> dict[str, Any]:
            out = dict(render_scale.measure(plan.render_nodes, plan.render_runs))
            out["load"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            return out

        if "render" in wanted:
            _guarded(results, "render", render)

        def profile() -> dict[str, Any]:
            return profile_passes.measure(PROFILE_TRIALS, progress=lambda _msg: None)

        def memory() -> dict[str, Any]:
            with LocalCluster(work / "memory", bin_dir=default_bin_dir(), verbose=False) as cl:
                size = scale.Scale(
                    plan.nodes // MEMORY_SHARE,
                    plan.namespaces // MEMORY_SHARE,
                    plan.waypoints // MEMORY_SHARE,
                    plan.pods // MEMORY_SHARE,
                )
                return scale.measure(cl, work, size, progress=log, tracemalloc=True)

        for key, work_fn in (("profile", profile), ("memory", memory)):
            if key in wanted:
                _guarded(results, key, work_fn)
    if not only:
        results["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return results


# -- figures --------------------------------------------------------------------------------


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty sample."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _failed(part: Any) -> str | None:
    if part is None:
        return "not run"
    if isinstance(part, dict) and "error" in part:
        return str(part["error"])
    return None


REACTIONS = {
    "namespace": "namespace label → Warning Event",
    "gateway": "Gateway created → waypoint Deployment",
    "node": "node joins → AmbientMesh status",
}


def figures(results: dict[str, Any]) -> list[Figure]:
    """Every figure of a run against its target (pure)."""
    out: list[Figure] = []
    reaction = results.get("reaction")
    section = "Reaction latency (issue 8)"
    failed = _failed(reaction)
    if failed:
        out.append(Figure(section, "all", f"not measured: {failed}", "", False))
    else:
        samples = reaction["reaction"]
        chain = quantile(samples["chain floor"], 0.5)
        for kind, label in REACTIONS.items():
            op, floor = samples[kind], samples[f"{kind} floor"]
            p50, floor50 = quantile(op, 0.5), quantile(floor, 0.5)
            out.append(
                Figure(
                    section,
                    f"{label}: p50 / p95 / p99 (n={len(op)})",
                    f"{_ms(p50)} / {_ms(quantile(op, 0.95))} / {_ms(quantile(op, 0.99))}",
                )
            )
            out.append(
                Figure(
                    section,
                    f"{label}: p50 ÷ floor p50 ({_ms(floor50)})",
                    f"{p50 / floor50:.1f}x",
                    "≤ 2x",
                    p50 / floor50 <= 2,
                )
            )
            out.append(
                Figure(
                    section, f"{label}: p50 ÷ chain floor p50 ({_ms(chain)})", f"{p50 / chain:.1f}x"
                )
            )
        join = reaction["join"]["ztunnel"]
        section = "Node join (issue 4)"
        out.append(
            Figure(
                section,
                f"WS2025 node → its DaemonSet exists: p50 (n={len(join)})",
                _ms(quantile(join, 0.5)),
                "< 1 s",
                quantile(join, 0.5) < 1.0,
            )
        )
        out.append(Figure(section, "same, p99", _ms(quantile(join, 0.99))))
        desired = reaction["join"]["desired=1"]
        out.append(
            Figure(
                section,
                "… → desiredNumberScheduled=1 (controller manager): p50",
                _ms(quantile(desired, 0.5)),
            )
        )
    out.extend(_scale_figures(results.get("scale")))
    fast = results.get("scale_kcm")
    if fast is not None and not _failed(fast):
        out.append(
            Figure(
                "Scale (issues 8 and 4)",
                f"time to converge, kube-controller-manager at {FAST_KCM[0].split('=')[1]} "
                "requests/s (same run otherwise)",
                f"{float(fast['milestones']['converged']):.1f} s",
            )
        )
    out.extend(_issue4_figures(results.get("scale4")))
    out.extend(_webhook_figures(results.get("webhook")))
    out.extend(_waypoint_figures(results.get("waypoints")))
    fast_wp = results.get("waypoints_kcm")
    if fast_wp is not None and not _failed(fast_wp) and fast_wp.get("burst"):
        done = fast_wp["burst"]["programmed"]
        out.append(
            Figure(
                "Waypoints",
                f"same burst, kube-controller-manager at {FAST_KCM[0].split('=')[1]} "
                f"requests/s (own cluster): p50 (n={len(done)})",
                f"{quantile(done, 0.5):.2f} s",
            )
        )
    out.extend(_istiod_figures(results.get("istiod")))
    if "istiod_busy" in results:
        out.extend(_istiod_figures(results["istiod_busy"]))
    render = results.get("render")
    failed = _failed(render)
    section = "Render"
    if failed:
        out.append(Figure(section, "render", f"not measured: {failed}", "", False))
    else:
        n = int(render["nodes"])
        out.append(
            Figure(
                section,
                f"render_dataplane, {n:,} nodes (median of {int(render['runs'])})",
                f"{render['render_ms']:.1f} ms",
                "< 100 ms",
                render["render_ms"] < 100,
            )
        )
        out.append(Figure(section, f"NodeFacts.from_node x {n:,}", f"{render['facts_ms']:.1f} ms"))
    return out


def _issue4_figures(scale: Any) -> list[Figure]:
    if scale is None:
        return []
    section = "Scale, issue 4's scenario"
    failed = _failed(scale)
    if failed:
        return [Figure(section, "all", f"not measured: {failed}", "", False)]
    size = scale["scale"]
    what = (
        f"{size['namespaces']:,} namespaces (half enrolled), {size['pods']:,} pods, "
        f"{size['nodes']:,} nodes"
    )
    converged = float(scale["milestones"]["converged"])
    rss = float(scale["rss_peak_kib"]) / MIB
    noop = len(scale["noop_writes"])
    return [
        Figure(
            section, f"time to converge ({what})", f"{converged:.1f} s", "< 30 s", converged < 30
        ),
        Figure(section, "operator peak RSS (VmHWM)", f"{rss:.0f} MiB", "< 250 MiB", rss < 250),
        Figure(section, "writes on a no-op restart + 2 resyncs", str(noop), "0", noop == 0),
    ]


def _scale_figures(scale: Any) -> list[Figure]:
    section = "Scale (issues 8 and 4)"
    failed = _failed(scale)
    if failed:
        return [Figure(section, "all", f"not measured: {failed}", "", False)]
    size = scale["scale"]
    what = (
        f"{size['nodes']:,} nodes, {size['namespaces']:,} namespaces, "
        f"{size['waypoints']:,} waypoints, {size['pods']:,} pods"
    )
    converged = float(scale["milestones"]["converged"])
    rss = float(scale["rss_peak_kib"]) / MIB
    requests = scale["requests"]
    noop = len(scale["noop_writes"])
    return [
        Figure(
            section, f"time to converge ({what})", f"{converged:.1f} s", "< 60 s", converged < 60
        ),
        Figure(
            section,
            "time to converge against issue 4's target (at this larger scale)",
            f"{converged:.1f} s",
            "< 30 s",
            converged < 30,
        ),
        Figure(
            section,
            "API requests until converged (reads / writes)",
            f"{sum(v for k, v in requests.items() if k in ('get', 'list', 'watch'))} / "
            f"{sum(v for k, v in requests.items() if k not in ('get', 'list', 'watch'))}",
        ),
        Figure(section, "operator peak RSS (VmHWM)", f"{rss:.0f} MiB", "< 300 MiB", rss < 300),
        Figure(
            section,
            "operator peak RSS against issue 4's target (at this larger scale)",
            f"{rss:.0f} MiB",
            "< 250 MiB",
            rss < 250,
        ),
        Figure(section, "writes on a no-op restart + 2 resyncs", str(noop), "0", noop == 0),
    ]


def _added(samples: dict[str, list[float]], kind: str, q: float) -> float:
    """What `kind`'s webhook adds to pod creation at quantile q (s): its minus the baseline's."""
    return quantile(samples[kind], q) - quantile(samples["without"], q)


def _added_ms(samples: dict[str, list[float]], kind: str) -> str:
    """`kind`'s added latency, p99 / p50."""
    return f"{_ms(_added(samples, kind, 0.99))} / {_ms(_added(samples, kind, 0.5))}"


def _ratios(samples: dict[str, list[float]], kind: str) -> str:
    """Ours over `kind`'s added latency, p99 / p50."""
    out = []
    for q in (0.99, 0.5):
        theirs = _added(samples, kind, q)
        # At or under zero the other webhook's cost is inside the noise: no ratio.
        out.append(f"{_added(samples, 'with', q) / theirs:.2f}x" if theirs > 0 else "n/a")
    return " / ".join(out)


def _webhook_figures(hook: Any) -> list[Figure]:
    section = "Webhook"
    failed = _failed(hook)
    if failed:
        return [Figure(section, "all", f"not measured: {failed}", "", False)]
    load, idle = hook["load"], hook["idle"]
    added99 = _added(load, "with", 0.99)
    level = f"{hook['creators']} concurrent creators"
    out = [
        Figure(
            section,
            f"added pod-create latency, {level}: p99",
            _ms(added99),
            "< 20 ms",
            added99 < 0.020,
        ),
        Figure(section, "same, p50", _ms(_added(load, "with", 0.5))),
        *_other_webhook_figures(section, load, level),
    ]
    sequential = hook.get("sequential")
    if sequential:
        level = "1 creator, sequential real creates"
        out += [
            Figure(
                section,
                f"added pod-create latency, {level}: p99 / p50",
                _added_ms(sequential, "with"),
            ),
            *_other_webhook_figures(section, sequential, level),
        ]
    return [
        *out,
        Figure(
            section,
            "added latency, idle sequential dry-run creates: p50",
            _ms(_added(idle, "with", 0.5)),
        ),
        Figure(section, "handler decision time, mean", f"{hook['decision_ms']:.3f} ms"),
    ]


# The other webhooks of the same run: what each adds, and ours over it.
OTHER_WEBHOOKS = {
    "null": ("a webhook doing no work (same run, own process)", "the no-op webhook's"),
    "istiod": ("istiod's sidecar injector (same run, real istiod)", "istiod's injector"),
}


def _other_webhook_figures(section: str, samples: dict[str, Any], level: str) -> list[Figure]:
    out = []
    for kind, (what, short) in OTHER_WEBHOOKS.items():
        if samples.get(kind):
            out += [
                Figure(section, f"added by {what}, {level}: p99 / p50", _added_ms(samples, kind)),
                Figure(section, f"ours ÷ {short}, {level}: p99 / p50", _ratios(samples, kind)),
            ]
    return out


def _istiod_figures(race: Any) -> list[Figure]:
    section = "Waypoints vs istiod (issue 18)"
    failed = _failed(race)
    if failed:
        return [Figure(section, "all", f"not measured: {failed}", "", False)]
    samples = race["samples"]
    chain = samples["chain floor"]
    floor50, floor99 = quantile(chain, 0.5), quantile(chain, 0.99)
    out: list[Figure] = []
    modes = [m for m in ("fresh", "known", "busy") if samples.get(f"ours {m} deployment")]
    for mode in modes:
        ours, theirs = samples[f"ours {mode} deployment"], samples[f"istiod {mode} deployment"]
        p50, p99, their50 = quantile(ours, 0.5), quantile(ours, 0.99), quantile(theirs, 0.5)
        their99 = quantile(theirs, 0.99)
        label = f"Gateway created → its Deployment, {mode} namespace"
        out += [
            Figure(
                section,
                f"{label}: p50 ours / istiod's (n={len(ours)})",
                f"{_ms(p50)} / {_ms(their50)}",
                "ours ≤ istiod's",
                p50 <= their50,
            ),
            Figure(
                section,
                f"{label}: p99 ours / istiod's, ours ÷ istiod's",
                f"{_ms(p99)} / {_ms(their99)}, {p99 / their99:.2f}x",
                "ours ≤ istiod's",
                p99 <= their99,
            ),
            Figure(
                section,
                f"{label}: ours p50 ÷ chain floor p50 ({_ms(floor50)})",
                f"{p50 / floor50:.1f}x",
                "≤ 1.5x",
                p50 / floor50 <= 1.5,
            ),
            Figure(
                section,
                f"{label}: ours p99 ÷ chain floor p99 ({_ms(floor99)})",
                f"{p99 / floor99:.1f}x",
                "≤ 3x",
                p99 / floor99 <= 3,
            ),
        ]
        ours_p, theirs_p = samples[f"ours {mode} programmed"], samples[f"istiod {mode} programmed"]
        out.append(
            Figure(
                section,
                f"Gateway created → Programmed=True, {mode} namespace: p50 ours / istiod's",
                f"{_ms(quantile(ours_p, 0.5))} / {_ms(quantile(theirs_p, 0.5))}",
            )
        )
    return out


def _profile_section(results: dict[str, Any]) -> list[str]:
    prof = results.get("profile")
    text = ["### Where the time goes (py-spy)", ""]
    if prof is None or _failed(prof):
        return [*text, f"Not measured: {_failed(prof) or 'not in this run'}.", ""]
    text += [
        "bench/profile_passes.py's `measure()`: py-spy samples the operator "
        f"({prof['rate']} per second, every thread) during {prof['trials']} reaction trials "
        "(a namespace label, a Gateway, a Node each). A sample belongs to a job when its "
        "stack holds the job's entry point; `requests` are the API calls the passes hand to "
        "worker threads. Busy samples only: time blocked on a socket is not work. Shares are "
        "of the job's samples; inclusive counts a function and what it called.",
        "",
        "| job | work per trial | top inclusive | top self |",
        "|---|---|---|---|",
    ]
    for job, row in prof["jobs"].items():
        inclusive = "<br>".join(f"{share:.0%} `{fn}`" for fn, share in row["inclusive"][1:6])
        own = "<br>".join(f"{share:.0%} `{fn}`" for fn, share in row["self"][:5])
        text.append(f"| {job} | {row['ms_per_trial']:.1f} ms | {inclusive} | {own} |")
    return [*text, ""]


def _memory_section(results: dict[str, Any]) -> list[str]:
    mem = results.get("memory")
    text = ["### Where the memory goes (tracemalloc)", ""]
    if mem is None or _failed(mem):
        return [*text, f"Not measured: {_failed(mem) or 'not in this run'}.", ""]
    size = mem["scale"]
    text += [
        "bench/scale.py's `measure(tracemalloc=True)` at a quarter of the scale run's size "
        f"({size['nodes']} nodes, {size['namespaces']} namespaces, {size['waypoints']} "
        f"waypoints, {size['pods']} pods): the operator runs with `PYTHONTRACEMALLOC=10` and "
        "reports its largest holders (runtime/memory.py) at convergence and after the no-op "
        "restart. Tracing makes the process larger and slower; its resident sets here are "
        "not comparable with the scale run's. `callers` charges each allocation to the "
        "innermost frame of the operator or kopf above it: whose data it is.",
        "",
    ]
    reports = mem.get("memory_reports", [])
    for name, rep in zip(("at convergence", "after the restart"), reports, strict=False):
        traced = rep["traced_bytes"]
        text += [
            f"**{name.capitalize()}:** traced {traced / 2**20:.1f} MiB now, "
            f"{rep['traced_peak_bytes'] / 2**20:.1f} MiB at its peak.",
            "",
            "| holder (innermost operator or kopf frame) | MiB |",
            "|---|---|",
            *(f"| `{who}` | {size_b / 2**20:.1f} |" for who, size_b in rep["callers"][:10]),
            "",
        ]
    return text


# The race's runs in the document: (results key, heading, what was done; {gap} the busy
# race's wait between a namespace and its Gateway).
RACES = (
    (
        "istiod",
        "### Waypoints raced against istiod's",
        "bench/istiod_race.py's `measure()`, on a private cluster with Istio installed from its "
        "own charts and the real istiod (pilot-discovery from the pinned module): per trial, a "
        "Gateway of istiod's class `istio-waypoint` and one of ours, alternating which goes "
        "first, each in a namespace created right before it (fresh) and in one that exists "
        "(known), timed from the create request to the watch event of its Deployment, of an "
        "available pod, and of Programmed=True. istiod's Programmed waits for the Service's "
        "address only, ours for an available pod too. The chain floor is a zero-logic "
        "reactor answering a write with a write in the benchmark's process.",
    ),
    (
        "istiod_busy",
        "#### Back to back (a busy cluster)",
        "The same race with `--busy`: no wait for quiet anywhere; each trial deletes the "
        "previous trial's namespaces, then per class creates a namespace and its Gateway "
        "{gap} s later, while those deletions and the previous Gateways' rollouts go on.",
    ),
)


def _istiod_section(results: dict[str, Any]) -> list[str]:
    text: list[str] = []
    for key, heading, about in RACES:
        race = results.get(key)
        if key != "istiod" and race is None:
            continue  # the busy race is newer than some runs' results
        text += [heading, ""]
        if _failed(race):
            text += [f"Not measured: {_failed(race)}.", ""]
            continue
        text += [
            about.format(gap=race.get("busy_gap_s")),
            "",
            _quantile_table(race["samples"]),
            "",
            *_race_parts(race.get("parts") or {}),
        ]
    return text


# kube-apiserver's wait for a namespace its cache has not seen (see _race_parts).
NAMESPACE_WAIT_S = 0.050


def _race_parts(parts: dict[str, list[dict[str, float]]]) -> list[str]:
    """Where each side's time to its Deployment went: p50 of each part and the slowest trial."""
    from reaction_latency import PARTS

    if not parts:
        return []
    lines = [
        "**Where the time to the Deployment goes**, from the audit log as in the reaction "
        "section: the trigger (the Gateway's create in the API server), the controller's "
        "share until its first request for the waypoint's objects in the Gateway's "
        "namespace, those requests, and the rest; at p50 and in the slowest trial of each "
        "series. Ours are the operator's user's requests; istiod runs as the devcluster's "
        "admin, like this client, and its requests are told apart by their user agent:",
        "",
        "| | n | trigger | controller's share | its requests | rest |",
        "|---|---|---|---|---|---|",
    ]
    for series, trials in parts.items():
        p50 = " | ".join(f"{quantile([t[p] for t in trials], 0.5) * 1000:.1f} ms" for p in PARTS)
        lines.append(f"| {series}, p50 | {len(trials)} | {p50} |")
        slowest = max(trials, key=lambda t: sum(t.values()))
        worst = " | ".join(f"{slowest[p] * 1000:.1f} ms" for p in PARTS)
        lines.append(f"| {series}, slowest | 1 | {worst} |")
    waits = {
        series: sum(t["trigger"] >= NAMESPACE_WAIT_S for t in trials)
        for series, trials in parts.items()
    }
    lines += [
        "",
        f"Trials whose trigger took {NAMESPACE_WAIT_S * 1000:.0f} ms or more: "
        + ", ".join(f"{series} {n} of {len(parts[series])}" for series, n in waits.items())
        + ". kube-apiserver's NamespaceLifecycle admission sleeps 50 ms before it admits "
        "a create into a namespace its own cache has not seen yet (`missingNamespaceWait` in "
        "k8s.io/apiserver, plugin/namespace/lifecycle); in a fresh namespace that happens "
        "before either controller is told of the Gateway.",
    ]
    return [*lines, ""]


def _waypoint_figures(wp: Any) -> list[Figure]:
    section = "Waypoints"
    failed = _failed(wp)
    if failed:
        return [Figure(section, "all", f"not measured: {failed}", "", False)]
    out = []
    for mode, samples in wp.items():
        done = samples["programmed"]
        p50 = quantile(done, 0.5)
        out.append(
            Figure(
                section,
                f"Gateway created → Programmed=True, {mode}: p50 (n={len(done)})",
                f"{p50:.2f} s",
                "< 2 s",
                p50 < 2,
            )
        )
    return out


def table(rows: list[Figure]) -> str:
    """The summary as a Markdown table (pure)."""
    lines = ["| | figure | value | target | met |", "|---|---|---|---|---|"]
    section = ""
    for row in rows:
        shown = row.section if row.section != section else ""
        section = row.section
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(f"| {shown} | {row.name} | {row.value} | {row.target} | {met} |")
    return "\n".join(lines)


# -- charts -----------------------------------------------------------------------------


def charts(results: dict[str, Any], out: Path) -> list[Path]:
    """PNG charts (ECDFs) of every latency distribution; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def ecdf(name: str, title: str, series: dict[str, list[float]], unit: str = "ms") -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        scale = 1000.0 if unit == "ms" else 1.0
        for label, values in series.items():
            if not values:
                continue
            xs = sorted(v * scale for v in values)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")
        ax.set_xscale("log")
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction of trials ≤ x")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    reaction = results.get("reaction")
    if not _failed(reaction):
        samples = reaction["reaction"]
        for kind, label in REACTIONS.items():
            ecdf(
                f"reaction-{kind}",
                f"Reaction latency: {label}",
                {
                    "operator": samples[kind],
                    "floor: same write, own watch event": samples[f"{kind} floor"],
                    "chain floor: write→watch→write→watch": samples["chain floor"],
                },
            )
        join = reaction["join"]
        ecdf(
            "node-join",
            "WS2025 node joins → its DaemonSets",
            {
                "ztunnel DaemonSet exists": join["ztunnel"],
                "istio-cni DaemonSet exists": join["istio-cni"],
                "desiredNumberScheduled=1": join["desired=1"],
            },
        )
    hook = results.get("webhook")
    if not _failed(hook):
        ecdf(
            "webhook",
            "Pod create latency with and without the webhook",
            {
                "load, with webhook": hook["load"]["with"],
                "load, without": hook["load"]["without"],
                **(
                    {"load, no-op webhook": hook["load"]["null"]}
                    if hook["load"].get("null")
                    else {}
                ),
                "idle dry-run, with webhook": hook["idle"]["with"],
                "idle dry-run, without": hook["idle"]["without"],
            },
        )
    wp = results.get("waypoints")
    if not _failed(wp):
        ecdf(
            "waypoint-programmed",
            "Gateway created → Programmed=True",
            {mode: samples["programmed"] for mode, samples in wp.items()},
            unit="s",
        )
    scale = results.get("scale")
    if not _failed(scale):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = list(scale["milestones"])
        ax.barh(names, [scale["milestones"][n] for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("seconds after the operator started")
        ax.set_title("Scale: when each milestone was first seen")
        fig.tight_layout()
        path = out / "scale-milestones.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# -- the document -----------------------------------------------------------------------------


def _quantile_table(groups: dict[str, list[float]], unit: str = "ms") -> str:
    scale = 1000.0 if unit == "ms" else 1.0
    lines = [
        f"| | n | p50 {unit} | p95 {unit} | p99 {unit} | max {unit} |",
        "|---|---|---|---|---|---|",
    ]
    for name, values in groups.items():
        q = [quantile(values, p) * scale for p in (0.5, 0.95, 0.99, 1.0)]
        lines.append(f"| {name} | {len(values)} | " + " | ".join(f"{x:.1f}" for x in q) + " |")
    return "\n".join(lines)


def _debounces() -> dict[str, float]:
    """The quiet time each kind of reaction waits for, from the operator's own code."""
    from ambient_operator.app.options import Options
    from ambient_operator.controllers.waypoints import IDLE_DEBOUNCE_SECONDS

    # Trials start on an idle operator: both loops fold only what arrives together.
    main = Options().idle_debounce_seconds
    return {"namespace": main, "node": main, "gateway": IDLE_DEBOUNCE_SECONDS}


def _idle_wait(seconds: float) -> str:
    """The sentence on what an idle operator waits for before its pass."""
    where = (
        "(`idle_debounce_seconds` in app/options.py, `IDLE_DEBOUNCE_SECONDS` in "
        "controllers/waypoints/controller.py)"
    )
    if seconds <= 0:
        return (
            f"An idle operator does not wait for more events {where}: its pass starts at "
            "once, and what arrives during it makes one more. "
        )
    return (
        f"An idle operator first waits {seconds * 1000:.0f} ms for more events {where}, "
        "so that events delivered together are one pass. "
    )


def _parts_table(parts: dict[str, dict[str, list[float]]], debounce: dict[str, float]) -> list[str]:
    """Where each reaction's time goes, from the audit log (ReactionBench.parts)."""
    from reaction_latency import PARTS

    if not parts:
        return []
    lines = [
        "**Where the time goes.** From the API server's audit log, whose timestamps of "
        "each request (received, completed) are on this machine's clock like the trials': "
        "the trigger's time in the API server; the reactor's share, from the trigger stored "
        "to the reactor's first request received (the watch event reaching it, any "
        "debounce, its own work, its client); its requests, from the first received to "
        "the last done (sequential ones count with the gaps between them); and the rest "
        "(this client's request overhead and the watch event back to it). p50 of each part "
        "across the trials, so the parts need not add up to the p50 above:",
        "",
        "| | n | trigger | reactor's share | its requests | rest |",
        "|---|---|---|---|---|---|",
    ]
    for kind in (*REACTIONS, "chain floor"):
        got = parts.get(kind)
        if not got:
            continue
        cells = " | ".join(f"{quantile(got[p], 0.5) * 1000:.1f} ms" for p in PARTS)
        lines.append(f"| {kind} | {len(got['trigger'])} | {cells} |")
    chain = parts.get("chain floor")
    if chain:
        floor = quantile(chain["reactor"], 0.5)
        beyond = ", ".join(
            f"{k} {(quantile(parts[k]['reactor'], 0.5) - floor - debounce[k]) * 1000:.1f} ms"
            for k in REACTIONS
            if k in parts
        )
        waited = " and the idle debounce" if any(debounce.get(k) for k in REACTIONS) else ""
        lines += [
            "",
            f"Beyond the zero-logic reactor's share ({floor * 1000:.1f} ms){waited}, the "
            f"operator's own share is {beyond}: its pass's work and the hops "
            "between the informer thread, the event loop and the API threads.",
        ]
    return [*lines, ""]


def _reaction_section(results: dict[str, Any]) -> list[str]:
    reaction = results.get("reaction")
    if _failed(reaction):
        return [f"Not measured: {_failed(reaction)}."]
    samples = reaction["reaction"]
    join = reaction["join"]
    chain = quantile(samples["chain floor"], 0.5)
    floors = [quantile(samples[f"{k} floor"], 0.5) for k in REACTIONS]
    debounce = reaction.get("debounce") or _debounces()
    text = [
        "### Reaction latency (issue 8)",
        "",
        "A private cluster with the sample nodes except the WS2025 one, an AmbientMesh "
        "with every default and the operator (default flags). Each trial times, in this "
        "client, from just before the triggering request to the arrival of the watch event "
        "that shows the operator's resulting write:",
        "",
        "- **namespace**: `istio.io/dataplane-mode` set to a new invalid value "
        "→ the `InvalidDataplaneMode` Warning Event naming that value;",
        "- **gateway**: a Gateway of class `ambient-waypoint` (listener `mesh`, 15008, HBONE) "
        "created → its waypoint Deployment;",
        "- **node**: a Node (linux/s390x, which gets no agent, so no pod churn follows) created "
        "→ the AmbientMesh status naming it.",
        "",
        "The **floor** of each kind is the same client making the same kind of write (a "
        "namespace label, a Gateway of a class nobody serves, a Node) and waiting for that "
        "write's own watch event; it runs right after each operator trial, so that the "
        "operator's reaction to the floor's write (it watches nodes, namespaces and "
        "Gateways too) cannot delay the trial. The **chain "
        "floor** is a zero-logic reactor in the benchmark process that answers a ConfigMap "
        "with another (write → watch → write → watch): the least any controller that reacts "
        "with a write can take. Each trial starts after the operator made no reconcile pass "
        "for 2.1 s, i.e. it measures an isolated change, which an idle operator handles at "
        "once; under sustained churn it debounces (200 ms) and spaces passes out on purpose "
        "(0.5 s, doubling to 5 s).",
        "",
        _quantile_table(
            {k: samples[k] for k in (*REACTIONS, *[f"{k} floor" for k in REACTIONS])}
            | {"chain floor": samples["chain floor"]}
        ),
        "",
    ]
    missed = [
        k for k, f in zip(REACTIONS, floors, strict=True) if quantile(samples[k], 0.5) > 2 * f
    ]
    if missed:
        text += [
            "**What limits it.** The target (p50 within 2x the floor) is missed for "
            + ", ".join(missed)
            + ". A reaction "
            "is two writes and two watch events, the floor one write's round trip: even the "
            f"zero-logic chain floor is {chain / (sum(floors) / len(floors)):.1f}x the mean "
            "floor, which leaves the operator's own work almost no room within 2x; the chain "
            "floor is the fairer comparison. "
            + _idle_wait(debounce["namespace"])
            + "What is left is the pass itself — the "
            "informer handing the event over, the pass checking namespaces, the data plane "
            "(render for every node; objects unchanged since the last pass cost a "
            "comparison each) and the waypoints, then the write "
            "through the Python client — in one Python process on 2 cores shared with the "
            "whole control plane; the parts below measure it.",
            "",
        ]
    text += _parts_table(reaction.get("parts") or {}, debounce)
    tails = [k for k in REACTIONS if quantile(samples[k], 0.99) > 5 * quantile(samples[k], 0.5)]
    if tails:
        text += [
            "**Tails.** The p95/p99 of "
            + ", ".join(tails)
            + " are many times the p50; they were not analysed in this run. From the code "
            "the likeliest cause is a change arriving while the loop is already waiting: "
            "settling a non-urgent poke (pod status, batched up to 3 s) or sleeping a "
            "spacing gap after passes that followed each other closely. Whether a change "
            "is handled at once is decided when the loop wakes, not when the urgent change "
            "arrives.",
            "",
        ]
    text += [
        "### Node join (issue 4)",
        "",
        (
            "On a fresh cluster like the one above (re-measured on its own, see the summary): "
            if "join" in (results.get("remeasured") or {})
            else "In the same cluster, after the reaction trials: "
        )
        + "a WS2025 kwok node is created (one request, status and kwok annotation included) "
        "while no WS2025 node exists, so the operator must create `ztunnel-windows-ltsc2025` "
        "and its istio-cni sibling; the node is deleted and the DaemonSets pruned before the "
        "next trial, which starts once the operator made no pass for "
        f"{join.get('quiet', [2.1])[0]:.1f} s (its loop is idle only after more than its "
        "longest spacing gap, 5 s: a stray event shortly after a pass makes it sleep that "
        "long, and a change arriving then waits). Timed from the create request to the "
        "DaemonSet's ADDED watch event; `desiredNumberScheduled=1` is "
        "kube-controller-manager's reaction on top.",
        "",
        _quantile_table(
            {
                "create request (client)": join.get("create request") or [0.0],
                "ztunnel DaemonSet exists": join["ztunnel"],
                "istio-cni DaemonSet exists": join["istio-cni"],
                "desiredNumberScheduled=1": join["desired=1"],
            }
        ),
        "",
    ]
    before = (results.get("superseded") or {}).get("join")
    if before:
        text += [
            "The first, full run measured this right after the reaction trials and started "
            "each trial after only 2.1 s without a pass; the operator was then often still "
            "sleeping a spacing gap, and the join waited for its end: p50 "
            f"{quantile(before['ztunnel'], 0.5) * 1000:.0f} ms, p99 "
            f"{quantile(before['ztunnel'], 0.99) * 1000:.0f} ms. That is what a node joining "
            "2 to 5 s after other changes meets; the figures above are for an idle operator, "
            "with the benchmark's idle test corrected.",
            "",
        ]
    if quantile(join["ztunnel"], 0.5) >= 1.0:
        text += [
            "**What limits it.** The p50 misses 1 s. Each trial makes the operator run several "
            "passes within seconds (the node, the DaemonSets' rollout status, the agent pod, "
            "the deletion, the prune); when an event arrives within 2 s after a pass the "
            "operator treats it as sustained churn and sleeps a spacing gap (0.5 s doubling to "
            "5 s, `ReconcileLoop._space_out` in runtime/loop.py) before the next pass, and "
            "the next node's join waits for the rest of that gap.",
            "",
        ]
    return text


def _cpu_use(scale: dict[str, Any], milestone: str, results: dict[str, Any]) -> list[str]:
    """What each process's CPU time was from the operator's start to `milestone`."""
    used = (scale.get("cpu_at_milestones") or {}).get(milestone)
    seconds = float((scale.get("milestones") or {}).get(milestone, 0.0))
    if not used or seconds <= 0:
        return []
    cores = int((results.get("machine") or {}).get("nproc") or 0) or 2
    total = sum(used.values())
    by_use = sorted(used.items(), key=lambda kv: -kv[1])
    return [
        f"**Where the CPU went** from the operator's start until {milestone} "
        f"({seconds:.1f} s; {cores} cores, so {cores * seconds:.1f} CPU-seconds at most): "
        + ", ".join(f"{name} {cpu:.1f} s" for name, cpu in by_use)
        + f"; together {total:.1f} s, {100 * total / (cores * seconds):.0f} % of what the "
        "machine had (user and system time from /proc, at the milestone's first poll).",
        "",
    ]


def _scale_section(results: dict[str, Any]) -> list[str]:
    scale = results.get("scale")
    if _failed(scale):
        return ["### Scale (issues 8 and 4)", "", f"Not measured: {_failed(scale)}.", ""]
    size = scale["scale"]
    ms = scale["milestones"]
    agents = int(scale.get("agent_pods") or 0)
    text = [
        "### Scale (issues 8 and 4)",
        "",
        f"A fresh private cluster populated first, from {16} threads: {size['nodes']:,} kwok "
        "nodes in bench/render_scale.py's mix (70 % linux/amd64, 10 % linux/arm64, 12 % WS2022, "
        "6 % WS2025, 1 % WS2019, 1 % linux/s390x; 5 % of Windows nodes without the build "
        f"label), {size['namespaces']:,} namespaces (every other one enrolled), "
        f"{size['waypoints']:,} Gateways of class `ambient-waypoint` (one per enrolled "
        f"namespace, which also carries `istio.io/use-waypoint`), and {size['pods']:,} bare "
        "pods bound by `nodeName` to supported kwok nodes (15 % Windows), spread over all "
        "namespaces, half annotated `ambient.istio.io/redirection=enabled`. Populating took "
        f"{scale['populate_s']:.0f} s, until kwok ran every pod and kube-controller-manager "
        "had published every namespace's root CA. **Only then the operator starts, and the "
        "clock with it** (the spawn of `ambient-operator run`, Python start-up included). "
        "Converged means: AmbientMesh `Reconciled=True` and `Ready=True` for its generation, "
        "its status counting every node, every DaemonSet's `desired` equal to the nodes "
        "render assigns it, and every Gateway `Programmed=True` — so it includes "
        f"kube-controller-manager creating the {agents:,} agent pods and the waypoint pods "
        "and kwok running them. Polled every 0.5 s.",
        "",
        "| milestone | seconds after start |",
        "|---|---|",
        *(f"| {name} | {seconds:.1f} |" for name, seconds in ms.items()),
        "",
        f"Operator CPU time until converged: {scale.get('cpu_s', 0):.1f} s. Peak RSS "
        f"(VmHWM) of the process that converged: {scale['rss_converged_kib'] / MIB:.0f} MiB "
        f"at convergence, {scale['rss_peak_first_kib'] / MIB:.0f} MiB when it stopped; of "
        "the restarted one (which started with the agent and waypoint pods too): "
        f"{scale.get('rss_restart_peak_kib', 0) / MIB:.0f} MiB; its resident set after "
        f"the no-op period (VmRSS): {scale.get('rss_steady_kib', 0) / MIB:.0f} MiB. The "
        "summary's figure is the largest peak of both.",
        "",
        "API requests the operator made from its start until convergence, by verb, from the "
        "API server's audit log (its own user; watches are logged only when they end, so "
        "the watches it holds open are not in these counts):",
        "",
        "| verb | requests |",
        "|---|---|",
        *(f"| {verb} | {n} |" for verb, n in scale["requests"].items()),
        "",
        "Writes by resource: "
        + ", ".join(f"{k} {v}" for k, v in scale["writes_by_resource"].items())
        + ".",
        "",
        "No-op: after convergence and 3 quiet seconds the operator was stopped (SIGTERM) and "
        "started again with `--resync-seconds 10`, and left until it had made its first pass "
        "and two periodic resyncs (data plane) and at least two waypoint passes. Requests in "
        "that time: "
        + ", ".join(f"{k} {v}" for k, v in scale["noop_requests"].items())
        + f"; writes: {len(scale['noop_writes'])}"
        + (": " + ", ".join(scale["noop_writes"]) if scale["noop_writes"] else "")
        + ".",
        "",
    ]
    converged = float(ms["converged"])
    if converged >= 30:
        plane = max(
            float(ms.get("status counts every node", 0.0)),
            float(ms.get("every DaemonSet applied", 0.0)),
        )
        waypoint_objects = float(ms.get("every waypoint Deployment applied", 0.0))
        writes = scale["writes_by_resource"]
        gw_writes = sum(
            n
            for k, n in writes.items()
            if k.split()[1] in ("deployments", "services", "serviceaccounts", "gateways/status")
        )
        text += [
            "**What limits it.** "
            f"The data plane was written {plane:.1f} s after the operator's start (every "
            "DaemonSet applied, the status counting every node). The waypoints' objects took "
            f"until {waypoint_objects:.1f} s: {gw_writes:,} writes (a ServiceAccount, a "
            "Deployment and a Service per Gateway, then their status), 16 at a time, queued in "
            "the one API server behind everything kube-controller-manager does at the same "
            f"moment. From there until Ready and Programmed ({converged:.1f} s) it is the "
            "cluster doing what those writes ask: kube-controller-manager's DaemonSet "
            f"controller creating {agents:,} agent pods and its Deployment and ReplicaSet "
            "controllers the waypoint pods — each controller's client is limited to 20 "
            f"requests/s by default (`--kube-api-qps`), about {agents / 20:.0f} s for the agent "
            "pods alone — then kwok running them and the operator reporting it, all on the "
            "same 2 cores as the API server and etcd, and whatever else ran on the machine "
            "(see the notes at the top).",
            "",
        ]
        text += _cpu_use(scale, "every waypoint Deployment applied", results)
    fast = results.get("scale_kcm")
    if fast is not None and not _failed(fast):
        fms = fast["milestones"]
        text += [
            "**The same run with a faster kube-controller-manager** (`"
            + " ".join(FAST_KCM)
            + "`, on a fresh cluster, everything else equal): "
            + ", ".join(f"{name} {float(sec):.1f} s" for name, sec in fms.items())
            + f". Operator CPU {fast.get('cpu_s', 0):.1f} s, peak RSS "
            f"{float(fast['rss_peak_kib']) / MIB:.0f} MiB, no-op writes "
            f"{len(fast['noop_writes'])}.",
            "",
        ]
    elif fast is not None:
        text += [f"The run with a faster kube-controller-manager failed: {_failed(fast)}.", ""]
    own = results.get("scale4")
    if own is not None and not _failed(own):
        osize, oms = own["scale"], own["milestones"]
        text += [
            "**Issue 4's scenario** (its own words: 1,000 namespaces, half enrolled, and "
            "5,000 pods; it names no node count and no waypoints): the same benchmark on a "
            f"fresh cluster with {osize['nodes']:,} nodes in the same mix, "
            f"{osize['namespaces']:,} namespaces, {osize['pods']:,} pods and no Gateway. "
            + ", ".join(
                f"{name} {float(sec):.1f} s"
                for name, sec in oms.items()
                if "waypoint" not in name and "Gateway" not in name
            )
            + f". Operator CPU {own.get('cpu_s', 0):.1f} s; peak RSS "
            f"{float(own['rss_peak_kib']) / MIB:.0f} MiB; API requests until converged "
            + ", ".join(f"{k} {v}" for k, v in own["requests"].items())
            + f"; no-op writes {len(own['noop_writes'])}.",
            "",
        ]
    elif own is not None:
        text += [f"Issue 4's scenario was not measured: {_failed(own)}.", ""]
    if float(scale["rss_peak_kib"]) / MIB >= 250:
        steady = float(scale.get("rss_steady_kib", 0)) / MIB
        text += [
            "**What limits memory.** The peak comes at start-up, when the operator meets the "
            "whole cluster at once: each kind is listed by its informer a page at a time "
            f"({LIST_PAGE_SIZE} objects), one page of all of them alive at once. The resident "
            f"set stays near the peak afterwards ({steady:.0f} MiB after the no-op period): "
            "CPython and malloc keep the arenas they freed. What the operator keeps for good "
            "is every Node (render reads labels, taints and nodeInfo), a small record per pod, "
            "namespaces' labels, its own objects and the Gateways, each without other "
            "managers' field sets (kube/resources.cached_copy); the memory section below "
            "measures the holders.",
            "",
        ]
    return text


def _other_sections(results: dict[str, Any]) -> list[str]:
    text: list[str] = []
    hook = results.get("webhook")
    text += ["### Webhook added latency", ""]
    if _failed(hook):
        text += [f"Not measured: {_failed(hook)}.", ""]
    else:
        text += [
            "bench/webhook_latency.py's `measure()`, on its own private cluster: "
            f"{hook['creators']} threads create Windows pods pinned to WS2022, rotating "
            "between an enrolled namespace (the API server calls the webhook, which injects "
            "the redirection-wait init container), a plain one (no call) and one served by "
            "bench/null_webhook.py, a webhook in a process of its own that answers every "
            "review at once with a fixed one-container patch (what calling *any* webhook "
            "costs here); and sequential dry-run creates on the idle cluster. "
            f"{hook['injected']}/{hook['stored']} stored pods of the enrolled namespace carry "
            "the init container"
            + (
                f"; the no-op webhook patched {hook['null_injected']}/{hook['null_stored']} of "
                "its own."
                if "null_stored" in hook
                else "."
            ),
            "",
            _quantile_table(
                {
                    "under load, with webhook": hook["load"]["with"],
                    "under load, without": hook["load"]["without"],
                    **(
                        {"under load, no-op webhook": hook["load"]["null"]}
                        if hook["load"].get("null")
                        else {}
                    ),
                    "idle dry-run, with webhook": hook["idle"]["with"],
                    "idle dry-run, without": hook["idle"]["without"],
                }
            ),
            "",
            f"In the operator, per review: decision {hook['decision_ms']:.3f} ms, whole review "
            f"{hook['review_ms']:.3f} ms (means over {int(hook['reviews'])} reviews).",
            "",
        ]
        server = hook.get("server_webhook") or {}
        if server.get("count"):
            text += [
                "The API server's own timing of its calls to the operator's webhook "
                "(`apiserver_admission_webhook_admission_duration_seconds`, connection, TLS, "
                f"the handler and the answer): mean {server['mean'] * 1000:.1f} ms over "
                f"{int(server['count'])} calls.",
                "",
            ]
        added99 = quantile(hook["load"]["with"], 0.99) - quantile(hook["load"]["without"], 0.99)
        if added99 >= 0.020:
            null = hook["load"].get("null")
            compared = (
                " A webhook that does no work at all, in a process of its own, adds p99 "
                f"{_ms(quantile(null, 0.99) - quantile(hook['load']['without'], 0.99))} and p50 "
                f"{_ms(quantile(null, 0.5) - quantile(hook['load']['without'], 0.5))} in the "
                "same run: that much is the price of any mutating webhook on these 2 cores."
                if null
                else ""
            )
            text += [
                "**What limits it.** Under load every component and the creators share 2 "
                "cores; the handler itself takes well under a millisecond, so the added "
                "latency is the API server's extra work per call (encoding the review, TLS, "
                "decoding the answer, applying the patch to a larger pod) and every wake-up "
                "of the two processes queued behind saturated CPUs." + compared,
                "",
            ]
    wp = results.get("waypoints")
    text += ["### Waypoint Programmed", ""]
    if _failed(wp):
        text += [f"Not measured: {_failed(wp)}.", ""]
    else:
        text += [
            "bench/waypoint_programmed.py on its own private cluster (sample nodes): one "
            "Gateway at a time (each after the previous is Programmed), then a burst created "
            "back to back; from each create to the watch event with `Programmed=True`.",
            "",
            _quantile_table({mode: s["programmed"] for mode, s in wp.items()}, unit="s"),
            "",
        ]
        slow = [(m, x) for m, x in wp.items() if quantile(x["programmed"], 0.5) >= 2]
        if slow:
            parts = "; ".join(
                f"{m}: Deployment applied p50 {quantile(x['applied'], 0.5):.1f} s, pod "
                f"available p50 {quantile(x['available'], 0.5):.1f} s, Programmed p50 "
                f"{quantile(x['programmed'], 0.5):.1f} s"
                for m, x in slow
                if x.get("applied") and x.get("available")
            )
            text += [
                f"**What limits it.** {parts}. Programmed needs the waypoint's pod available: "
                "after the operator's applies, kube-controller-manager's Deployment and "
                "ReplicaSet controllers (each limited to 20 requests/s by default), the "
                "scheduler and kwok bring every pod of the burst up in turn, on the same 2 "
                "cores; the operator's status write follows the pod becoming available.",
                "",
            ]
        fast_wp = results.get("waypoints_kcm")
        if fast_wp is not None and _failed(fast_wp):
            text += [f"The burst with a faster kube-controller-manager: {_failed(fast_wp)}.", ""]
        elif fast_wp is not None:
            text += [
                "**The same, kube-controller-manager faster** (`"
                + " ".join(FAST_KCM)
                + "`, its own fresh cluster, everything else equal): "
                + "; ".join(
                    f"{m}: Deployment applied p50 {quantile(x['applied'], 0.5):.2f} s, pod "
                    f"available p50 {quantile(x['available'], 0.5):.2f} s, Programmed p50 "
                    f"{quantile(x['programmed'], 0.5):.2f} s"
                    for m, x in fast_wp.items()
                    if x.get("applied") and x.get("available")
                )
                + ".",
                "",
            ]
    render = results.get("render")
    text += ["### Render", ""]
    if _failed(render):
        text += [f"Not measured: {_failed(render)}.", ""]
    else:
        text += [
            f"bench/render_scale.py's `measure()`: `render_dataplane` for {int(render['nodes']):,} "
            f"nodes in its mix ({int(render['daemonsets'])} DaemonSets, "
            f"{int(render['objects'])} objects, {int(render['unsupported'])} unsupported nodes), "
            f"median of {int(render['runs'])} runs: {render['render_ms']:.1f} ms; turning the "
            f"Node JSON into facts: {render['facts_ms']:.1f} ms.",
            "",
        ]
        if render["render_ms"] >= 100:
            text += [
                "**What limits it.** Render is pure Python on one core; it ran last, while "
                f"this machine's load average was {render.get('load', '?')} (other work "
                "shares its 2 cores), and moves with it.",
                "",
            ]
    return text


def document(results: dict[str, Any], rows: list[Figure]) -> str:
    """docs/performance.md (pure)."""
    machine = results.get("machine") or {}
    durations = results.get("durations") or {}
    lines = [
        "# Performance",
        "",
        "<!-- Generated by `make bench` (bench/run_all.py); do not edit by hand. -->",
        "",
        f"Measured {results.get('started', '?')} to {results.get('finished', '?')}"
        + (f" at commit {results['commit']}" if results.get("commit") else "")
        + (
            " with `--quick` (a smoke test: few trials, small scale)"
            if results.get("quick")
            else ""
        )
        + ". Every component (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler, kwok), the operator and the benchmark client ran on this one machine:",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in machine.items()),
        "",
        *(
            ["**Notes on this run.** " + " ".join(results["notes"]), ""]
            if results.get("notes")
            else []
        ),
        "## Summary",
        "",
        table(rows),
        "",
        *(
            [
                "Re-measured afterwards, each in a run of its own, at the commit named: "
                + ", ".join(f"{k} ({v})" for k, v in results["remeasured"].items())
                + "; see its section.",
                "",
            ]
            if results.get("remeasured")
            else []
        ),
        "Charts of every distribution (ECDFs) are written to `bench/out/` (not committed). "
        "Run time of each part: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in durations.items())
        + "."
        + (
            " Load average (1, 5, 15 min) at the end of each part: "
            + "; ".join(f"{k} {v}" for k, v in results["load"].items())
            + "."
            if results.get("load")
            else ""
        ),
        "",
        "## What was measured",
        "",
        *_reaction_section(results),
        *_scale_section(results),
        *_other_sections(results),
        *_istiod_section(results),
        *_profile_section(results),
        *_memory_section(results),
    ]
    return "\n".join(lines).rstrip() + "\n"


def write_outputs(results: dict[str, Any], out: Path, doc: Path) -> list[Path]:
    """results.json, the charts and the document; prints the table. Returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "results.json"
    saved.write_text(json.dumps(results, indent=1))
    rows = figures(results)
    print(table(rows))
    written = [saved, *charts(results, out)]
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = document(results, rows)
    # The growth section is bench/growth.py's (make bench-growth) and the
    # data-path one bench/datapath.py's (the real node), each measured in a
    # run of its own: kept as they were.
    before = doc.read_text() if doc.exists() else ""
    for begin, end in ((growth.BEGIN, growth.END), (datapath.BEGIN, datapath.END)):
        kept = growth.block_of(before, begin, end)
        if kept:
            text = growth.splice(text, kept, begin, end)
    doc.write_text(text)
    written.append(doc)
    return written


def main(argv: list[str] | None = None) -> int:
    """Measure (or reload), then write the table, charts and document."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few trials, small scale")
    parser.add_argument("--out", type=Path, default=OUT, help="charts and results.json")
    parser.add_argument("--doc", type=Path, help="the document (default docs/performance.md)")
    parser.add_argument("--from-results", type=Path, help="rewrite outputs from a results.json")
    parser.add_argument(
        "--trials",
        type=int,
        help=f"reaction trials (default {FULL.trials}; the race against istiod runs a "
        f"{ISTIOD_TRIALS_SHARE}th as many), for a full run that fits a shorter slot",
    )
    parser.add_argument("--join-trials", type=int, help=f"node joins (default {FULL.join_trials})")
    parser.add_argument(
        "--only",
        help=f"comma-separated parts to (re-)measure over --from-results ({', '.join(PARTS)})",
    )
    args = parser.parse_args(argv)
    doc = args.doc or (args.out / "performance.md" if args.quick else DOC)
    previous = json.loads(args.from_results.read_text()) if args.from_results else None
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(
        plan,
        trials=args.trials or plan.trials,
        join_trials=args.join_trials or plan.join_trials,
    )
    if args.only:
        only = {p.strip() for p in args.only.split(",") if p.strip()}
        if not only <= set(PARTS) or previous is None:
            parser.error(f"--only takes parts of {', '.join(PARTS)} and needs --from-results")
        results = measure(plan, args.quick, only, previous)
    elif previous is not None:
        results = previous
    else:
        results = measure(plan, args.quick)
    for path in write_outputs(results, args.out, doc):
        log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
