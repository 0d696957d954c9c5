"""`istioctl analyze` finds nothing wrong with what the operator writes (issue 34, item 4).

`istioctl` is built from the same pinned `istio.io/istio` as istiod
(hack/cluster/istioctl, by hack/build-binaries.sh). The module has a control
plane of its own with Istio installed from its charts, the real istiod
running, and the operator beside it: agents on every OS, a waypoint of the
operator's class with a Service bound to it through `istio.io/use-waypoint`,
and one of istiod's class. `istioctl analyze -A -o json` reads that cluster;
any Warning or Error about the operator's objects fails the test. Which
objects are the operator's is read from the cluster (its managed-by label,
the Gateways of its class, the namespaces it enrolls), not from its code.

To show the check can fail, a Gateway of the operator's class with a
listener the operator refuses: the operator writes `Accepted=False`, and
Istio's conditions analyzer (pkg/config/analysis/analyzers/conditions)
reports IST0171 NegativeConditionStatus for a Gateway with Accepted False.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import IstioControlPlane, LocalCluster, apply_objects
from ambient_devcluster.harness import condition, get_mesh
from ambient_operator.api import constants as c
from conftest import BIN_DIR, REPO_ROOT, own_cluster, wait_for
from operator_harness import RunningOperator

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
ISTIO_NS = "istio-system"
APP_NS = "shop"
TIMEOUT = 90.0
# Only these levels fail the check; Info messages are advice (port naming and the like).
FAILING_LEVELS = ("Warning", "Error")


def test_istioctl_is_pinned_to_istiods_module() -> None:
    """hack/cluster/istioctl and hack/cluster/istio require the same istio.io/istio."""

    def pin(folder: str) -> str:
        text = (REPO_ROOT / "hack" / "cluster" / folder / "go.mod").read_text()
        found = re.findall(r"^require istio\.io/istio (\S+)$", text, re.MULTILINE)
        assert len(found) == 1, f"{folder}/go.mod: {found}"
        return found[0]

    assert pin("istioctl") == pin("istio")


@pytest.fixture(scope="module")
def analyze_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path_factory, "analyze-cluster", "istioctl", "pilot-discovery") as local:
        yield local


@pytest.fixture(scope="module")
def api(analyze_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    with analyze_cluster.api_client() as admin:
        yield admin


def _gateway(namespace: str, name: str, klass: str, listener: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": klass, "listeners": [listener]},
    }


MESH_LISTENER = {"name": "mesh", "port": 15008, "protocol": "HBONE"}


def _app(name: str, node: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """A pod pinned to a node and a Service selecting it."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": APP_NS, "labels": {"app": name}},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "app", "image": "registry.example/app:1"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": APP_NS, "labels": labels},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
        },
    ]


@pytest.fixture(scope="module")
def mesh(
    analyze_cluster: LocalCluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """istiod, the operator with the sample AmbientMesh, waypoints of both classes, an app."""
    plane = IstioControlPlane(
        analyze_cluster.kubeconfig, tmp_path_factory.mktemp("analyze-istiod"), BIN_DIR
    )
    with plane:
        op = RunningOperator(analyze_cluster, tmp_path_factory.mktemp("analyze-operator"))
        with op.running():
            sample = REPO_ROOT / "operator" / "ambient_operator" / "samples" / "ambientmesh.yaml"
            apply_objects(api, [yaml.safe_load(sample.read_text())])
            core = client.CoreV1Api(api)
            core.create_namespace(
                {"metadata": {"name": APP_NS, "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}}
            )
            wait_for(lambda: core.read_namespaced_service_account("default", APP_NS), 30, "SA")
            custom = client.CustomObjectsApi(api)
            for name, klass in (("wp", "ambient-waypoint"), ("istio-wp", "istio-waypoint")):
                custom.create_namespaced_custom_object(
                    GW_GROUP, GW_VERSION, APP_NS, "gateways",
                    _gateway(APP_NS, name, klass, MESH_LISTENER),
                )  # fmt: skip
            apply_objects(api, _app("web", "linux-amd64-1", {c.LABEL_USE_WAYPOINT: "wp"}))
            apply_objects(api, _app("win", "win2025-1", {c.LABEL_USE_WAYPOINT: "istio-wp"}))

            def bound() -> bool:
                gateways = [
                    custom.get_namespaced_custom_object(GW_GROUP, GW_VERSION, APP_NS, "gateways", n)
                    for n in ("wp", "istio-wp")
                ]
                if not all(condition(gw, "Programmed").get("status") == "True" for gw in gateways):
                    return False
                # istiod says on each Service whether it bound the waypoint.
                services = [core.read_namespaced_service(n, APP_NS) for n in ("web", "win")]
                return all(
                    any(
                        cond.type == "istio.io/WaypointBound" and cond.status == "True"
                        for cond in svc.status.conditions or []
                    )
                    for svc in services
                )

            wait_for(bound, TIMEOUT, "both waypoints Programmed and bound by istiod")
            wait_for(
                lambda: condition(get_mesh(api), "Ready").get("status") == "True",
                TIMEOUT,
                "the AmbientMesh Ready",
            )
            yield
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]
    assert "panic:" not in plane.log_file.read_text(errors="replace")


def analyze(cluster: LocalCluster) -> tuple[int, list[dict[str, Any]]]:
    """`istioctl analyze -A -o json` on the cluster: its exit code and messages."""
    done = subprocess.run(
        [
            str(BIN_DIR / "istioctl"),
            "analyze",
            "--all-namespaces",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.stdout.lstrip().startswith("["), (done.returncode, done.stdout, done.stderr)
    messages: list[dict[str, Any]] = json.loads(done.stdout)
    return done.returncode, messages


def operators_objects(api: client.ApiClient) -> set[str]:
    """The analyzer's names (`Kind namespace/name`, `Namespace name`) of what is the operator's.

    Read from the cluster: every object labelled managed-by ambient-operator,
    the Gateways of its class, the namespaces it enrolls and the Services and
    pods in them, which its agents and waypoints serve.
    """
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    managed = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
    names: set[str] = set()
    for kind, listing in (
        ("DaemonSet", apps.list_daemon_set_for_all_namespaces(label_selector=managed)),
        ("Deployment", apps.list_deployment_for_all_namespaces(label_selector=managed)),
        ("Service", core.list_service_for_all_namespaces(label_selector=managed)),
        ("ServiceAccount", core.list_service_account_for_all_namespaces(label_selector=managed)),
        ("ConfigMap", core.list_config_map_for_all_namespaces(label_selector=managed)),
        ("Pod", core.list_pod_for_all_namespaces(label_selector=managed)),
    ):
        names |= {f"{kind} {o.metadata.namespace}/{o.metadata.name}" for o in listing.items}
    gateways = client.CustomObjectsApi(api).list_cluster_custom_object(
        GW_GROUP, GW_VERSION, "gateways"
    )
    names |= {
        f"Gateway {gw['metadata']['namespace']}/{gw['metadata']['name']}"
        for gw in gateways["items"]
        if gw["spec"]["gatewayClassName"] == "ambient-waypoint"
    }
    enrolled = [
        ns.metadata.name
        for ns in core.list_namespace(label_selector=f"{c.LABEL_DATAPLANE_MODE}=ambient").items
    ]
    for ns in enrolled:
        names.add(f"Namespace {ns}")
        names |= {f"Service {ns}/{s.metadata.name}" for s in core.list_namespaced_service(ns).items}
        names |= {f"Pod {ns}/{p.metadata.name}" for p in core.list_namespaced_pod(ns).items}
    return names


def failures(messages: list[dict[str, Any]], ours: set[str]) -> list[str]:
    """Warnings and errors about the operator's objects, or about no object at all."""
    return [
        f"{m['level']} [{m['code']}] {m.get('origin', '')}: {m['message']}"
        for m in messages
        if m["level"] in FAILING_LEVELS and (not m.get("origin") or m["origin"] in ours)
    ]


def test_failures_keep_warnings_about_ours_only() -> None:
    """The filter itself, on messages shaped as istioctl writes them."""
    ours = {"Gateway shop/wp", "Namespace shop"}
    messages = [
        {"level": "Warning", "code": "IST0171", "origin": "Gateway shop/wp", "message": "a"},
        {"level": "Info", "code": "IST0118", "origin": "Gateway shop/wp", "message": "b"},
        {"level": "Warning", "code": "IST0123", "origin": "Namespace other", "message": "c"},
        {"level": "Error", "code": "IST0141", "message": "d"},
        {"level": "Error", "code": "IST0101", "origin": "Namespace shop", "message": "e"},
    ]
    assert failures(messages, ours) == [
        "Warning [IST0171] Gateway shop/wp: a",
        "Error [IST0141] : d",
        "Error [IST0101] Namespace shop: e",
    ]


def test_istioctl_analyze_finds_nothing_wrong_with_our_objects(
    analyze_cluster: LocalCluster, api: client.ApiClient, mesh: None
) -> None:
    ours = operators_objects(api)
    # What the check covers: the agents on every platform, the waypoint and what it owns.
    assert {
        f"DaemonSet {ISTIO_NS}/ztunnel",
        f"DaemonSet {ISTIO_NS}/istio-cni-node",
        f"Gateway {APP_NS}/wp",
        f"Deployment {APP_NS}/wp",
        f"Service {APP_NS}/wp",
        f"Service {APP_NS}/web",
        f"Namespace {APP_NS}",
    } <= ours, sorted(ours)
    code, messages = analyze(analyze_cluster)
    assert failures(messages, ours) == [], json.dumps(messages, indent=2)
    assert code == 0, messages


def test_the_check_fails_on_a_gateway_the_operator_refuses(
    analyze_cluster: LocalCluster, api: client.ApiClient, mesh: None
) -> None:
    """An HTTP listener on a waypoint of our class: Accepted=False, and analyze says so."""
    custom = client.CustomObjectsApi(api)
    listener = {"name": "http", "port": 80, "protocol": "HTTP"}
    custom.create_namespaced_custom_object(
        GW_GROUP,
        GW_VERSION,
        APP_NS,
        "gateways",
        _gateway(APP_NS, "bad", "ambient-waypoint", listener),
    )
    try:

        def refused() -> dict[str, Any] | None:
            gw = custom.get_namespaced_custom_object(
                GW_GROUP, GW_VERSION, APP_NS, "gateways", "bad"
            )
            accepted, programmed = condition(gw, "Accepted"), condition(gw, "Programmed")
            if accepted.get("status") == "False" == programmed.get("status"):
                return gw
            return None

        gw = wait_for(refused, TIMEOUT, "the operator to refuse the HTTP listener")
        code, messages = analyze(analyze_cluster)
        found = failures(messages, operators_objects(api))
        assert found == [
            f"Warning [IST0171] Gateway {APP_NS}/bad: A condition with a negative status is "
            f"present: type={cond['type']}, reason={cond['reason']}, message={cond['message']}."
            for cond in (condition(gw, "Accepted"), condition(gw, "Programmed"))
        ], json.dumps(messages, indent=2)
        # istioctl's own verdict: a Warning is below its default failure threshold (Error).
        assert code == 0
    finally:
        custom.delete_namespaced_custom_object(GW_GROUP, GW_VERSION, APP_NS, "gateways", "bad")
