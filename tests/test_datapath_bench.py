"""bench/datapath.py's pure half on literal results (the run itself needs the real node:
`make bench-datapath`; tests/test_realnode_mesh.py runs the same mesh)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import datapath  # noqa: E402
import growth  # noqa: E402

RESULTS: dict[str, Any] = {
    "started": "2026-01-01 00:00 UTC",
    "finished": "2026-01-01 00:05 UTC",
    "kernel": "6.18.0",
    "load_at_end": [1.0, 0.5, 0.25],
    "requests": 3,
    "latency_ms": {"enrolled": [1.5, 1.0, 2.0], "plain": [0.25, 0.5, 0.75]},
    "ztunnel_mtls_counted": 4.0,
    "redirection": [
        {"to_enabled_s": 0.5, "to_running_s": 0.75, "running_to_enabled_s": -0.25},
        {"to_enabled_s": 0.25, "to_running_s": 1.0, "running_to_enabled_s": -0.75},
    ],
    "idle_s": 60.0,
    "idle": {
        "ztunnel": {"cpu_pct": 0.125, "rss_mib": 12.5, "processes": 1},
        "istio-cni": {"cpu_pct": 0.5, "rss_mib": 40.0, "processes": 1},
    },
}


def test_the_section_reads_the_run() -> None:
    block = datapath.section(RESULTS)
    assert block.startswith(datapath.BEGIN) and block.endswith(datapath.END)
    lines = block.splitlines()
    # Nearest rank: p50 of three is the middle one, p99 the largest.
    assert "| request on a new connection, p50 (n=3) | 1.50 ms | 0.50 ms | +1.00 ms |" in lines
    assert "| request on a new connection, p99 | 2.00 ms | 0.75 ms | +1.25 ms |" in lines
    assert "| ztunnel | 0.12 % | 12.5 MiB |" in lines
    assert "| istio-cni | 0.50 % | 40.0 MiB |" in lines
    assert "ztunnel counted 4 mutual-TLS connections" in block
    assert "Running → enabled p50 -750.00 ms, p99 -250.00 ms" in block


def test_the_section_goes_between_its_own_markers() -> None:
    block = datapath.section(RESULTS)
    growth_block = growth.BEGIN + "\ngrowth\n" + growth.END
    doc = "# Performance\n\n" + growth_block + "\n\n" + datapath.BEGIN + "\nold\n" + datapath.END
    spliced = growth.splice(doc, block, datapath.BEGIN, datapath.END)
    assert growth.block_of(spliced) == growth_block
    assert growth.block_of(spliced, datapath.BEGIN, datapath.END) == block
    assert "old" not in spliced


def test_a_faster_enrolled_pair_is_explained() -> None:
    assert "A negative difference" not in datapath.section(RESULTS)
    flipped = {**RESULTS, "latency_ms": {"enrolled": [0.5], "plain": [1.0]}}
    block = datapath.section(flipped)
    assert "| request on a new connection, p50 (n=1) | 0.50 ms | 1.00 ms | -0.50 ms |" in block
    assert "A negative difference is ztunnel saving more than it costs" in block
