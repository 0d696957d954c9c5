"""`ambient-operator precheck` run as a user runs it, on a broken cluster and then a healthy one.

The module has a control plane of its own. First it is broken the ways the
issue lists: no istiod, a WS2019 node, a namespace with the near-miss key
`data-plane-mode: ambient`, upstream's ztunnel chart installed (rendered by
the real `helm` from Istio's own chart), and an enrolled Windows pod on a
WS2022 node admitted while no webhook ran. Then it is made healthy: those
removed, Istio installed from its charts with `profile=ambient` and a real
istiod running, the operator running with its webhook. Each time the
command runs as a subprocess; its exit code and its JSON are checked against
literal expectations, and the audit log shows it only read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import (
    IstioControlPlane,
    LocalCluster,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
    create_nodes,
    delete_nodes,
)
from ambient_devcluster.istio import charts_dir, helm
from ambient_devcluster.nodes import load_inventory
from conftest import BIN_DIR, SAMPLE_NODES, binaries_present, wait_for
from operator_harness import AuditLog, RunningOperator, free_port, webhook_args

ROOT = Path(__file__).resolve().parents[1]
GATEWAY_API = ROOT / ".cache" / "gateway-api" / "v1.6"
ISTIO_NS = "istio-system"
PRECHECK_USER = "precheck-user"
NODES = ("linux-amd64-1", "win2022-1")
WS2019_NODE = "win2019-1"
# The agents' version (the sample's tag) and istiod's image tag: the
# istiod binary is the pinned module's, which is Istio 1.31.0.
ISTIOD_TAG = "1.31.0"


@pytest.fixture(scope="module")
def pc_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not binaries_present() or not (BIN_DIR / "pilot-discovery").exists():
        pytest.fail(f"binaries missing in {BIN_DIR}; run hack/build-binaries.sh")
    with LocalCluster(tmp_path_factory.mktemp("precheck-cluster"), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [ROOT / "crds", GATEWAY_API], timeout=60)
            wanted = (*NODES, WS2019_NODE)
            inventory = [n for n in load_inventory(SAMPLE_NODES) if n["metadata"]["name"] in wanted]
            assert len(inventory) == 3
            create_nodes(api, inventory, timeout=60)
            apply_objects(api, [cluster_dns_service()])
        yield local


@pytest.fixture(scope="module")
def api(pc_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    with pc_cluster.api_client() as admin:
        yield admin


def precheck(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The command, as a user with cluster-admin rights runs it."""
    kubeconfig = cluster.user_kubeconfig(PRECHECK_USER, ["system:masters"])
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ambient_operator.cli.main",
            "precheck",
            "--kubeconfig",
            str(kubeconfig),
            *args,
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def run_json(cluster: LocalCluster) -> tuple[int, dict[str, Any]]:
    done = precheck(cluster, "-o", "json")
    assert done.stderr == "", done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, body


def levels(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["check"], f["level"]) for f in body["findings"]]


def finding(body: dict[str, Any], check: str, level: str) -> dict[str, Any]:
    found = [f for f in body["findings"] if f["check"] == check and f["level"] == level]
    assert len(found) == 1, body["findings"]
    return found[0]


def _gateway_bundle() -> str:
    """The Gateway API release its own CRD file names (the module's, not ours)."""
    crd = yaml.safe_load((GATEWAY_API / "gateway.networking.k8s.io_gateways.yaml").read_text())
    return str(crd["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"])


def _upstream_ztunnel() -> list[dict[str, Any]]:
    """Istio's ztunnel chart as `helm template` renders it: its DaemonSet and account."""
    done = helm(
        BIN_DIR,
        "template",
        "ztunnel",
        str(charts_dir() / "ztunnel"),
        "--namespace",
        ISTIO_NS,
        "--set",
        "profile=ambient",
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    picked = [d for d in docs if d["kind"] in ("DaemonSet", "ServiceAccount")]
    assert sorted(d["kind"] for d in picked) == ["DaemonSet", "ServiceAccount"]
    return picked


def _windows_pod(namespace: str, name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "os": {"name": "windows"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        },
    }


@pytest.fixture(scope="module")
def broken(api: client.ApiClient) -> Iterator[None]:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ISTIO_NS}})
    core.create_namespace({"metadata": {"name": "talk", "labels": {"data-plane-mode": "ambient"}}})
    core.create_namespace(
        {"metadata": {"name": "win-apps", "labels": {"istio.io/dataplane-mode": "ambient"}}}
    )
    wait_for(lambda: core.read_namespaced_service_account("default", "win-apps"), 30, "SA")
    core.create_namespaced_pod("win-apps", _windows_pod("win-apps", "web", "win2022-1"))
    apply_objects(api, _upstream_ztunnel(), field_manager="helm")
    yield


def test_a_broken_cluster_blocks(
    pc_cluster: LocalCluster, api: client.ApiClient, broken: None
) -> None:
    audit = AuditLog(pc_cluster.audit_log)
    since = audit.mark()
    code, body = run_json(pc_cluster)
    assert code == 1
    assert levels(body) == [
        ("kubernetes", "ok"),
        ("nodes", "info"),
        ("nodes", "warning"),
        ("platform", "info"),
        ("istiod", "blocking"),
        ("ambient-enabled", "info"),
        ("node-trust", "info"),
        ("multi-cluster", "info"),
        ("version-skew", "info"),
        ("gateway-api", "ok"),
        ("upstream-agents", "blocking"),
        ("helm-releases", "ok"),
        ("revisions", "ok"),
        ("held-templates", "ok"),
        ("namespace-labels", "warning"),
        ("windows-pods", "warning"),
        ("bundled-images", "warning"),
        ("windows-limits", "info"),
        ("webhook", "info"),
    ]
    assert (body["blocked"], body["blocking"], body["warnings"]) == (True, 2, 4)
    assert finding(body, "kubernetes", "ok")["message"] == (
        "Kubernetes 1.37 (supported: 1.30 to 1.37)"
    )
    assert finding(body, "nodes", "info")["items"] == [
        "linux/amd64: 1 node(s)",
        "windows/amd64 Windows Server 2019 (10.0.17763): 1 node(s)",
        "windows/amd64 Windows Server 2022 (10.0.20348): 1 node(s)",
    ]
    unsupported = finding(body, "nodes", "warning")
    assert [item.split(": ")[:2] for item in unsupported["items"]] == [
        ["win2019-1", "WindowsBuildUnsupported"]
    ]
    assert finding(body, "istiod", "blocking")["message"].startswith(
        "no istiod: Service istio-system/istiod not found."
    )
    assert finding(body, "gateway-api", "ok")["message"] == (
        f"Gateway API {_gateway_bundle()} (standard)"
    )
    assert finding(body, "upstream-agents", "blocking")["items"] == [
        "istio-system/ztunnel: ztunnel, managed by Helm"
    ]
    labels = finding(body, "namespace-labels", "warning")
    assert [item.split(": ")[:2] for item in labels["items"]] == [
        ["talk", "MisspelledDataplaneMode"]
    ]
    assert "the key is istio.io/dataplane-mode" in labels["items"][0]
    assert finding(body, "windows-pods", "warning")["items"] == [
        "win-apps/web: ScheduledOnPreWS2025Node: bound to node win2022-1 (build 10.0.20348)"
    ]
    assert finding(body, "webhook", "info")["message"] == "not installed yet (no AmbientMesh)"
    # No AmbientMesh, no operator: nothing names where the Windows images come from.
    bundled = finding(body, "bundled-images", "warning")
    assert bundled["message"] == (
        "3 image(s) the Windows nodes need are unset or placeholders; "
        "`make images REGISTRY=<registry>` builds and pushes them (docs/images.md)"
    )
    assert [item.split(":")[0] for item in bundled["items"]] == [
        "spec.images.ztunnel.windows is unset, and so is spec.images.registry",
        "spec.images.istioCni.windows is unset, and so is spec.images.registry",
        "spec.newPodWorkaround.multiBuildImage is unset, and so is spec.images.registry",
    ]

    # The same as a person reads it, with the same exit code.
    done = precheck(pc_cluster)
    assert done.returncode == 1
    assert "[BLOCK] istiod: no istiod" in done.stdout
    assert done.stdout.endswith(
        "ambient will not work here as things are: 2 blocking, 4 warning(s)\n"
    )
    # It only read.
    events = audit.events(since, user=PRECHECK_USER)
    assert len(events) > 10
    assert sorted({e["verb"] for e in events}) == ["get", "list"]


@pytest.fixture(scope="module")
def healthy(
    pc_cluster: LocalCluster,
    api: client.ApiClient,
    broken: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[int]:
    """The broken parts removed; Istio from its charts, istiod and the operator running."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    apps.delete_namespaced_daemon_set("ztunnel", ISTIO_NS)
    core.delete_namespaced_service_account("ztunnel", ISTIO_NS)
    core.delete_namespaced_pod("web", "win-apps", grace_period_seconds=0)
    core.patch_namespace(
        "talk",
        {"metadata": {"labels": {"data-plane-mode": None, "istio.io/dataplane-mode": "ambient"}}},
    )
    delete_nodes(api, [WS2019_NODE], timeout=60)
    wait_for(lambda: not core.list_namespaced_pod("win-apps").items, 60, "the Windows pod gone")
    plane = IstioControlPlane(
        pc_cluster.kubeconfig,
        tmp_path_factory.mktemp("precheck-istiod"),
        BIN_DIR,
        values={"tag": ISTIOD_TAG},
    )
    port = free_port()
    with plane:
        op = RunningOperator(
            pc_cluster,
            tmp_path_factory.mktemp("precheck-operator"),
            extra_args=webhook_args(port, ISTIO_NS),
        )
        with op.running():
            sample = ROOT / "operator" / "ambient_operator" / "samples" / "ambientmesh.yaml"
            apply_objects(api, [yaml.safe_load(sample.read_text())])
            admission = client.AdmissionregistrationV1Api(api)
            wait_for(
                lambda: admission.read_mutating_webhook_configuration("ambient-operator"),
                90,
                "the webhook configured",
            )
            yield port
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _revisions_reported(api: client.ApiClient) -> bool:
    mesh = client.CustomObjectsApi(api).get_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default"
    )
    return bool((mesh.get("status") or {}).get("revisions"))


def test_a_healthy_cluster_passes(
    pc_cluster: LocalCluster, api: client.ApiClient, healthy: int
) -> None:
    # The revisions row reads the operator's status.revisions: wait for its first write.
    wait_for(lambda: _revisions_reported(api), 90, "status.revisions written")
    code, body = run_json(pc_cluster)
    assert code == 0, body
    assert levels(body) == [
        ("kubernetes", "ok"),
        ("nodes", "info"),
        ("nodes", "ok"),
        ("platform", "info"),
        ("istiod", "ok"),
        ("ambient-enabled", "ok"),
        ("node-trust", "ok"),
        ("multi-cluster", "ok"),
        # 1.31.1 is known (api/releases.py): a newer patch than the sample's.
        ("version-skew", "warning"),
        ("gateway-api", "ok"),
        ("upstream-agents", "ok"),
        ("helm-releases", "ok"),
        ("revisions", "info"),
        ("held-templates", "ok"),
        ("namespace-labels", "ok"),
        ("windows-pods", "ok"),
        ("bundled-images", "ok"),
        # Windows nodes, not on AKS: the Windows data plane's limits, told.
        ("windows-limits", "info"),
        ("webhook", "ok"),
    ]
    assert (body["blocked"], body["blocking"], body["warnings"]) == (False, 0, 1)
    # The sample names the registry `make images` pushed to.
    assert finding(body, "bundled-images", "ok")["message"] == (
        "the Windows agents and the redirection-wait image come from spec.images.registry "
        "registry.example.com/ambient"
    )
    revisions = finding(body, "revisions", "info")
    assert (revisions["message"], revisions["items"]) == (
        "1 istiod revision(s)",
        [f"default: istiod {ISTIOD_TAG}-distroless, the agents, 0 waypoint(s)"],
    )
    assert finding(body, "version-skew", "warning")["message"].endswith(
        "the newest patch of 1.31 this operator knows is 1.31.1: run the agents at istiod's "
        "minor, newest patch (docs/versions.md)"
    )
    image = f"registry.istio.io/testing/pilot:{ISTIOD_TAG}-distroless"
    assert finding(body, "istiod", "ok")["message"] == (
        f"istiod istio-system/istiod {ISTIOD_TAG}-distroless ({image})"
    )
    # istiod's chart names its cluster Kubernetes when global.multiCluster.clusterName is unset.
    assert finding(body, "multi-cluster", "ok")["message"] == (
        "istiod and the agents are in cluster Kubernetes"
    )
    assert finding(body, "node-trust", "ok")["message"] == (
        "istiod's CA_TRUSTED_NODE_ACCOUNTS lists every ztunnel account: "
        "istio-system/ztunnel,istio-system/ztunnel-windows"
    )
    assert finding(body, "nodes", "ok")["message"] == "2 node(s) can run the agents"
    assert finding(body, "namespace-labels", "ok")["message"] == (
        "2 namespace(s) enrolled, labels valid"
    )
    webhook = finding(body, "webhook", "ok")["message"]
    assert webhook.startswith(f"configured; the API server calls https://127.0.0.1:{healthy}/")
    assert webhook.endswith(" (not probed from here)")
    done = precheck(pc_cluster)
    assert done.returncode == 0
    assert done.stdout.endswith("nothing blocks ambient: 0 blocking, 1 warning(s)\n")
