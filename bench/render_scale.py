"""How long render_dataplane takes for a large mixed cluster.

    .venv/bin/python bench/render_scale.py [--nodes 5000] [--runs 15]

Prints the median wall time of rendering (facts already gathered), and
separately of turning Node JSON into facts, which the operator also does on
every reconcile. The goal is well under 100 ms for 5,000 nodes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.render import render_dataplane

# Share of each kind of node in the generated inventory (sums to 1).
MIX = (
    ("linux", "amd64", None, 0.70),
    ("linux", "arm64", None, 0.10),
    ("windows", "amd64", c.BUILD_WS2022, 0.12),
    ("windows", "amd64", c.BUILD_WS2025, 0.06),
    ("windows", "amd64", c.BUILD_WS2019, 0.01),
    ("linux", "s390x", None, 0.01),
)
# Windows nodes whose build label is missing, so they are selected by name.
UNLABELED_SHARE = 0.05


def inventory(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """Nodes in API JSON form, in the mix above, reproducible for a seed."""
    rng = random.Random(seed)
    kinds = [k[:3] for k in MIX]
    weights = [k[3] for k in MIX]
    nodes = []
    for i in range(count):
        os_name, arch, build = rng.choices(kinds, weights)[0]
        name = f"{os_name}-{arch}-{i:05d}"
        labels = {
            c.LABEL_OS: os_name,
            c.LABEL_ARCH: arch,
            c.LABEL_HOSTNAME: name,
            "topology.kubernetes.io/zone": f"zone-{i % 3}",
        }
        info = {
            "operatingSystem": os_name,
            "architecture": arch,
            "kernelVersion": f"{build}.2762" if build else "6.8.0-1021-azure",
        }
        taints = []
        if os_name == "windows":
            taints.append({"key": "os", "value": "windows", "effect": "NoSchedule"})
            if rng.random() >= UNLABELED_SHARE:
                labels[c.LABEL_WINDOWS_BUILD] = str(build)
        nodes.append(
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": taints},
                "status": {"nodeInfo": info},
            }
        )
    return nodes


def _median_ms(func: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(nodes: int = 5000, runs: int = 15) -> dict[str, float]:
    """Median milliseconds of render_dataplane and of NodeFacts.from_node for `nodes` nodes."""
    raw = inventory(nodes)
    spec = AmbientMeshSpec()
    facts = ClusterFacts.from_nodes(raw, istiod_ip="10.96.0.20", dns_ip="10.96.0.10")
    result = render_dataplane(spec, facts)  # warm-up: template compilation
    unlabeled = sum(1 for n in facts.nodes if n.os == "windows" and not n.build_from_label)
    return {
        "nodes": nodes,
        "runs": runs,
        "unlabeled_windows": unlabeled,
        "objects": len(result.objects),
        "daemonsets": len(result.daemonsets),
        "unsupported": len(result.unsupported()),
        "render_ms": _median_ms(lambda: render_dataplane(spec, facts), runs),
        "facts_ms": _median_ms(lambda: tuple(NodeFacts.from_node(n) for n in raw), runs),
    }


def main() -> None:
    """Run the benchmark and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    m = measure(args.nodes, args.runs)
    print(f"nodes: {args.nodes} ({m['unlabeled_windows']} Windows nodes without the build label)")
    print(
        f"objects: {m['objects']}, daemonsets: {m['daemonsets']}, "
        f"unsupported nodes: {m['unsupported']}"
    )
    print(f"render_dataplane: median {m['render_ms']:.1f} ms over {args.runs} runs")
    print(f"NodeFacts.from_node x{args.nodes}: median {m['facts_ms']:.1f} ms over {args.runs} runs")


if __name__ == "__main__":
    main()
