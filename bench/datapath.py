"""The first data-path figures, on the real node (issue 42, item 7).

    .venv/bin/python bench/datapath.py [--requests N] [--pods N] [--idle-s S] [--out DIR]
                                       [--doc FILE | --no-doc] [--from-results FILE]

On a private control plane with the dev cluster's real Linux node, the
operator installed by Helm from its image runs Istio's Linux agents
(ambient_devcluster.realmesh, as tests/test_realnode_mesh.py). Then, in one run:

1. **Added latency.** In an enrolled namespace and in a plain one, a server
   pod (sample-app) and a client pod on the real node: the client makes
   `--requests` HTTP requests to the server's Service, each on a new
   connection, and prints each one's time from dial to the whole answer read
   (`sample-app get -timings`). The enrolled pair's requests go through
   ztunnel both ways (out of the client, into the server, mutual TLS over
   HBONE); the plain pair's do not. The client's first request in each pair
   is left out (DNS and first-connection set-up). p50 and p99 of each, and the
   difference: what ztunnel adds. ztunnel's own counter of mutual-TLS
   connections to the enrolled namespace is read before and after, and must
   have risen by the number of requests (the proof they went through it).
2. **Running → `redirection=enabled`.** `--pods` new pods in the enrolled
   namespace, one at a time: from the watch, when each was first seen with
   the annotation istio-cni writes and when first seen Running. istio-cni
   writes it during the CNI ADD, before the containers start, so the
   difference is expected to be negative (the annotation first).
3. **Idle agents.** With nothing talking for `--idle-s` seconds: CPU (user +
   system, from /proc, over the period) and resident set of ztunnel's and
   istio-cni's container processes on the node.

Results: `--out` (bench/out/datapath) gets results.json; the document
(docs/performance.md) gets its data-path section between its markers, the
rest left as it is. `--from-results` rewrites the section from a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import growth  # noqa: E402
from benchlib import cpu_seconds, proc_status_kib, quantile  # noqa: E402

BEGIN = "<!-- datapath:begin (bench/datapath.py writes this section) -->"
END = "<!-- datapath:end -->"


def pair_timings(core: Any, mesh: Any, namespace: str, requests: int) -> list[float]:
    """A server and its Service, then a client's request times in ms (the first left out)."""
    from ambient_devcluster.realmesh import get_server, serve

    image = mesh.images["sample-app"]
    serve(core, namespace, image)
    args = ["-timings", "-count", str(requests + 1)]
    phase, _, log = get_server(core, namespace, "client", image, args).partition("\n")
    if phase != "Succeeded":
        raise RuntimeError(f"the client in {namespace} ended {phase}: {log[-2000:]}")
    micros = [int(line) for line in log.split()]
    if len(micros) != requests + 1:
        raise RuntimeError(f"the client in {namespace} printed {len(micros)} times: {log[-500:]}")
    return [m / 1000 for m in micros[1:]]


def redirection_times(core: Any, mesh: Any, namespace: str, pods: int) -> list[dict[str, float]]:
    """Per new pod: seconds from creation to the annotation and to Running (watch-seen)."""
    from kubernetes import watch

    from ambient_devcluster.harness import wait_for
    from ambient_devcluster.manifests import apply_objects
    from ambient_devcluster.realmesh import REDIRECTION, app_pod

    image = mesh.images["sample-app"]
    seen: dict[str, dict[str, float]] = {}
    stop = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=600):
            now = time.monotonic()
            obj = event["object"]
            mark = seen.setdefault(obj.metadata.name, {})
            if (obj.metadata.annotations or {}).get(REDIRECTION) == "enabled":
                mark.setdefault("enabled", now)
            if obj.status and obj.status.phase == "Running":
                mark.setdefault("running", now)
            if stop.is_set():
                w.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    out = []
    for i in range(pods):
        name = f"new-{i}"
        created = time.monotonic()
        body = app_pod(name, image, ["serve"])
        body["metadata"]["namespace"] = namespace
        apply_objects(core.api_client, [body])
        marks = wait_for(
            lambda n=name: m if len(m := seen.get(n, {})) == 2 else None,
            120,
            f"{name} Running and annotated",
        )
        out.append(
            {
                "to_enabled_s": marks["enabled"] - created,
                "to_running_s": marks["running"] - created,
                "running_to_enabled_s": marks["enabled"] - marks["running"],
            }
        )
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    stop.set()
    return out


def idle_agents(mesh: Any, seconds: float) -> dict[str, dict[str, float]]:
    """CPU (% of a core) and RSS (MiB) of each agent's container processes over `seconds`."""
    from ambient_devcluster.realmesh import agents

    cni, ztunnel = agents(mesh.core)
    pids: dict[str, list[int]] = {}
    for label, agent in (("ztunnel", ztunnel), ("istio-cni", cni)):
        (status,) = agent.status.container_statuses
        pids[label] = mesh.node.container_pids(status.container_id.removeprefix("containerd://"))
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    time.sleep(seconds)  # the measured period itself: nothing is awaited
    out = {}
    for label, ps in pids.items():
        used = sum(cpu_seconds(p) for p in ps) - before[label]
        out[label] = {
            "cpu_pct": round(100 * used / seconds, 3),
            "rss_mib": round(sum(proc_status_kib(p, "VmRSS") for p in ps) / 1024, 1),
            "processes": len(ps),
        }
    return out


def measure(requests: int, pods: int, idle_s: float) -> dict[str, Any]:
    """One run on a fresh cluster with the real node (module docstring)."""
    from kubernetes import client

    from ambient_devcluster import (
        LocalCluster,
        apply_dirs,
        apply_objects,
        cluster_dns_service,
        create_nodes,
        default_bin_dir,
    )
    from ambient_devcluster.harness import SAMPLE_NODES, gateway_api_dir, wait_for
    from ambient_devcluster.realmesh import DATAPLANE_MODE, agents, real_mesh, ztunnel_count
    from ambient_devcluster.realnode import RealNode

    bin_dir = default_bin_dir()
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "requests": requests,
        "pods": pods,
        "idle_s": idle_s,
    }
    with (
        tempfile.TemporaryDirectory(prefix="ambient-datapath-") as scratch,
        LocalCluster(Path(scratch) / "cluster", bin_dir=bin_dir) as local,
    ):
        work = Path(scratch)
        with local.api_client() as api:
            apply_dirs(api, [REPO / "crds", gateway_api_dir("v1.6")], timeout=60)
            create_nodes(api, SAMPLE_NODES, timeout=60)
            apply_objects(api, [cluster_dns_service()])
        with (
            RealNode(local, bin_dir=bin_dir) as node,
            real_mesh(local, node, work, bin_dir, REPO / ".cache" / "images") as mesh,
        ):
            core = client.CoreV1Api(mesh.api)
            _, ztunnel = agents(core)
            namespaces = {}
            for kind, labels in (("enrolled", {DATAPLANE_MODE: "ambient"}), ("plain", {})):
                name = f"datapath-{kind}"
                core.create_namespace({"metadata": {"name": name, "labels": labels}})
                wait_for(
                    lambda n=name: core.read_namespaced_service_account("default", n), 60, "SA"
                )
                namespaces[kind] = name

            def mtls(ns: str) -> float:
                return ztunnel_count(
                    ztunnel.status.pod_ip,
                    "istio_tcp_connections_opened_total",
                    reporter="destination",
                    connection_security_policy="mutual_tls",
                    destination_workload_namespace=ns,
                )

            before = mtls(namespaces["enrolled"])
            result["latency_ms"] = {
                kind: pair_timings(core, mesh, ns, requests) for kind, ns in namespaces.items()
            }
            counted = mtls(namespaces["enrolled"]) - before
            plain = mtls(namespaces["plain"])
            if counted < requests + 1 or plain != 0:
                raise RuntimeError(
                    f"ztunnel counted {counted:.0f} mutual-TLS connections into the enrolled pair "
                    f"(want {requests + 1}) and {plain:.0f} into the plain one (want 0)"
                )
            result["ztunnel_mtls_counted"] = counted
            result["redirection"] = redirection_times(core, mesh, namespaces["enrolled"], pods)
            for ns in namespaces.values():
                core.delete_namespace(ns)
            result["idle"] = idle_agents(mesh, idle_s)
    result["kernel"] = os.uname().release
    result["finished"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    result["load_at_end"] = os.getloadavg()
    return result


def _q(values: Sequence[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f} ms"


def section(results: Mapping[str, Any]) -> str:
    """The data-path section of docs/performance.md (pure)."""
    lat = results.get("latency_ms") or {}
    q = {kind: (_q(values, 0.5), _q(values, 0.99)) for kind, values in lat.items()}
    enrolled, plain = q.get("enrolled", (None, None)), q.get("plain", (None, None))

    def added(i: int) -> str:
        a, b = enrolled[i], plain[i]
        return "—" if a is None or b is None else f"{a - b:+.2f} ms"

    red = results.get("redirection") or []
    r2e = [r["running_to_enabled_s"] * 1000 for r in red]
    c2e = [r["to_enabled_s"] * 1000 for r in red]
    idle = results.get("idle") or {}
    lines = [
        BEGIN,
        "## Data path on the real node (issue 42)",
        "",
        f"Measured {results.get('started', '?')} to {results.get('finished', '?')} by "
        "`make bench-datapath` (bench/datapath.py, whose docstring says exactly what is "
        "measured) on the dev cluster's real Linux node: Istio's ztunnel and istio-cni "
        "(`make images`, ztunnel e94018b3, Istio 1.31's), run by the operator installed by "
        f"`helm install`; kernel {results.get('kernel', '?')}; load average at the end "
        + ", ".join(f"{x:.2f}" for x in results.get("load_at_end") or [])
        + ". Client and server are on the same node, so an enrolled request crosses ztunnel "
        "twice (out of the client, into the server) over one HBONE connection.",
        "",
        "| figure | enrolled (through ztunnel) | plain | added by ztunnel |",
        "|---|---|---|---|",
        f"| request on a new connection, p50 (n={len(lat.get('enrolled', []))}) | "
        f"{_ms(enrolled[0])} | {_ms(plain[0])} | {added(0)} |",
        f"| request on a new connection, p99 | {_ms(enrolled[1])} | {_ms(plain[1])} | {added(1)} |",
        "",
        *(
            [
                "A negative difference is ztunnel saving more than it costs: the enrolled "
                "client's handshake ends at ztunnel inside its own pod's network namespace and "
                "the request rides an HBONE connection ztunnel keeps open, where the plain "
                "client's every connection crosses kube-proxy's DNAT and the bridge. The pairs "
                "ran one after the other; what else ran on the machine shows in the load "
                "average above.",
                "",
            ]
            if any(
                e is not None and p is not None and e < p
                for e, p in zip(enrolled, plain, strict=True)
            )
            else []
        ),
        f"ztunnel counted {results.get('ztunnel_mtls_counted', 0):.0f} mutual-TLS connections "
        "into the enrolled pair's namespace over the run (its requests and the left-out first "
        "one) and none into the plain pair's.",
        "",
        f"A new pod in the enrolled namespace (n={len(red)}), as the watch saw it: "
        f"created → `ambient.istio.io/redirection=enabled` p50 "
        f"{_ms(_q(c2e, 0.5))}, p99 {_ms(_q(c2e, 0.99))}; Running → enabled p50 "
        f"{_ms(_q(r2e, 0.5))}, p99 {_ms(_q(r2e, 0.99))} (negative: the annotation "
        "came first, since istio-cni writes it during the CNI ADD, before the containers run).",
        "",
        f"Idle, over {results.get('idle_s', 0):.0f} s with nothing talking:",
        "",
        "| agent | CPU (% of a core) | RSS |",
        "|---|---|---|",
    ]
    for agent in ("ztunnel", "istio-cni"):
        row = idle.get(agent)
        if row:
            lines.append(f"| {agent} | {row['cpu_pct']:.2f} % | {row['rss_mib']:.1f} MiB |")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure (or read a saved run), write results.json and the document's section."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "datapath")
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "performance.md")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--from-results", type=Path)
    args = ap.parse_args(argv)
    if args.from_results:
        results = json.loads(args.from_results.read_text())
    else:
        results = measure(args.requests, args.pods, args.idle_s)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    block = section(results)
    print(block)
    if not args.no_doc:
        args.doc.write_text(growth.splice(args.doc.read_text(), block, BEGIN, END))
    return 0


if __name__ == "__main__":
    sys.exit(main())
