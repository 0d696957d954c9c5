"""How much the redirection-wait webhook adds to pod creation, beside istiod's injector.

    .venv/bin/python bench/webhook_latency.py [--creators 20] [--pods-per-creator 30]
        [--sequential-pods 500] [--warmup 3] [--dry-runs 200] [--no-istiod]

Starts a local control plane (the test binaries), the sample nodes, an
AmbientMesh, the operator serving the webhook on a loopback port, a webhook
that does no work (bench/null_webhook.py) and, unless `--no-istiod`, the
real istiod from Istio's charts (ambient_devcluster.IstioControlPlane).
Creators then create the same Windows pod, pinned to WS2022, rotating
between four namespaces: an enrolled one (the API server calls our
webhook, which injects its init container), one labelled
`istio-injection=enabled` (istiod's sidecar injector adds istio-init and
istio-proxy), the no-op webhook's, and a plain one (no call, the
baseline). Same body, same API server, same moment: the difference from
the plain namespace is each webhook's.

The istiod namespace gets the Windows pod too: istiod's injector never
looks at a pod's OS or node selector and injects the very patch it gives a
Linux pod, so one body everywhere keeps a single baseline and leaves the
webhook the only difference.

Two load levels with real creates: one creator (`--sequential-pods` pods
per namespace), then `--creators` concurrent threads, each level after an
uncounted warm-up of `--warmup` pods per creator; before them, sequential
dry-run creates on the idle cluster (ours against none). For each level
it prints p50/p95/p99 of every namespace, the latency each webhook adds
(its quantile minus the baseline's), and ours over istiod's and over the
no-op's at p50 and p99; then the handler's own decision time from the
operator's metrics and the API server's timing of its calls to each.
Every stored pod must show its webhook's change, or the run fails. The
goal is p99 added latency under 20 ms.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from ambient_devcluster import (
    IstioControlPlane,
    LocalCluster,
    api_client_for,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
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
from ambient_operator.webhook import config as webhook_config
from ambient_operator.webhook import decide as d
from benchlib import quantile

ROOT = Path(__file__).resolve().parents[1]
NULL_WEBHOOK = "null.bench.ambientoperator.io"
ISTIO_INJECTOR = "sidecar-injector.istio.io"
ISTIO_STATUS = "sidecar.istio.io/status"
# The baseline first: every other kind is measured against it.
KINDS = ("without", "with", "istiod", "null")
LABELS = {
    "without": "no webhook",
    "with": "our webhook",
    "istiod": "istiod's injector",
    "null": "no-op webhook",
}
NAMESPACE_LABELS: dict[str, dict[str, str]] = {
    "with": {c.LABEL_DATAPLANE_MODE: "ambient"},
    "istiod": {"istio-injection": "enabled"},
}


def _server_webhook_histogram(
    api: client.ApiClient, suffix: str = webhook_config.WEBHOOK_SUFFIX
) -> dict[str, Any]:
    """The API server's own timing of its calls to the webhooks named `*suffix` (ours).

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
        if not line.startswith(name) or 'type="admit"' not in line or f'{suffix}"' not in line:
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
        kinds = [k for k in KINDS if k in namespaces]
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
    results: dict[str, list[float]] = {k: [] for k in KINDS if k in namespaces}
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


QUANTILES = (0.50, 0.95, 0.99)


def _ratio(ours: float, theirs: float) -> str:
    # An added latency at or under zero is inside the noise: no ratio means anything.
    return f"{ours / theirs:10.2f}" if theirs > 0 else f"{'n/a':>10}"


def _report(title: str, results: Mapping[str, list[float]]) -> dict[str, dict[float, float]]:
    """Print one level's table; return each webhook's added latency (ms) by quantile."""
    kinds = [k for k in KINDS if k in results]
    ms = {k: [x * 1000 for x in results[k]] for k in kinds}
    print(f"{title} ({len(ms['without'])} creates per namespace)")
    print(f"{'':34}" + "".join(f"{f'p{q * 100:.0f} ms':>10}" for q in QUANTILES) + " mean ms")
    for k in kinds:
        row = "".join(f"{quantile(ms[k], q):10.2f}" for q in QUANTILES)
        print(f"{LABELS[k]:34}{row}{statistics.fmean(ms[k]):8.2f}")
    added = {
        k: {q: quantile(ms[k], q) - quantile(ms["without"], q) for q in QUANTILES}
        for k in kinds[1:]
    }
    for k, by_q in added.items():
        print(f"{'added by ' + LABELS[k]:34}" + "".join(f"{v:10.2f}" for v in by_q.values()))
    ours = added.get("with")
    for k in ("istiod", "null"):
        if ours is not None and k in added:
            theirs = added[k]
            print(
                f"{'ours / ' + LABELS[k] + ', added':34}{_ratio(ours[0.5], theirs[0.5])}"
                f"{'':10}{_ratio(ours[0.99], theirs[0.99])}"
            )
    return added


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


# How each webhook's change shows on a pod it admitted.
ACTED: dict[str, Callable[[Any], bool]] = {
    "with": lambda pod: _has_init(pod, d.CONTAINER_NAME),
    "istiod": lambda pod: ISTIO_STATUS in (pod.metadata.annotations or {}),
    "null": lambda pod: _has_init(pod, "null-webhook"),
}


def _probe(core: client.CoreV1Api, namespace: str, acted: Callable[[Any], bool]) -> bool:
    return acted(core.create_namespaced_pod(namespace, ws2022_pod("probe"), dry_run="All"))


def _wait_acting(core: client.CoreV1Api, namespaces: dict[str, str]) -> None:
    """Until every webhook changes a dry-run pod: each answers a moment after it is up."""
    for kind, acted in ACTED.items():
        if kind in namespaces:
            probe = functools.partial(_probe, core, namespaces[kind], acted)
            wait_for(probe, 90, f"{LABELS[kind]} to change a pod")


def _acted(core: client.CoreV1Api, namespaces: dict[str, str]) -> dict[str, list[int]]:
    """[changed, stored] pods of each webhook's namespace; fails unless it changed all.

    failurePolicy Ignore (ours, the no-op's) admits a pod unchanged when the
    call fails or times out: such a create was timed without the webhook.
    """
    counts: dict[str, list[int]] = {}
    for kind, acted in ACTED.items():
        if kind in namespaces:
            stored = core.list_namespaced_pod(namespaces[kind]).items
            counts[kind] = [sum(1 for p in stored if acted(p)), len(stored)]
    missed = {LABELS[k]: v for k, v in counts.items() if v[0] < v[1] or not v[1]}
    if missed:
        raise RuntimeError(f"webhooks left pods unchanged ([changed, stored]): {missed}")
    return counts


def _setup(api: client.ApiClient, namespaces: dict[str, str]) -> None:
    create_nodes(api, SAMPLE_NODES, timeout=60)
    apply_dirs(api, [CRDS_DIR], timeout=60)
    if "istiod" in namespaces:
        # istiod expects what every real cluster has and the local one lacks.
        apply_objects(api, [cluster_dns_service()])
    create_mesh(api, {})
    for kind, name in namespaces.items():
        create_namespace(api, name, NAMESPACE_LABELS.get(kind, {}))


def measure(
    creators: int = 20,
    pods_per_creator: int = 30,
    warmup: int = 3,
    dry_runs: int = 200,
    sequential_pods: int = 500,
    istiod: bool = True,
) -> dict[str, Any]:
    """Run the benchmark on a private cluster; samples in seconds.

    Returns `idle` (dry-run, {"with": [...], "without": [...]}), `sequential`
    (one creator) and `load` (`creators` threads), each {kind: [...]} over
    "with", "without", "null" and (unless `istiod` is false) "istiod";
    `acted` ({kind: [changed, stored]}), the same counts for ours and the
    no-op as before (`injected`, `stored`, `null_injected`, `null_stored`),
    the API server's timing of its calls to ours (`server_webhook`) and to
    istiod's injector (`server_istiod`), and the operator's mean times per
    review.
    """
    namespaces = {
        "with": "bench-enrolled",
        "without": "bench-plain",
        "null": "bench-null",
        "tls": "bench-tls",
    }
    if istiod:
        namespaces["istiod"] = "bench-istiod"

    with (
        tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=default_bin_dir(), verbose=False) as cluster,
        api_client_for(cluster.kubeconfig) as api,
        contextlib.ExitStack() as stack,
    ):
        core = client.CoreV1Api(api)
        _setup(api, namespaces)
        if istiod:
            stack.enter_context(
                IstioControlPlane(cluster.kubeconfig, Path(tmp) / "istio", default_bin_dir())
            )
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
            _wait_acting(core, namespaces)
            idle = _dry_runs(core, namespaces, dry_runs)
            levels: dict[str, dict[str, list[float]]] = {}
            # Sequential first, on a cluster still idle: after a concurrent
            # burst the scheduler, kwok and istiod work through its pods for a while.
            for level, threads, per_thread in (
                ("sequential", 1, sequential_pods),
                ("load", creators, pods_per_creator),
            ):
                # Not counted: a level's first creates open the API server's
                # connections to each webhook, as many as it has calls in flight.
                _round(cluster.kubeconfig, namespaces, threads, warmup, f"{level}-warm")
                levels[level] = _round(cluster.kubeconfig, namespaces, threads, per_thread, level)
            acted = _acted(core, namespaces)
            seen_by_server = _server_webhook_histogram(api)
            seen_by_istiod = _server_webhook_histogram(api, ISTIO_INJECTOR)
            reviews = operator.metric("ambient_operator_webhook_decision_seconds_count")
            decide_sum = operator.metric("ambient_operator_webhook_decision_seconds_sum")
            serve_sum = operator.metric("ambient_operator_webhook_request_seconds_sum")
        finally:
            null.kill()
            null.wait()
            operator.stop()

    return {
        "server_webhook": seen_by_server,
        "server_istiod": seen_by_istiod,
        "creators": creators,
        "idle": idle,
        **levels,
        "acted": acted,
        "injected": acted["with"][0],
        "stored": acted["with"][1],
        "null_injected": acted["null"][0],
        "null_stored": acted["null"][1],
        "reviews": reviews,
        "decision_ms": decide_sum / reviews * 1000 if reviews else 0.0,
        "review_ms": serve_sum / reviews * 1000 if reviews else 0.0,
    }


def main() -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--creators", type=int, default=20)
    parser.add_argument("--pods-per-creator", type=int, default=30)
    parser.add_argument(
        "--sequential-pods", type=int, default=500, help="pods per namespace by one creator"
    )
    parser.add_argument("--warmup", type=int, default=3, help="pods per creator before measuring")
    parser.add_argument("--dry-runs", type=int, default=200, help="idle dry-run creates per side")
    parser.add_argument(
        "--no-istiod", action="store_true", help="leave istiod out (it takes a while to start)"
    )
    args = parser.parse_args()
    m = measure(
        args.creators,
        args.pods_per_creator,
        args.warmup,
        args.dry_runs,
        args.sequential_pods,
        istiod=not args.no_istiod,
    )

    # Every component and the creators share these CPUs: the added latency
    # under load is mostly the API server's extra work per call, queued.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"creators: {args.creators}; CPUs: {os.cpu_count()}; load average: {load}")
    changed = ", ".join(f"{LABELS[k]} {n}/{total}" for k, (n, total) in m["acted"].items())
    print(f"stored pods each webhook changed: {changed}")
    _report("idle cluster, sequential dry-run creates", m["idle"])
    _report("1 creator, sequential real creates", m["sequential"])
    added = _report(f"{args.creators} concurrent creators, real creates", m["load"])["with"][0.99]
    if m["reviews"]:
        print(
            f"in the operator, mean per review over {int(m['reviews'])}: decision "
            f"{m['decision_ms']:.3f} ms, whole review {m['review_ms']:.3f} ms"
        )
    for kind, key in (("with", "server_webhook"), ("istiod", "server_istiod")):
        server = m[key]
        if server["count"]:
            p50 = _bucket_quantile(server["buckets"], 0.5) * 1000
            p99 = _bucket_quantile(server["buckets"], 0.99) * 1000
            print(
                f"the API server's own timing of its {int(server['count'])} calls to "
                f"{LABELS[kind]}: mean {server['mean'] * 1000:.2f} ms, p50 <= {p50:g} ms, "
                f"p99 <= {p99:g} ms (histogram buckets)"
            )
    target = 20.0
    verdict = "meets" if added < target else "MISSES"
    print(f"p99 added latency under load {added:.2f} ms {verdict} the {target:.0f} ms target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
