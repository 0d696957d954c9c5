"""How long a waypoint Gateway takes from creation to Programmed=True, with kwok.

    .venv/bin/python bench/waypoint_programmed.py [--count 50] [--gateway-api v1.6]

Starts a private local control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) with the sample mixed nodes,
runs `ambient-operator run` against it, and measures two ways:

- one at a time: each Gateway is created once the previous one is Programmed;
- burst: all Gateways are created back to back, each timed from its own create.

The clock starts just before the create request and stops when a watch on
Gateways first delivers Programmed=True for its generation. The path covers
the operator's debounce, three server-side applies, the Deployment and
ReplicaSet controllers, the scheduler, kwok starting the pod, and the status
write. Target: p50 under 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from ambient_devcluster import LocalCluster, apply_dirs, create_nodes
from ambient_devcluster.harness import (
    CRDS_DIR,
    SAMPLE_NODES,
    OperatorProcess,
    create_mesh,
    gateway_api_dir,
)
from benchlib import quantile

GROUP, VERSION = "gateway.networking.k8s.io", "v1"


class FirstSeen:
    """Records when each object of a namespace first reaches each milestone, from a watch.

    Milestones are (label, predicate) pairs; the clock is read when the event
    arrives, so what is measured is what a client of the API server sees.
    """

    def __init__(
        self,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        milestones: dict[str, Callable[[dict[str, Any]], bool]],
    ) -> None:
        self.list_fn = list_fn
        self.args = args
        self.milestones = milestones
        self.seen: dict[str, dict[str, float]] = {label: {} for label in milestones}
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Start watching (returns once the watch had time to connect)."""
        self._thread.start()
        time.sleep(0.5)

    def _run(self) -> None:
        while not self._stop.is_set():
            for event in watch.Watch().stream(self.list_fn, *self.args, timeout_seconds=60):
                obj = event["object"]
                if not isinstance(obj, dict):
                    obj = obj.to_dict()
                name = obj["metadata"]["name"]
                now = time.monotonic()
                with self.cond:
                    for label, reached in self.milestones.items():
                        if reached(obj):
                            self.seen[label].setdefault(name, now)
                    self.cond.notify_all()

    def wait(self, label: str, names: list[str], timeout: float) -> None:
        """Block until every name reached the milestone."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(name in self.seen[label] for name in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.seen[label]]
                    raise TimeoutError(f"{label} not reached after {timeout}s: {missing[:5]}")
                self.cond.wait(left)

    def stop(self) -> None:
        """Stop after the current watch ends (the thread is a daemon)."""
        self._stop.set()


def _programmed(obj: dict[str, Any]) -> bool:
    generation = obj["metadata"].get("generation")
    return any(
        cond.get("type") == "Programmed"
        and cond.get("status") == "True"
        and cond.get("observedGeneration") == generation
        for cond in (obj.get("status") or {}).get("conditions") or []
    )


def _available(obj: dict[str, Any]) -> bool:
    return int((obj.get("status") or {}).get("available_replicas") or 0) >= 1


def _gateway(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": "ambient-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


def _run_mode(
    api: client.ApiClient, namespace: str, count: int, burst: bool
) -> dict[str, list[float]]:
    """Seconds from each Gateway's create to: its Deployment, an available pod, Programmed."""
    custom = client.CustomObjectsApi(api)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    gateways = FirstSeen(
        custom.list_namespaced_custom_object,
        (GROUP, VERSION, namespace, "gateways"),
        {"programmed": _programmed},
    )
    deployments = FirstSeen(
        client.AppsV1Api(api).list_namespaced_deployment,
        (namespace,),
        {"applied": lambda _: True, "available": _available},
    )
    gateways.start()
    deployments.start()
    started: dict[str, float] = {}
    names = [f"wp-{i:03d}" for i in range(count)]
    for name in names:
        started[name] = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "gateways", _gateway(name)
        )
        if not burst:
            gateways.wait("programmed", [name], timeout=120)
    gateways.wait("programmed", names, timeout=300)
    deployments.wait("available", names, timeout=60)
    gateways.stop()
    deployments.stop()
    seen = {**deployments.seen, **gateways.seen}
    return {
        label: [seen[label][name] - started[name] for name in names]
        for label in ("applied", "available", "programmed")
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50, help="Gateways per mode (default 50)")
    parser.add_argument("--gateway-api", default="v1.6", choices=["v1.4", "v1.6"])
    parser.add_argument("--json", metavar="FILE", help="also write the samples as JSON")
    parser.add_argument(
        "--kcm-arg",
        action="append",
        default=[],
        help="an extra kube-controller-manager flag (repeatable), e.g. --kube-api-qps=100",
    )
    args = parser.parse_args(argv)

    results: dict[str, dict[str, list[float]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="waypoint-bench-") as tmp,
        LocalCluster(
            Path(tmp) / "cluster",
            verbose=False,
            extra_args={"kube-controller-manager": args.kcm_arg} if args.kcm_arg else None,
        ) as cluster,
        cluster.api_client() as api,
    ):
        apply_dirs(api, [CRDS_DIR, gateway_api_dir(args.gateway_api)])
        create_nodes(api, SAMPLE_NODES, timeout=60)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "istio-system"}})
        create_mesh(api, {})
        operator = OperatorProcess(cluster, Path(tmp), log_level="warning")
        operator.start()
        try:
            # Warm up: the class exists and one waypoint went all the way.
            _run_mode(api, "bench-warmup", 1, burst=False)
            results["one at a time"] = _run_mode(api, "bench-serial", args.count, False)
            results["burst"] = _run_mode(api, "bench-burst", args.count, True)
        except Exception:
            # The work directory goes away with the cluster: show why now.
            print(f"operator log (last lines):\n{operator.log_tail(40)}", file=sys.stderr)
            raise
        finally:
            operator.stop()

    print(f"\nGateway created -> Programmed=True, kwok, Gateway API {args.gateway_api}")
    print("(applied: its Deployment exists; available: a pod is ready; programmed: status says so)")
    header = f"{'mode':<14} {'n':>4} {'applied p50':>12} {'available p50':>14}"
    print(f"{header} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'max s':>7}")
    for mode, samples in results.items():
        done = samples["programmed"]
        print(
            f"{mode:<14} {len(done):>4} {statistics.median(samples['applied']):>12.2f} "
            f"{statistics.median(samples['available']):>14.2f} {statistics.median(done):>7.2f} "
            f"{quantile(done, 0.90):>7.2f} {quantile(done, 0.99):>7.2f} {max(done):>7.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
