"""Istio's Linux agents, run by the operator's own image, on the real node.

The dev cluster's real Linux node (hack/devcluster's RealNode) gets the
images `make images` built: the operator, ztunnel and install-cni, and the
sample app. The operator is installed as a user installs it, by `helm
install` of our chart, and runs as a pod on that node under the chart's RBAC
and its own service account's token, through the `kubernetes` Service.
istiod is pilot-discovery from the pinned module, on the host, behind its
own chart's Service. The judges are Istio's programs: istio-cni's CNI
configuration and pod annotations, istiod's /debug/connections, `istioctl
ztunnel-config`, and ztunnel's own metrics.

A machine that cannot run the node fails these tests with the reason.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import ClusterError, LocalCluster, realmesh
from ambient_devcluster.realmesh import (
    RealMesh,
    agent_pod,
    get_server,
    ready,
    real_mesh,
    remove_agents,
    serve,
    ztunnel_count,
)
from ambient_devcluster.realnode import CNI_CONFLIST, RealNode
from chart_helpers import CHART, helm, set_args
from conftest import BIN_DIR, REPO_ROOT, own_node_cluster, unique_name, wait_for

NODE = "ambient-real-linux"
ISTIO_NS = "istio-system"
# Where the node's containerd holds the pipeline's images (hack/images),
# literally: the chart's value registry and the AmbientMesh's hub name them so.
REGISTRY = "localhost/ambient-devcluster"
IMAGES = {
    "ambient-operator": f"{REGISTRY}/ambient-operator:0.1.0",
    "ztunnel": f"{REGISTRY}/ztunnel:1.31.0",
    "install-cni": f"{REGISTRY}/install-cni:1.31.0",
    "sample-app": f"{REGISTRY}/sample-app:0.1.0",
}
LAYOUTS = REPO_ROOT / ".cache" / "images"
# The user the operator image declares (hack/images, tests/test_images.py).
OPERATOR_UID = "65532"
RELEASE = "ao"
OPERATOR_NS = "ambient-operator"
OPERATOR_DEPLOYMENT = f"{RELEASE}-ambient-operator"
REDIRECTION = "ambient.istio.io/redirection"
DATAPLANE_MODE = "istio.io/dataplane-mode"

Mesh = RealMesh


# ------------------------------------------------------------------ helpers


def _ready_agent(core: client.CoreV1Api, name: str) -> client.V1Pod | None:
    return ready(agent_pod(core, name))


def _ready_pod(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    return ready(core.read_namespaced_pod(name, namespace))


def _istioctl(cluster: LocalCluster, *args: str) -> str:
    done = subprocess.run(
        [str(BIN_DIR / "istioctl"), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"istioctl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _namespace(core: client.CoreV1Api, enrolled: bool) -> str:
    name = unique_name("mesh" if enrolled else "plain")
    labels = {DATAPLANE_MODE: "ambient"} if enrolled else {}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "default SA")
    return name


def _server(core: client.CoreV1Api, namespace: str) -> client.V1Pod:
    pod: client.V1Pod = serve(core, namespace, IMAGES["sample-app"])
    return pod


def _client(core: client.CoreV1Api, namespace: str, name: str, count: int = 3) -> list[str]:
    """Run a sample-app client pod that GETs the server's Service `count` times; its lines."""
    args = ["-count", str(count)]
    phase, _, log = get_server(core, namespace, name, IMAGES["sample-app"], args).partition("\n")
    assert phase == "Succeeded", log
    lines = log.strip().splitlines()
    assert len(lines) == count and all(x.startswith("server=server peer=") for x in lines), log
    return lines


def _redirection(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    annotations = core.read_namespaced_pod(name, namespace).metadata.annotations or {}
    value = annotations.get(REDIRECTION)
    return str(value) if value is not None else None


def _mtls_opened(ztunnel_ip: str, namespace: str, reporter: str) -> float:
    return ztunnel_count(
        ztunnel_ip,
        "istio_tcp_connections_opened_total",
        reporter=reporter,
        connection_security_policy="mutual_tls",
        destination_workload_namespace=namespace,
    )


def _opened(ztunnel_ip: str, namespace: str) -> float:
    """Every connection ztunnel counted to a namespace, whatever its policy or reporter."""
    return ztunnel_count(
        ztunnel_ip, "istio_tcp_connections_opened_total", destination_workload_namespace=namespace
    )


# ------------------------------------------------------------------ the mesh


@pytest.fixture(scope="module")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, RealNode]]:
    with own_node_cluster(
        tmp_path_factory, "realmesh", "pilot-discovery", "helm", "istioctl"
    ) as pair:
        yield pair


@pytest.fixture(scope="module")
def mesh(
    node_cluster: tuple[LocalCluster, RealNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    cluster, node = node_cluster
    with contextlib.ExitStack() as stack:
        try:
            m = stack.enter_context(
                real_mesh(cluster, node, tmp_path_factory.mktemp("realmesh"), BIN_DIR, LAYOUTS)
            )
        except ClusterError as exc:
            pytest.fail(str(exc))
        assert m.images == IMAGES
        yield m
    assert "panic:" not in m.istiod.log_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def agents(mesh: Mesh) -> tuple[client.V1Pod, client.V1Pod]:
    """istio-cni's and ztunnel's Ready pods on the real node."""
    return realmesh.agents(mesh.core)


# ------------------------------------------------------------------ 1. installed by Helm


def test_the_operator_runs_from_its_image_as_a_pod_under_the_charts_account(
    mesh: Mesh,
) -> None:
    core = mesh.core
    pods = core.list_namespaced_pod(
        OPERATOR_NS, label_selector=f"app.kubernetes.io/instance={RELEASE}"
    ).items
    assert len(pods) == 1
    pod = wait_for(lambda: _ready_pod(core, OPERATOR_NS, pods[0].metadata.name), 120, "Ready")
    assert pod.spec.node_name == NODE
    assert pod.spec.service_account_name == OPERATOR_DEPLOYMENT
    (status,) = pod.status.container_statuses
    assert status.image == IMAGES["ambient-operator"]
    # The process in the container, seen from the machine, runs as the image's user.
    container_id = status.container_id.removeprefix("containerd://")
    (pid,) = mesh.node.container_pids(container_id)
    uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
    assert uids == [OPERATOR_UID] * 4
    assert "ambient-operator" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    # It reached the API server with its own token: it holds the Lease the
    # chart's Role lets it write, under its pod's name.
    lease = client.CoordinationV1Api(mesh.api).read_namespaced_lease(
        "ambient-operator", OPERATOR_NS
    )
    assert lease.spec.holder_identity == pod.metadata.name


def test_its_ambientmesh_reconciles_to_the_built_linux_agents(mesh: Mesh) -> None:
    apps = client.AppsV1Api(mesh.api)

    def images() -> dict[str, str] | None:
        found = {}
        for name in ("ztunnel", "istio-cni-node"):
            ds = apps.read_namespaced_daemon_set(name, ISTIO_NS)
            found[name] = ds.spec.template.spec.containers[0].image
        return found

    assert wait_for(images, 120, "the Linux DaemonSets") == {
        "ztunnel": IMAGES["ztunnel"],
        "istio-cni-node": IMAGES["install-cni"],
    }
    ds = apps.read_namespaced_daemon_set("ztunnel", ISTIO_NS)
    managers = {f.manager for f in ds.metadata.managed_fields or []}
    assert "ambient-operator" in managers


# ------------------------------------------------------------------ 2. the agents


def test_istio_cni_is_ready_and_chained_into_the_nodes_cni_config(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    conflist = json.loads((mesh.node.cni_conf_dir / CNI_CONFLIST).read_text())
    plugins = [p["type"] for p in conflist["plugins"]]
    assert plugins == ["bridge", "portmap", "istio-cni"]
    istio = conflist["plugins"][2]
    assert istio["ambient_enabled"] is True
    assert (mesh.node.cni_plugin_dir / "istio-cni").is_file()


def test_ztunnel_is_ready_and_connected_to_istiod(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    _, ztunnel = agents
    connections = wait_for(
        lambda: [
            c["connectionId"]
            for c in mesh.istiod.debug("/debug/connections")["clients"]
            if c["connectionId"].startswith(f"{ztunnel.metadata.name}.{ISTIO_NS}-")
        ],
        60,
        "ztunnel in istiod's /debug/connections",
    )
    assert len(connections) == 1
    # istioctl asks ztunnel itself (its admin port, through a port-forward)
    # which of the node's workloads it knows.
    pod = f"{ztunnel.metadata.name}.{ISTIO_NS}"
    out = _istioctl(mesh.cluster, "ztunnel-config", "workloads", pod, "-o", "json")
    on_node = {
        (w["namespace"], w["workloadName"]) for w in json.loads(out) if w.get("node") == NODE
    }
    assert {
        (OPERATOR_NS, OPERATOR_DEPLOYMENT),
        (ISTIO_NS, "ztunnel"),
        (ISTIO_NS, "istio-cni-node"),
    } <= on_node


# ------------------------------------------------------------------ 3. pairs


@pytest.fixture(scope="module")
def enrolled(mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]) -> str:
    """An enrolled namespace with its server Running and redirected."""
    core = mesh.core
    ns = _namespace(core, enrolled=True)
    _server(core, ns)
    return ns


def test_the_enrolled_pair_talks_mutual_tls_through_ztunnel(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod], enrolled: str
) -> None:
    core = mesh.core
    ztunnel_ip = agents[1].status.pod_ip
    assert wait_for(lambda: _redirection(core, enrolled, "server"), 60, "server redirected") == (
        "enabled"
    )
    # A new namespace: nothing counted before its first client.
    assert _opened(ztunnel_ip, enrolled) == 0
    # (A client that has exited is out of the mesh again: its redirection is
    # read off ztunnel's count, reporter="source".)
    _client(core, enrolled, "client")
    # Both ends are on this node: one ztunnel counts each connection as the
    # client's (source) and as the server's (destination), three each.
    assert _mtls_opened(ztunnel_ip, enrolled, "source") == 3
    assert _mtls_opened(ztunnel_ip, enrolled, "destination") == 3
    # The workloads' certificate came from istiod's CA, for ztunnel's token
    # (audience istio-ca) that istiod checked with a TokenReview.
    pod = f"{agents[1].metadata.name}.{ISTIO_NS}"
    out = _istioctl(mesh.cluster, "ztunnel-config", "certificates", pod, "-o", "json")
    certs = json.loads(out)
    identity = f"spiffe://cluster.local/ns/{enrolled}/sa/default"
    assert (identity, "Available") in {(c["identity"], c["state"]) for c in certs}


def test_the_plain_pair_talks_past_ztunnel(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    core = mesh.core
    ztunnel_ip = agents[1].status.pod_ip
    ns = _namespace(core, enrolled=False)
    _server(core, ns)
    _client(core, ns, "client")
    assert _redirection(core, ns, "server") is None
    assert _opened(ztunnel_ip, ns) == 0


def test_leaving_releases_the_pods_and_new_connections_are_plain(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod], enrolled: str
) -> None:
    core = mesh.core
    ztunnel_ip = agents[1].status.pod_ip
    wait_for(lambda: _redirection(core, enrolled, "server") == "enabled", 60, "redirected")
    before = _opened(ztunnel_ip, enrolled)
    assert before > 0
    core.patch_namespace(enrolled, {"metadata": {"labels": {DATAPLANE_MODE: None}}})
    wait_for(
        lambda: _redirection(core, enrolled, "server") is None,
        60,
        "istio-cni to release the server (annotation removed)",
    )
    _client(core, enrolled, "after")
    assert _opened(ztunnel_ip, enrolled) == before


# ------------------------------------------------------------------ 4. agents change

# A client that holds one connection open and asks over it every half second
# (HTTP keep-alive), printing "ok <n>" per answer and "broken ..." when the
# connection ends. The operator image serves as its Python.
HOLDER = """
import socket, sys, time
host = sys.argv[1]
s = socket.create_connection((host, 80), timeout=5)
f = s.makefile("rb")
n = 0
while True:
    try:
        s.sendall(f"GET / HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode())
        status = f.readline()
        length = 0
        while (line := f.readline()) not in (b"\\r\\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if not status.startswith(b"HTTP/1.1 200") or not f.read(length):
            raise OSError(f"answer {status!r}")
        n += 1
        print(f"ok {n}", flush=True)
    except OSError as exc:
        print(f"broken after {n}: {exc}", flush=True)
        sys.exit(1)
    time.sleep(0.5)
"""


def _oks(core: client.CoreV1Api, namespace: str) -> int:
    return sum(1 for x in core.read_namespaced_pod_log("holder", namespace).split() if x == "ok")


def _rust_log(pod: client.V1Pod) -> str:
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    return str(env["RUST_LOG"])


def test_a_log_level_change_rolls_ztunnel_and_a_held_connection_lasts_its_drain(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    """Last in the module: it replaces the ztunnel the tests above read."""
    core = mesh.core
    old = agents[1]
    assert _rust_log(old) == "info"
    ns = _namespace(core, enrolled=True)
    _server(core, ns)
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "holder"},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "holder",
                        "image": IMAGES["ambient-operator"],
                        "imagePullPolicy": "Never",
                        "command": ["python3", "-c", HOLDER, f"server.{ns}.svc.cluster.local"],
                    }
                ],
            },
        },
    )
    wait_for(lambda: _oks(core, ns) >= 3, 60, "the holder answered over its connection")
    # Its one connection goes through the old ztunnel, with mutual TLS.
    assert _mtls_opened(old.status.pod_ip, ns, "source") == 1

    client.CustomObjectsApi(mesh.api).patch_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default",
        {"spec": {"ztunnel": {"logLevel": "debug"}}},
    )  # fmt: skip

    def rolled() -> client.V1Pod | None:
        pod = _ready_agent(core, "ztunnel")
        return pod if pod is not None and pod.metadata.name != old.metadata.name else None

    # maxSurge 1: the new ztunnel is Ready beside the old one, which then drains.
    new = wait_for(rolled, 180, "a new ztunnel Ready on the node")
    assert _rust_log(new) == "debug"
    answered_at_roll = _oks(core, ns)

    def old_gone() -> bool:
        try:
            core.read_namespaced_pod(old.metadata.name, ISTIO_NS)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(old_gone, 120, "the old ztunnel gone")
    # The held connection was the old ztunnel's: it kept answering while that
    # one drained, and ended when it exited (Linux ztunnel hands its listeners
    # over to the new one, not its connections).
    log = wait_for(
        lambda: (
            core.read_namespaced_pod("holder", ns).status.phase in ("Failed", "Succeeded")
            and core.read_namespaced_pod_log("holder", ns)
        ),
        60,
        "the held connection ended",
    )
    assert log.strip().splitlines()[-1].startswith("broken after "), log
    assert _oks(core, ns) > answered_at_roll
    # New connections go through the new ztunnel, with mutual TLS.
    _client(core, ns, "after")
    assert _mtls_opened(new.status.pod_ip, ns, "source") == 3
    assert _mtls_opened(new.status.pod_ip, ns, "destination") == 3


READINESS_TAINT = {"key": "cni.istio.io/not-ready", "effect": "NoSchedule"}


def _tainted(core: client.CoreV1Api) -> bool:
    taints = core.read_node(NODE).spec.taints or []
    return any(t.key == READINESS_TAINT["key"] and t.effect == "NoSchedule" for t in taints)


def _readiness_status(mesh: Mesh) -> dict[str, Any]:
    obj = client.CustomObjectsApi(mesh.api).get_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default"
    )
    status: dict[str, Any] = (obj.get("status") or {}).get("nodeReadiness") or {}
    return status


def test_the_readiness_taint_leaves_the_node_only_once_both_agents_are_ready(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    core = mesh.core
    custom = client.CustomObjectsApi(mesh.api)
    # istio-cni cannot start: its image is one the node does not have.
    absent = f"{REGISTRY}/install-cni:1.31.0-absent"
    custom.patch_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default",
        {"spec": {"images": {"istioCni": {"linux": absent}}}},
    )  # fmt: skip
    wait_for(
        lambda: (
            (p := agent_pod(core, "istio-cni")) is not None and p.spec.containers[0].image == absent
        ),
        120,
        "istio-cni on the node with the absent image",
    )
    assert _ready_agent(core, "istio-cni") is None
    assert _ready_agent(core, "ztunnel") is not None
    # The node's provisioning would add the taint; the chart grants the Node
    # patch only with nodeReadiness.enabled, and the spec turns it on.
    core.patch_node(NODE, {"spec": {"taints": [READINESS_TAINT]}})
    kube = ["--kubeconfig", str(mesh.cluster.kubeconfig), "--namespace", OPERATOR_NS]
    done = helm(
        "upgrade", RELEASE, str(CHART), *kube, "--reuse-values",
        *set_args({"nodeReadiness.enabled": True}), "--wait", "--timeout", "3m",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    custom.patch_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default",
        {"spec": {"nodeReadiness": {"enabled": True}}},
    )  # fmt: skip
    # The operator judged the node (its status names it waiting): the taint stays.
    waiting = wait_for(
        lambda: (s := _readiness_status(mesh)).get("waiting") and s,
        120,
        "the node counted as waiting",
    )
    assert (waiting["taint"], waiting["waiting"], waiting.get("exampleWaitingNodes")) == (
        "cni.istio.io/not-ready:NoSchedule",
        1,
        [NODE],
    )
    assert _tainted(core)
    # istio-cni's own image back: once it is Ready beside ztunnel, the taint goes.
    custom.patch_cluster_custom_object(
        "ambientoperator.io", "v1alpha1", "ambientmeshes", "default",
        {"spec": {"images": {"istioCni": {"linux": None}}}},
    )  # fmt: skip
    wait_for(lambda: not _tainted(core), 180, "the taint removed")
    assert _ready_agent(core, "istio-cni") is not None
    assert _ready_agent(core, "ztunnel") is not None
    done_waiting = wait_for(
        lambda: (s := _readiness_status(mesh)).get("waiting") == 0 and s, 60, "none waiting"
    )
    assert done_waiting.get("exampleWaitingNodes", []) == []


# ------------------------------------------------------------------ 5. removal


def test_deleting_the_ambientmesh_takes_istio_cni_out_of_the_nodes_cni_config(
    mesh: Mesh, agents: tuple[client.V1Pod, client.V1Pod]
) -> None:
    """Last: the agents go (deletionPolicy Delete), and istio-cni, seeing its
    DaemonSet gone rather than changed, undoes its install as on an uninstall."""
    conflist = mesh.node.cni_conf_dir / CNI_CONFLIST
    assert "istio-cni" in [p["type"] for p in json.loads(conflist.read_text())["plugins"]]
    remove_agents(mesh.core)
    assert (
        mesh.core.list_namespaced_pod(ISTIO_NS, field_selector=f"spec.nodeName={NODE}").items == []
    )
    assert [p["type"] for p in json.loads(conflist.read_text())["plugins"]] == ["bridge", "portmap"]
