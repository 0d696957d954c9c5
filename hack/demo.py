"""`make demo`: the operator on a local simulated mixed-OS cluster, and a report.

Starts etcd, kube-apiserver, controller-manager, scheduler and kwok (fake
nodes that run pods without containers), installs our CRDs and the Gateway
API CRDs, installs Istio from its own charts (base and istiod, profile
ambient) and runs the real istiod out of cluster, runs the operator, enrolls
a namespace with Linux and Windows workloads, creates a waypoint and a 50/50
HTTPRoute, prints what runs where and why -- and what istiod itself makes of
it -- and stops everything. Nothing in that part sends real traffic: the
pods are simulated, so the report shows placement, status, admission
decisions and istiod's ambient index.

Then the real node (unless --no-real-node): a second control plane whose
dev cluster runs a real Linux node beside kwok's simulated Linux and Windows
nodes; the operator installed by `helm install` from its image runs there,
with Istio's Linux agents (ztunnel, istio-cni) built by `make images`. An
enrolled pair of pods talks through ztunnel (ztunnel's own mutual-TLS count
rises) and a plain pair past it (the count stays). Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
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
    SAMPLES_DIR,
    OperatorProcess,
    free_port,
    wait_for,
    webhook_args,
)
from ambient_operator.webhook.decide import ANNOTATION, CONTAINER_NAME

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = SAMPLES_DIR
NS = "demo"
MESH = ("ambientoperator.io", "v1alpha1", "ambientmeshes", "default")


def say(text: str) -> None:
    """One progress line."""
    print(f"==> {text}", flush=True)


def wait(what: str, predicate: Callable[[], Any], timeout: float = 120.0) -> bool:
    """Poll until truthy; report a timeout instead of failing the demo."""
    try:
        wait_for(predicate, timeout, what, interval=0.5)
    except TimeoutError:
        say(f"(gave up waiting for {what} after {timeout:.0f}s)")
        return False
    return True


@contextlib.contextmanager
def operator_process(cluster: LocalCluster, workdir: Path) -> Iterator[OperatorProcess]:
    """`ambient-operator run` with the webhook on loopback, logging to a file."""
    operator = OperatorProcess(cluster, workdir, webhook_args(free_port(), "istio-system"))
    with operator.running():
        yield operator


def workloads() -> list[dict[str, Any]]:
    """curl and httpbin on Linux, a web server on Windows, and the Services between them."""

    def deployment(name: str, image: str, spec_extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": name, "image": image}], **spec_extra},
                },
            },
        }

    def service(
        name: str, selector: str | None, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"ports": [{"name": "http", "port": 80}]}
        if selector:
            spec["selector"] = {"app": selector}
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": spec,
        }

    linux = {"nodeSelector": {"kubernetes.io/os": "linux"}}
    # Pinned to WS2022: its new pods need the redirection-wait init container.
    windows = {
        "nodeSelector": {
            "kubernetes.io/os": "windows",
            "node.kubernetes.io/windows-build": "10.0.20348",
        },
        "tolerations": [
            {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}
        ],
    }
    return [
        deployment("curl", "docker.io/curlimages/curl:8.11.0", linux),
        deployment("httpbin", "docker.io/kennethreitz/httpbin:latest", linux),
        deployment(
            "web-windows",
            "mcr.microsoft.com/windows/servercore/iis:windowsservercore-ltsc2022",
            windows,
        ),
        service("web-linux", "httpbin"),
        service("web-windows", "web-windows"),
        service("web", "httpbin", {"istio.io/use-waypoint": "waypoint"}),
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web-split", "namespace": NS},
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
                "rules": [
                    {
                        "backendRefs": [
                            {"name": "web-linux", "port": 80, "weight": 50},
                            {"name": "web-windows", "port": 80, "weight": 50},
                        ]
                    }
                ],
            },
        },
    ]


def report(api: client.ApiClient, kubectl: list[str]) -> None:
    """What runs where, and why."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    mesh = custom.get_cluster_custom_object(*MESH)
    status = mesh.get("status", {})
    print("\n" + "=" * 78)
    print("AmbientMesh (kubectl get ambientmesh)")
    table = subprocess.run(
        [*kubectl, "get", "ambientmesh"], check=True, capture_output=True, text=True
    )
    print(table.stdout)
    for cond in status.get("conditions", []):
        print(f"  {cond['type']:<11} {cond['status']:<6} {cond['reason']}: {cond['message'][:150]}")

    print("\nAgents by node")
    agents: dict[str, list[str]] = {}
    for pod in core.list_namespaced_pod("istio-system").items:
        owner = (pod.metadata.owner_references or [None])[0]
        if owner is not None and owner.kind == "DaemonSet" and pod.spec.node_name:
            agents.setdefault(pod.spec.node_name, []).append(f"{owner.name} ({pod.status.phase})")
    for node in sorted(core.list_node().items, key=lambda n: n.metadata.name):
        labels = node.metadata.labels or {}
        kind = labels.get("kubernetes.io/os", "?")
        build = labels.get("node.kubernetes.io/windows-build", "")
        what = ", ".join(sorted(agents.get(node.metadata.name, []))) or "no agent"
        print(f"  {node.metadata.name:<16} {kind:<8} {build:<11} {what}")

    print("\nUnsupported nodes")
    for node in status.get("nodes", {}).get("unsupportedNodes", []):
        print(f"  {node['name']}: {node['reason']}: {node['message']}")

    print("\nWaypoint Gateway demo/waypoint")
    gw = custom.get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", NS, "gateways", "waypoint"
    )
    for cond in gw.get("status", {}).get("conditions", []):
        print(f"  {cond['type']:<11} {cond['status']:<6} {cond['reason']}")
    for addr in gw.get("status", {}).get("addresses", []):
        print(f"  address {addr.get('type', 'IPAddress')}: {addr['value']}")
    wp_pods = core.list_namespaced_pod(
        NS, label_selector="gateway.networking.k8s.io/gateway-name"
    ).items
    for pod in wp_pods:
        print(f"  waypoint pod {pod.metadata.name} on {pod.spec.node_name} ({pod.status.phase})")

    print("\nHTTPRoute demo/web-split: 50% web-linux (httpbin), 50% web-windows")
    print("\nWorkload pods and the redirection-wait init container")
    for pod in sorted(core.list_namespaced_pod(NS).items, key=lambda p: p.metadata.name):
        inits = {c.name: c.image for c in pod.spec.init_containers or []}
        note = (pod.metadata.annotations or {}).get(ANNOTATION, "-")
        mark = f"injected {inits[CONTAINER_NAME]}" if CONTAINER_NAME in inits else "none"
        print(
            f"  {pod.metadata.name:<36} on {pod.spec.node_name or '-':<14} init: {mark:<8} "
            f"why: {note}"
        )
    print("=" * 78)


def istio_captured(istio: IstioControlPlane) -> list[dict[str, Any]]:
    """istiod's workloads of the demo namespace whose traffic ztunnel captures (HBONE)."""
    view = istio.debug("/debug/ambientz")
    return [
        w
        for w in view.get("workloads") or []
        if w.get("namespace") == NS
        and w.get("tunnelProtocol") == "HBONE"
        # A sidecar that speaks HBONE itself is nativeTunnel; ztunnel captures the rest.
        and not w.get("nativeTunnel")
    ]


def istio_report(api: client.ApiClient, istio: IstioControlPlane) -> None:
    """What istiod itself made of our objects, from its /debug/ambientz."""
    view = istio.debug("/debug/ambientz")
    oses = {
        n.metadata.name: (n.metadata.labels or {}).get("kubernetes.io/os", "?")
        for n in client.CoreV1Api(api).list_node().items
    }
    print("\nistiod's view (/debug/ambientz of the real istiod)")
    print("  Services of namespace demo and the waypoint istiod binds each to:")
    for svc in sorted(view.get("services") or [], key=lambda s: s["name"]):
        if svc.get("namespace") != NS:
            continue
        waypoint = ((svc.get("waypoint") or {}).get("hostname") or {}).get("hostname")
        print(f"    {svc['name']:<14} -> {f'waypoint {waypoint}' if waypoint else 'no waypoint'}")
    per_os: dict[str, list[str]] = {}
    for w in istio_captured(istio):
        per_os.setdefault(oses.get(w.get("node", ""), "?"), []).append(w["name"])
    print("  Ambient (HBONE) workloads istiod sees, by node OS:")
    for os_name, names in sorted(per_os.items()):
        print(f"    {os_name:<8} {len(names)}: {', '.join(sorted(names))}")
    mesh = client.CustomObjectsApi(api).get_cluster_custom_object(*MESH)
    enrollment = mesh.get("status", {}).get("enrollment", {})
    print(
        "  The AmbientMesh counts redirected pods: linux "
        f"{enrollment.get('linuxPods', {}).get('enabled', 0)}, windows "
        f"{enrollment.get('windowsPods', {}).get('enabled', 0)} (all namespaces)"
    )
    print("=" * 78)


def real_node_act(workdir: Path) -> int:
    """The real node: the operator's image installed by Helm runs Istio's Linux
    agents for real pods, and an enrolled pair talks mutual TLS through ztunnel."""
    from ambient_devcluster.realmesh import (
        DATAPLANE_MODE,
        REDIRECTION,
        agents,
        get_server,
        real_mesh,
        serve,
        ztunnel_count,
    )
    from ambient_devcluster.realnode import NODE_NAME, RealNode

    say(
        "the real node: a second local control plane, with a real Linux node (containerd, "
        "runc, the kubelet) beside kwok's simulated Linux and Windows nodes"
    )
    bin_dir = default_bin_dir()
    with LocalCluster(workdir / "cluster", bin_dir=bin_dir) as cluster:
        api = api_client_for(cluster.kubeconfig)
        kubectl = [str(cluster.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig)]
        create_nodes(api, SAMPLES / "nodes-mixed.yaml", timeout=120)
        apply_dirs(api, [ROOT / "crds", ROOT / ".cache" / "gateway-api" / "v1.6"], timeout=120)
        apply_objects(api, [cluster_dns_service()])
        say("starting the real node; then istiod, `helm install` of our chart, the AmbientMesh")
        with (
            RealNode(cluster, bin_dir=bin_dir) as node,
            real_mesh(cluster, node, workdir, bin_dir, ROOT / ".cache" / "images") as mesh,
        ):
            core = mesh.core
            _, ztunnel = agents(core)
            print("\n" + "=" * 78)
            print("Nodes (kubectl get nodes -L node.kubernetes.io/windows-build)")
            nodes = [*kubectl, "get", "nodes", "-L", "node.kubernetes.io/windows-build"]
            print(subprocess.run(nodes, check=True, capture_output=True, text=True).stdout)
            print(f"Pods on the real node {NODE_NAME} (the operator from its image, the agents)")
            pods = [*kubectl, "get", "pods", "-A", "-o", "wide"]
            pods += ["--field-selector", f"spec.nodeName={NODE_NAME}"]
            print(subprocess.run(pods, check=True, capture_output=True, text=True).stdout)
            image = mesh.images["sample-app"]
            for kind, labels in (("enrolled", {DATAPLANE_MODE: "ambient"}), ("plain", {})):
                ns = f"demo-{kind}"
                apply_objects(
                    api,
                    [{"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": ns, "labels": labels}}],
                )  # fmt: skip
                wait(
                    "the default ServiceAccount",
                    lambda n=ns: core.read_namespaced_service_account("default", n),
                )
                serve(core, ns, image)

                def opened(n: str = ns) -> float:
                    return ztunnel_count(
                        ztunnel.status.pod_ip,
                        "istio_tcp_connections_opened_total",
                        reporter="destination",
                        connection_security_policy="mutual_tls",
                        destination_workload_namespace=n,
                    )

                before = opened()
                phase, _, log = get_server(core, ns, "client", image, ["-count", "3"]).partition(
                    "\n"
                )
                after = opened()
                server = core.read_namespaced_pod("server", ns)
                mark = (server.metadata.annotations or {}).get(REDIRECTION, "(none)")
                print(f"{kind} pair in namespace {ns} (labels {labels or 'none'}):")
                print(f"  server's {REDIRECTION}: {mark}")
                print(f"  client {phase}: " + " | ".join(log.strip().splitlines()))
                print(
                    f"  ztunnel's istio_tcp_connections_opened_total (mutual_tls, into {ns}): "
                    f"{before:.0f} -> {after:.0f}"
                )
            print("=" * 78)
    return 0


def main() -> int:
    """Run the demo end to end."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default=str(ROOT / ".cache" / "demo"))
    parser.add_argument(
        "--no-real-node",
        action="store_true",
        help="leave out the real node's part (it needs root and `make images`)",
    )
    args = parser.parse_args()
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.monotonic()
    say(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, "
        "scheduler, kwok)"
    )
    with LocalCluster(workdir / "cluster", bin_dir=default_bin_dir()) as cluster:
        api = api_client_for(cluster.kubeconfig)
        kubectl = [str(cluster.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig)]
        say("creating the sample nodes: 2 Linux amd64, Linux arm64, WS2022, WS2025, WS2019")
        create_nodes(api, SAMPLES / "nodes-mixed.yaml", timeout=120)
        say("installing our CRDs and the Gateway API CRDs (v1.6)")
        apply_dirs(api, [ROOT / "crds", ROOT / ".cache" / "gateway-api" / "v1.6"], timeout=120)
        apply_objects(api, [cluster_dns_service()])
        say("installing Istio's base and istiod charts (profile=ambient) and starting istiod")
        istio = IstioControlPlane(cluster.kubeconfig, workdir / "istiod", default_bin_dir())
        with istio, operator_process(cluster, workdir) as proc:
            say("istiod and the operator run (logs: .cache/demo/istiod/istiod.log, operator.log)")
            say("applying the sample AmbientMesh")
            apply_objects(api, [yaml.safe_load((SAMPLES / "ambientmesh.yaml").read_text())])
            custom = client.CustomObjectsApi(api)

            def ready() -> bool:
                conds = (
                    custom.get_cluster_custom_object(*MESH).get("status", {}).get("conditions", [])
                )
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

            wait("the data plane to be Ready", ready, 180)
            say(f"enrolling namespace {NS} with a waypoint (ambient-operator waypoint apply)")
            apply_objects(
                api, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]
            )
            wait(
                "the default ServiceAccount",
                lambda: client.CoreV1Api(api).read_namespaced_service_account("default", NS),
            )
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ambient_operator.cli.main",
                    "waypoint",
                    "apply",
                    "-n",
                    NS,
                    "--enroll-namespace",
                    "--kubeconfig",
                    str(cluster.kubeconfig),
                ],
                check=True,
                cwd=ROOT,
            )
            say("deploying curl and httpbin (Linux), a web server (Windows), a 50/50 HTTPRoute")
            apply_objects(api, workloads())

            def programmed() -> bool:
                gw = custom.get_namespaced_custom_object(
                    "gateway.networking.k8s.io", "v1", NS, "gateways", "waypoint"
                )
                return any(
                    c["type"] == "Programmed" and c["status"] == "True"
                    for c in gw.get("status", {}).get("conditions", [])
                )

            wait("the waypoint to be Programmed", programmed, 120)
            wait(
                "the workloads to run",
                lambda: (
                    all(
                        p.status.phase == "Running"
                        for p in client.CoreV1Api(api).list_namespaced_pod(NS).items
                    )
                    and len(client.CoreV1Api(api).list_namespaced_pod(NS).items) >= 4
                ),
                120,
            )
            # istiod learns of a pod's redirection from istio-cni's annotation;
            # no CNI runs under kwok, so the demo writes it as istio-cni would.
            for pod in client.CoreV1Api(api).list_namespaced_pod(NS).items:
                if pod.metadata.labels.get("app") in ("curl", "httpbin", "web-windows"):
                    client.CoreV1Api(api).patch_namespaced_pod_status(
                        pod.metadata.name,
                        NS,
                        {"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}},
                    )
            wait("istiod to see the redirected pods", lambda: len(istio_captured(istio)) >= 3, 60)

            def counted() -> bool:
                mesh = custom.get_cluster_custom_object(*MESH)
                enrollment = mesh.get("status", {}).get("enrollment", {})
                return (
                    sum(
                        enrollment.get(f"{os_name}Pods", {}).get("enabled", 0)
                        for os_name in ("linux", "windows")
                    )
                    >= 3
                )

            wait("the AmbientMesh to count them", counted, 60)
            report(api, kubectl)
            istio_report(api, istio)
            if not proc.alive():
                say("the operator exited early; see .cache/demo/operator.log")
                return 1
        say("stopping the operator and the control plane")
    if not args.no_real_node and real_node_act(workdir / "real") != 0:
        return 1
    say(f"done in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
