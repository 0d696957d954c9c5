"""CPU of one data-plane pass by kind, in process, at two cluster sizes.

    .venv/bin/python bench/pass_cost.py [--repeat 20]

The controller runs over caches fed through the watch table's record
functions and the pod feed, against tests/memory_kube.py (no API server, no
network: the operator's own CPU only). For each size it times, as median
milliseconds of process CPU: a status-only pass after 20 pod changes, a
full pass after a node's label change, and the namespace checks after one
namespace's label change. Sizes: 100 nodes / 1,000 pods / 100 namespaces /
20 Gateways, and 5,000 / 50,000 / 5,000 / 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import yaml

from ambient_operator.app.options import OWNED_API_KINDS
from ambient_operator.cluster.pods import PodFeed
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.controllers.namespaces import NamespaceChecker
from ambient_operator.kube.informer import Change
from memory_kube import MemoryKube
from test_incremental_render import node

ROOT = Path(__file__).resolve().parents[1]
MESH = ROOT / "operator/ambient_operator/samples/ambientmesh.yaml"


class _Events:
    def told(self, *_: Any) -> bool:
        return True

    def post(self, *_: Any) -> bool:
        return True


def _pod(ns: str, name: str, node_name: str, redirection: str | None) -> dict[str, Any]:
    annotations = {"ambient.istio.io/redirection": redirection} if redirection else {}
    return {
        "metadata": {"namespace": ns, "name": name, "annotations": annotations},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running"},
    }


def cpu_ms(action: Callable[[], None]) -> float:
    started = time.process_time()
    action()
    return (time.process_time() - started) * 1000


def measure(nodes: int, pods: int, namespaces: int, gateways: int, repeat: int) -> dict[str, float]:
    state = ClusterState()
    kube = MemoryKube()
    rows = {row.id: row.record for row in state_watches(state, OWNED_API_KINDS)}
    feed = PodFeed(state, [])
    ctl = DataplaneController(state, kube, _Events(), clock=lambda: "T")  # type: ignore[arg-type]
    checker = NamespaceChecker(state, None, _Events())  # type: ignore[arg-type]
    rows["mesh"](None, kube.put(yaml.safe_load(MESH.read_text())))
    rows["namespaces"](None, {"metadata": {"name": "istio-system"}})
    inventory = [node(i) for i in range(nodes)]
    for body in inventory:
        rows["nodes"](None, body)
    for i in range(namespaces):
        labels = {"istio.io/dataplane-mode": "ambient"} if i % 2 == 0 else {}
        rows["namespaces"](None, {"metadata": {"name": f"ns-{i}", "labels": labels}})
    for i in range(gateways):
        key = (f"ns-{i % namespaces}", f"wp-{i}")
        state.gateways[key] = {
            "metadata": {"namespace": key[0], "name": key[1]},
            "spec": {"gatewayClassName": "istio-waypoint"},
        }
    names = [str(n["metadata"]["name"]) for n in inventory]

    def change(i: int, gone: bool = False) -> Change[Any]:
        ns, name = f"ns-{i % namespaces}", f"p-{i}"
        body = _pod(ns, name, names[i % nodes], "enabled" if i % 3 else None)
        return Change("DELETED" if gone else "ADDED", (ns, name), feed.record_of(body))

    feed.apply([change(i) for i in range(pods)])

    def run() -> None:
        asyncio.run(ctl.reconcile())

    for _ in range(3):  # the first pass writes everything, the next meets its DaemonSets
        state.resync()
        run()
        asyncio.run(checker.check())
    out: dict[str, list[float]] = {"status": [], "full": [], "namespaces": []}
    churn = pods
    for r in range(repeat):
        # 20 pods come, 20 go.
        feed.apply([change(churn + k) for k in range(20)])
        feed.apply([change(churn - pods + k, gone=True) for k in range(20)])
        churn += 20
        assert not state.full_pass_due
        out["status"].append(cpu_ms(run))
        relabelled = copy.deepcopy(inventory[r % nodes])
        relabelled["metadata"]["labels"]["bench"] = str(r)
        rows["nodes"](None, relabelled)
        out["full"].append(cpu_ms(run))
        labels = {"istio.io/dataplane-mode": "ambient", "bench": str(r)}
        rows["namespaces"](None, {"metadata": {"name": f"ns-{r}", "labels": labels}})
        out["namespaces"].append(cpu_ms(lambda: asyncio.run(checker.check())))
        run()  # the label's status-only pass
    assert ctl.passes["status"] == 2 * repeat, ctl.passes
    return {kind: statistics.median(values) for kind, values in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print("size                               status-only  full (node)  namespaces  (ms CPU)")
    for size in ((100, 1000, 100, 20), (5000, 50000, 5000, 1000)):
        got = measure(*size, repeat=args.repeat)
        label = "{} nodes/{} pods/{} ns/{} gw".format(*size)
        print(f"{label:35} {got['status']:10.2f} {got['full']:12.2f} {got['namespaces']:11.2f}")


if __name__ == "__main__":
    main()
