"""The pure half of bench/run_all.py: figures, table, charts and document from results.

A real `make bench` takes about 75 minutes and `--quick` minutes,
so here synthetic results stand in for measured ones; what is checked is
behaviour (what gets written, which targets count as met), never seconds.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import run_all  # noqa: E402


def _sample(center: float, n: int, rng: random.Random) -> list[float]:
    return [center * rng.uniform(0.8, 1.2) for _ in range(n)]


def _results(reaction_ms: float = 250.0, rss_kib: float = 150 * 1024) -> dict[str, Any]:
    rng = random.Random(1)
    reaction = {
        kind: _sample(reaction_ms / 1000, 20, rng) for kind in ("namespace", "gateway", "node")
    }
    reaction |= {
        f"{kind} floor": _sample(0.010, 20, rng) for kind in ("namespace", "gateway", "node")
    }
    reaction["chain floor"] = _sample(0.030, 20, rng)
    return {
        "quick": True,
        "started": "2026-01-01 00:00 UTC",
        "finished": "2026-01-01 00:10 UTC",
        "machine": {"nproc": "2", "memory": "24.0 GiB", "cpu": "Test CPU", "kubernetes": "v1.37.0"},
        "durations": {"reaction": 60.0, "scale": 120.0},
        "reaction": {
            "reaction": reaction,
            "join": {
                "ztunnel": _sample(0.5, 5, rng),
                "istio-cni": _sample(0.48, 5, rng),
                "desired=1": _sample(0.6, 5, rng),
            },
            "operator_survived": True,
        },
        "scale": {
            "scale": {"nodes": 50, "namespaces": 100, "waypoints": 20, "pods": 300},
            "populate_s": 8.0,
            "agent_pods": 90,
            "cpu_s": 3.8,
            "rss_converged_kib": rss_kib,
            "rss_peak_first_kib": rss_kib,
            "rss_peak_kib": rss_kib,
            "milestones": {
                "status counts every node": 5.2,
                "every DaemonSet applied": 5.4,
                "AmbientMesh Ready=True": 13.2,
                "every Gateway Programmed=True": 13.2,
                "converged": 13.2,
            },
            "requests": {"create": 17, "get": 31, "list": 37, "patch": 119},
            "writes_by_resource": {"create events": 17, "patch daemonsets": 6},
            "noop_requests": {"get": 26, "list": 36},
            "noop_writes": [],
            "operator_survived": True,
        },
        "webhook": {"error": "RuntimeError: the cluster did not start"},
        "waypoints": {"one at a time": {"programmed": _sample(1.0, 5, rng)}},
        "render": {
            "nodes": 5000,
            "runs": 3,
            "render_ms": 50.0,
            "facts_ms": 45.0,
            "objects": 14,
            "daemonsets": 6,
            "unsupported": 81,
        },
    }


def test_quantile_is_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert run_all.quantile(values, 0.5) in (50.0, 51.0)
    assert run_all.quantile(values, 0.99) == 99.0
    assert run_all.quantile([3.0], 0.95) == 3.0


def test_targets_are_judged_from_the_numbers() -> None:
    rows = {(r.section, r.name.split(":")[0], r.target): r for r in run_all.figures(_results())}
    by_target = [r for r in rows.values() if r.target]
    assert all(r.met is not None for r in by_target)
    ratio = next(r for r in by_target if "floor p50" in r.name and "Warning Event" in r.name)
    assert ratio.met is False  # 250 ms against a 10 ms floor
    join = next(r for r in by_target if "DaemonSet exists" in r.name)
    assert join.met is True
    noop = next(r for r in by_target if "no-op" in r.name)
    assert noop.met is True and noop.value == "0"
    # A failed part is reported as such, never silently left out.
    webhook = [r for r in run_all.figures(_results()) if r.section == "Webhook"]
    assert webhook and "not measured" in webhook[0].value and webhook[0].met is False

    fast = run_all.figures(_results(reaction_ms=15.0, rss_kib=400 * 1024))
    assert next(r for r in fast if "floor p50" in r.name and "Gateway" in r.name).met is True
    rss = [r for r in fast if "RSS" in r.name]
    assert rss and all(r.met is False for r in rss)


def test_outputs_are_written(tmp_path: Path) -> None:
    out, doc = tmp_path / "out", tmp_path / "docs" / "performance.md"
    written = run_all.write_outputs(_results(), out, doc)

    assert doc in written and doc.is_file()
    saved = json.loads((out / "results.json").read_text())
    assert saved["machine"]["cpu"] == "Test CPU"
    charts = {p.name for p in written if p.suffix == ".png"}
    assert {
        "reaction-namespace.png",
        "reaction-gateway.png",
        "reaction-node.png",
        "node-join.png",
        "waypoint-programmed.png",
        "scale-milestones.png",
    } <= charts
    assert "webhook.png" not in charts  # its part failed: nothing to draw
    for name in charts:
        assert (out / name).read_bytes().startswith(b"\x89PNG")

    text = doc.read_text()
    assert text.startswith("# Performance")
    assert "| nproc | 2 |" in text and "v1.37.0" in text
    assert "| | figure | value | target | met |" in text
    assert "**no**" in text  # the missed reaction target is shown, not hidden
    assert "What limits it" in text
    assert "Not measured: RuntimeError" in text
    for heading in ("Reaction latency", "Node join", "Scale", "Webhook", "Render"):
        assert f"### {heading}" in text


def test_saved_results_can_be_rendered_again(tmp_path: Path) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(_results()))
    doc = tmp_path / "again.md"
    assert (
        run_all.main(
            ["--from-results", str(saved), "--out", str(tmp_path / "o"), "--doc", str(doc)]
        )
        == 0
    )
    assert "## Summary" in doc.read_text()


def test_profile_and_memory_sections_show_what_was_measured() -> None:
    results = {
        "profile": {
            "trials": 40,
            "rate": 250,
            "jobs": {
                "node": {
                    "samples": 400,
                    "ms_per_trial": 40.0,
                    "inclusive": [["reconcile (dataplane.py)", 1.0], ["render (plan.py)", 0.4]],
                    "self": [["dumps (__init__.py)", 0.09]],
                }
            },
        },
        "memory": {
            "scale": {"nodes": 125, "namespaces": 250, "waypoints": 50, "pods": 1250},
            "memory_reports": [
                {
                    "traced_bytes": 3 * 2**20,
                    "traced_peak_bytes": 5 * 2**20,
                    "callers": [["kube/informer.py:60", 2**20]],
                }
            ],
        },
    }
    text = "\n".join(run_all._profile_section(results) + run_all._memory_section(results))
    assert "| node | 40.0 ms | 40% `render (plan.py)` | 9% `dumps (__init__.py)` |" in text
    assert "**At convergence:** traced 3.0 MiB now, 5.0 MiB at its peak." in text
    assert "| `kube/informer.py:60` | 1.0 |" in text
    assert "Not measured: not run." in "\n".join(run_all._profile_section({}))


def _audit(received: str, done: str) -> dict[str, Any]:
    return {
        "requestReceivedTimestamp": f"2026-01-01T00:00:{received}Z",
        "stageTimestamp": f"2026-01-01T00:00:{done}Z",
    }


def test_a_trials_parts_come_from_the_audit_timestamps() -> None:
    import reaction_latency

    start = 1767225600.0  # 2026-01-01T00:00:00Z
    trigger = _audit("01.002000", "01.007000")
    before = _audit("00.500000", "00.900000")  # another trial's
    answers = [_audit("01.020000", "01.025000"), _audit("01.026000", "01.031000")]
    late = _audit("01.040000", "01.060000")  # received after the trial's end
    parts = reaction_latency.trial_parts(
        (start + 1.0, start + 1.035), [before, trigger], [before, *answers, late]
    )
    assert parts is not None
    assert {k: round(v * 1000, 3) for k, v in parts.items()} == {
        "trigger": 5.0,
        "reactor": 13.0,
        "requests": 11.0,
        "rest": 6.0,
    }
    assert reaction_latency.trial_parts((start + 1.0, start + 1.035), [before], answers) is None
    assert reaction_latency.trial_parts((start + 1.0, start + 1.035), [trigger], [late]) is None
    # Its watch event came before the API server logged it complete: counted to the end.
    slow = [_audit("01.020000", "01.050000")]
    parts = reaction_latency.trial_parts((start + 1.0, start + 1.035), [trigger], slow)
    assert parts is not None
    assert round(parts["requests"] * 1000, 3) == 15.0
    assert round(parts["rest"] * 1000, 3) == 2.0


def test_the_race_parts_count_only_requests_about_the_gateways_namespace() -> None:
    import istiod_race

    start = 1767225600.0 + 1.0

    def event(
        verb: str, resource: str, namespace: str | None, at: tuple[str, str], agent: str = ""
    ) -> Any:
        ref = {"resource": resource} | ({"namespace": namespace} if namespace else {})
        return {**_audit(*at), "verb": verb, "objectRef": ref, "userAgent": agent}

    bench = [
        event("create", "namespaces", None, ("01.001000", "01.002000")),
        event("create", "gateways", "race-ours-0", ("01.003000", "01.006000")),
        event("create", "gateways", "race-istiod-0", ("01.004000", "01.005000")),
    ]
    operator = [
        event("patch", "ambientmeshes", None, ("01.007000", "01.010000")),  # the mesh's status
        event("watch", "deployments", "race-ours-0", ("01.008000", "01.040000")),
        event("create", "serviceaccounts", "race-ours-0", ("01.016000", "01.019000")),
        event("patch", "deployments", "race-ours-0", ("01.020000", "01.026000")),
        event("create", "deployments", "race-istiod-0", ("01.007000", "01.008000")),
    ]
    # istiod runs as the admin: its answer is among the bench user's requests,
    # told apart by its user agent; its root-certificate ConfigMap is not one.
    istiod = "pilot-discovery/unknown"
    bench += [
        event("create", "configmaps", "race-istiod-0", ("01.009000", "01.010000"), istiod),
        event("patch", "deployments", "race-istiod-0", ("01.012000", "01.020000"), istiod),
        event("patch", "deployments", "race-istiod-0", ("01.006000", "01.009000"), "python"),
    ]
    windows = [
        ("ours fresh", "race-ours-0", start, start + 0.030),
        ("istiod fresh", "race-istiod-0", start, start + 0.022),
        ("ours known", "other", start, start),
    ]
    got = istiod_race.race_parts(windows, operator, bench)
    assert list(got) == ["ours fresh", "istiod fresh"]
    assert [{k: round(v * 1000, 3) for k, v in t.items()} for t in got["ours fresh"]] == [
        {"trigger": 3.0, "reactor": 10.0, "requests": 10.0, "rest": 7.0}
    ]
    assert [{k: round(v * 1000, 3) for k, v in t.items()} for t in got["istiod fresh"]] == [
        {"trigger": 1.0, "reactor": 7.0, "requests": 8.0, "rest": 6.0}
    ]
    text = "\n".join(run_all._race_parts(got))
    assert "| ours fresh, p50 | 1 | 3.0 ms | 10.0 ms | 10.0 ms | 7.0 ms |" in text
    assert "| ours fresh, slowest | 1 | 3.0 ms | 10.0 ms | 10.0 ms | 7.0 ms |" in text
    assert "took 50 ms or more: ours fresh 0 of 1, istiod fresh 0 of 1." in text
    got["ours fresh"].append({"trigger": 0.053, "reactor": 0.01, "requests": 0.01, "rest": 0.0})
    text = "\n".join(run_all._race_parts(got))
    assert "| ours fresh, slowest | 1 | 53.0 ms | 10.0 ms | 10.0 ms | 0.0 ms |" in text
    assert "50 ms or more: ours fresh 1 of 2, istiod fresh 0 of 1." in text
    assert run_all._race_parts({}) == []


def test_the_reaction_section_tells_the_measured_parts() -> None:
    results = _results()
    ms = {"trigger": 0.005, "reactor": 0.013, "requests": 0.006, "rest": 0.002}
    results["reaction"]["parts"] = {
        kind: {
            part: [value + (0.010 if kind == "node" and part == "reactor" else 0)] * 3
            for part, value in ms.items()
        }
        for kind in ("namespace", "gateway", "node", "chain floor")
    }
    results["reaction"]["debounce"] = {"namespace": 0.005, "node": 0.005, "gateway": 0.005}
    text = "\n".join(run_all._reaction_section(results))
    assert "| node | 3 | 5.0 ms | 23.0 ms | 6.0 ms | 2.0 ms |" in text
    assert "| chain floor | 3 | 5.0 ms | 13.0 ms | 6.0 ms | 2.0 ms |" in text
    # node: 23 ms share - 13 ms of the zero-logic reactor - the 5 ms idle debounce.
    assert "node 5.0 ms" in text
    assert "Beyond the zero-logic reactor's share (13.0 ms) and the idle debounce," in text
    results["reaction"]["debounce"] = {"namespace": 0.0, "node": 0.0, "gateway": 0.0}
    text = "\n".join(run_all._reaction_section(results))
    assert "Beyond the zero-logic reactor's share (13.0 ms), the operator's" in text
    assert "node 10.0 ms" in text
    del results["reaction"]["parts"]
    assert "Where the time goes" not in "\n".join(run_all._reaction_section(results))


def test_the_scale_section_tells_where_the_cpu_went() -> None:
    results = _results()
    scale = results["scale"]
    scale["milestones"] |= {"every waypoint Deployment applied": 10.0, "converged": 40.0}
    scale["cpu_at_milestones"] = {
        "every waypoint Deployment applied": {"etcd": 3.0, "kube-apiserver": 9.0, "operator": 4.0}
    }
    text = "\n".join(run_all._scale_section(results))
    assert (
        "**Where the CPU went** from the operator's start until every waypoint Deployment "
        "applied (10.0 s; 2 cores, so 20.0 CPU-seconds at most): kube-apiserver 9.0 s, "
        "operator 4.0 s, etcd 3.0 s; together 16.0 s, 80 % of what the machine had"
    ) in text
    del scale["cpu_at_milestones"]
    assert "Where the CPU went" not in "\n".join(run_all._scale_section(results))


def test_the_idle_wait_is_told_as_measured() -> None:
    assert run_all._idle_wait(0.005).startswith("An idle operator first waits 5 ms for more events")
    assert run_all._idle_wait(0.0).startswith("An idle operator does not wait for more events")
    assert "its pass starts at once" in run_all._idle_wait(0.0)
