"""How much the redirection-wait webhook adds to pod creation.

    .venv/bin/python bench/webhook_latency.py [--creators 20] [--pods-per-creator 30]

Starts a local control plane (the test binaries), the sample nodes, an
AmbientMesh and the operator serving the webhook on a loopback port. Then
`--creators` threads create Windows pods pinned to WS2022, alternating
between an enrolled namespace (the API server calls the webhook, which
injects) and a plain one (no call): same pods, same moment, so the
difference is the webhook's. Prints p50 and p99 of both, the added
latency, their ratio, and the handler's own decision time from the
operator's metrics. The goal is p99 added latency under 20 ms.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from ambient_devcluster import (
    LocalCluster,
    api_client_for,
    apply_dirs,
    create_nodes,
    default_bin_dir,
)
from ambient_devcluster.harness import (
    CRDS_DIR,
    SAMPLE_NODES,
    OperatorProcess,
    create_mesh,
    create_namespace,
    free_port,
    wait_for,
    webhook_args,
    ws2022_pod,
)
from ambient_operator.api import constants as c
from ambient_operator.webhook import certs
from ambient_operator.webhook import decide as d
from benchlib import quantile

ROOT = Path(__file__).resolve().parents[1]
NULL_WEBHOOK = "null.bench.ambientoperator.io"


def _server_webhook_histogram(api: client.ApiClient, exclude: str = NULL_WEBHOOK) -> dict[str, Any]:
    """The API server's own timing of its calls to our webhook (its metrics endpoint).

    Calls to the `exclude` webhook (the no-op one) are left out.

    `apiserver_admission_webhook_admission_duration_seconds` covers the call as
    the API server sees it: connection, TLS, our handler, the answer. Returns
    the count, the mean and the cumulative buckets (seconds -> count).
    """
    text = api.call_api(
        *api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])[:2],
        header_params={"Accept": "text/plain"},
    )
    text.read()
    body = (text.data or b"").decode()
    name = "apiserver_admission_webhook_admission_duration_seconds"
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in body.splitlines():
        if not line.startswith(name) or 'type="admit"' not in line or f'"{exclude}"' in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if line.startswith(name + "_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif line.startswith(name + "_sum"):
            total += value
        elif line.startswith(name + "_count"):
            count += value
    return {"count": count, "mean": total / count if count else 0.0, "buckets": buckets}


def _bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile q (a histogram's resolution)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return float("nan")


def _creator(
    kubeconfig: Path,
    namespaces: dict[str, str],
    count: int,
    name: str,
    results: dict[str, list[float]],
    lock: threading.Lock,
) -> None:
    with api_client_for(kubeconfig) as api:
        core = client.CoreV1Api(api)
        kinds = [k for k in ("with", "without", "null") if k in namespaces]
        for i in range(count):
            # Rotate which goes first so no side always meets a warmer server.
            shift = i % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                started = time.perf_counter()
                core.create_namespaced_pod(namespaces[kind], ws2022_pod(f"{name}-{i}"))
                elapsed = time.perf_counter() - started
                with lock:
                    results[kind].append(elapsed)


def _round(
    kubeconfig: Path, namespaces: dict[str, str], creators: int, per_creator: int, prefix: str
) -> dict[str, list[float]]:
    """`creators` threads each creating `per_creator` pods in each namespace."""
    results: dict[str, list[float]] = {
        k: [] for k in ("with", "without", "null") if k in namespaces
    }
    lock = threading.Lock()
    threads = [
        threading.Thread(
            target=_creator,
            args=(kubeconfig, namespaces, per_creator, f"{prefix}-{i}", results, lock),
        )
        for i in range(creators)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _dry_runs(
    core: client.CoreV1Api, namespaces: dict[str, str], count: int
) -> dict[str, list[float]]:
    """Sequential dry-run creates on an idle cluster: the webhook's cost without load."""
    results: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(count):
        for kind in ("with", "without") if i % 2 == 0 else ("without", "with"):
            started = time.perf_counter()
            core.create_namespaced_pod(namespaces[kind], ws2022_pod(f"dry-{i}"), dry_run="All")
            results[kind].append(time.perf_counter() - started)
    return results


def _report(title: str, results: dict[str, list[float]]) -> float:
    """Print one table; return the p99 added latency in ms."""
    with_ms = [x * 1000 for x in results["with"]]
    without_ms = [x * 1000 for x in results["without"]]
    p50w, p99w = quantile(with_ms, 0.50), quantile(with_ms, 0.99)
    p50o, p99o = quantile(without_ms, 0.50), quantile(without_ms, 0.99)
    print(f"{title} ({len(with_ms)} creates per side)")
    print(f"{'':22}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    print(f"{'with webhook':22}{p50w:10.2f}{p99w:10.2f}{statistics.fmean(with_ms):10.2f}")
    print(f"{'without webhook':22}{p50o:10.2f}{p99o:10.2f}{statistics.fmean(without_ms):10.2f}")
    print(f"{'added':22}{p50w - p50o:10.2f}{p99w - p99o:10.2f}")
    print(f"{'ratio with/without':22}{p50w / p50o:10.2f}{p99w / p99o:10.2f}")
    return p99w - p99o


def _start_null_webhook(
    api: client.ApiClient, workdir: Path, namespace: str
) -> subprocess.Popen[bytes]:
    """bench/null_webhook.py on a port of its own, registered for `namespace` only."""
    material = certs.generate(["127.0.0.1"], datetime.now(UTC))
    cert, key = workdir / "null.crt", workdir / "null.key"
    cert.write_bytes(material.cert)
    key.write_bytes(material.key)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "null_webhook.py"), "--port", str(port),
         "--cert-file", str(cert), "--key-file", str(key)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(
        {
            "metadata": {"name": "bench-null-webhook"},
            "webhooks": [
                {
                    "name": NULL_WEBHOOK,
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": base64.b64encode(material.ca_bundle).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "timeoutSeconds": 10,
                }
            ],
        }
    )
    return proc


def _has_init(pod: Any, name: str) -> bool:
    return any(ct.name == name for ct in pod.spec.init_containers or [])


def _setup(api: client.ApiClient, namespaces: dict[str, str]) -> None:
    create_nodes(api, SAMPLE_NODES, timeout=60)
    apply_dirs(api, [CRDS_DIR], timeout=60)
    create_mesh(api, {})
    for kind, name in namespaces.items():
        labels = {c.LABEL_DATAPLANE_MODE: "ambient"} if kind == "with" else {}
        create_namespace(api, name, labels)


def measure(
    creators: int = 20, pods_per_creator: int = 30, warmup: int = 3, dry_runs: int = 200
) -> dict[str, Any]:
    """Run the benchmark on a private cluster; samples in seconds.

    Returns `idle` and `load` ({"with": [...], "without": [...]}), the count of
    pods carrying the init container, and the operator's mean times per review.
    """
    namespaces = {
        "with": "bench-enrolled",
        "without": "bench-plain",
        "null": "bench-null",
        "tls": "bench-tls",
    }

    with (
        tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=default_bin_dir(), verbose=False) as cluster,
        api_client_for(cluster.kubeconfig) as api,
    ):
        core = client.CoreV1Api(api)
        _setup(api, namespaces)
        port = free_port()
        operator = OperatorProcess(
            cluster,
            Path(tmp),
            webhook_args(port, namespaces["tls"]),
            health_port=0,
            log_level="warning",
        )
        operator.start()
        null = _start_null_webhook(api, Path(tmp), namespaces["null"])
        try:

            def mutated() -> bool:
                out = core.create_namespaced_pod(
                    namespaces["with"], ws2022_pod("probe"), dry_run="All"
                )
                return any(ct.name == d.CONTAINER_NAME for ct in out.spec.init_containers or [])

            wait_for(mutated, 90, "the webhook")

            def null_mutated() -> bool:
                out = core.create_namespaced_pod(
                    namespaces["null"], ws2022_pod("probe"), dry_run="All"
                )
                return _has_init(out, "null-webhook")

            wait_for(null_mutated, 60, "the null webhook")
            idle = _dry_runs(core, namespaces, dry_runs)
            _round(cluster.kubeconfig, namespaces, creators, warmup, "warm")
            results = _round(cluster.kubeconfig, namespaces, creators, pods_per_creator, "bench")
            stored = core.list_namespaced_pod(namespaces["with"]).items
            injected = sum(1 for p in stored if _has_init(p, d.CONTAINER_NAME))
            null_stored = core.list_namespaced_pod(namespaces["null"]).items
            null_injected = sum(1 for p in null_stored if _has_init(p, "null-webhook"))
            seen_by_server = _server_webhook_histogram(api)
            reviews = operator.metric("ambient_operator_webhook_decision_seconds_count")
            decide_sum = operator.metric("ambient_operator_webhook_decision_seconds_sum")
            serve_sum = operator.metric("ambient_operator_webhook_request_seconds_sum")
        finally:
            null.kill()
            null.wait()
            operator.stop()

    return {
        "server_webhook": seen_by_server,
        "creators": creators,
        "idle": idle,
        "load": results,
        "injected": injected,
        "stored": len(stored),
        "null_injected": null_injected,
        "null_stored": len(null_stored),
        "reviews": reviews,
        "decision_ms": decide_sum / reviews * 1000 if reviews else 0.0,
        "review_ms": serve_sum / reviews * 1000 if reviews else 0.0,
    }


def main() -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creators", type=int, default=20)
    parser.add_argument("--pods-per-creator", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="pods per creator before measuring")
    parser.add_argument("--dry-runs", type=int, default=200, help="idle dry-run creates per side")
    args = parser.parse_args()
    m = measure(args.creators, args.pods_per_creator, args.warmup, args.dry_runs)

    # Every component and the creators share these CPUs: the added latency
    # under load is mostly the API server's extra work per call, queued.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"creators: {args.creators}; CPUs: {os.cpu_count()}; load average: {load}")
    print(f"pods in the enrolled namespace carrying the init container: "
          f"{m['injected']}/{m['stored']}")  # fmt: skip
    _report("idle cluster, sequential dry-run creates", m["idle"])
    added = _report(f"{args.creators} concurrent creators, real creates", m["load"])
    print(
        f"pods in the null webhook's namespace it patched: {m['null_injected']}/{m['null_stored']}"
    )
    null_added = _report(
        "the same creates: a webhook doing no work (bench/null_webhook.py) vs none",
        {"with": m["load"]["null"], "without": m["load"]["without"]},
    )
    print(
        f"p99 added: by the operator's webhook {added:.2f} ms, by a no-op one {null_added:.2f} ms"
    )
    if m["reviews"]:
        print(
            f"in the operator, mean per review over {int(m['reviews'])}: decision "
            f"{m['decision_ms']:.3f} ms, whole review {m['review_ms']:.3f} ms"
        )
    server = m["server_webhook"]
    if server["count"]:
        p50 = _bucket_quantile(server["buckets"], 0.5) * 1000
        p99 = _bucket_quantile(server["buckets"], 0.99) * 1000
        print(
            f"the API server's own timing of its {int(server['count'])} webhook calls: mean "
            f"{server['mean'] * 1000:.2f} ms, p50 <= {p50:g} ms, p99 <= {p99:g} ms "
            "(histogram buckets)"
        )
    target = 20.0
    verdict = "meets" if added < target else "MISSES"
    print(f"p99 added latency under load {added:.2f} ms {verdict} the {target:.0f} ms target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
