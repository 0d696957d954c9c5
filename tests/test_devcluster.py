"""Acceptance tests for the local control plane (``ambient_devcluster``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import (
    BINARIES,
    KWOK_NODE_ANNOTATION,
    ClusterError,
    LocalCluster,
    api_client_for,
    create_nodes,
    delete_nodes,
    find_processes,
    parse_inventory,
    pid_alive,
    to_kwok_node,
)
from conftest import BIN_DIR, SAMPLE_NODES, binaries_present, unique_name, wait_for

pytestmark = pytest.mark.cluster

WINDOWS_NODES = {"win2022-1", "win2025-1", "win2019-1"}


def _sample() -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in parse_inventory(SAMPLE_NODES.read_text())}


# ------------------------------------------------------------ inventory


def test_sample_inventory_shape() -> None:
    nodes = _sample()
    assert set(nodes) == {"linux-amd64-1", "linux-amd64-2", "linux-arm64-1", *WINDOWS_NODES}
    standard = {
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "kubernetes.io/hostname",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
    for name, node in nodes.items():
        labels = node["metadata"]["labels"]
        info = node["status"]["nodeInfo"]
        assert standard <= set(labels), name
        assert labels["kubernetes.io/hostname"] == name
        assert info["operatingSystem"] == labels["kubernetes.io/os"]
        assert info["architecture"] == labels["kubernetes.io/arch"]
        assert info["kubeletVersion"].startswith("v")
    builds = {
        "win2022-1": ("10.0.20348", "10.0.20348.2762", "Windows Server 2022 Datacenter"),
        "win2025-1": ("10.0.26100", "10.0.26100.2314", "Windows Server 2025 Datacenter"),
        "win2019-1": ("10.0.17763", "10.0.17763.6414", "Windows Server 2019 Datacenter"),
    }
    for name, (build, kernel, image) in builds.items():
        node = nodes[name]
        assert node["metadata"]["labels"]["node.kubernetes.io/windows-build"] == build
        assert node["status"]["nodeInfo"]["kernelVersion"] == kernel
        assert node["status"]["nodeInfo"]["osImage"] == image
        assert {"key": "os", "value": "windows", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert nodes["linux-arm64-1"]["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"


def test_to_kwok_node_drops_server_fields_and_adds_defaults() -> None:
    source = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "n1",
            "uid": "x",
            "resourceVersion": "1",
            "creationTimestamp": "2020-01-01T00:00:00Z",
            "labels": {"a": "b"},
        },
        "spec": {
            "providerID": "azure://x",
            "taints": [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "t"},
                {"key": "dedicated", "value": "x", "effect": "NoSchedule"},
            ],
        },
        "status": {"conditions": [{"type": "Ready", "status": "False"}], "images": []},
    }
    body = to_kwok_node(source)
    assert body["metadata"] == {
        "name": "n1",
        "labels": {"a": "b", "kubernetes.io/hostname": "n1"},
        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
    }
    # providerID is kept: it tells the platform (AKS here) the inventory came from.
    assert body["spec"] == {
        "taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
        "providerID": "azure://x",
    }
    assert body["status"]["capacity"] == {
        "cpu": "32",
        "memory": "256Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
    }
    assert body["status"]["allocatable"] == body["status"]["capacity"]
    assert "conditions" not in body["status"]


# -------------------------------------------------------------- cluster


def test_components_are_healthy(cluster: LocalCluster) -> None:
    assert set(cluster.pids()) == set(BINARIES)
    for component in BINARIES:
        assert cluster.healthy(component), component
    assert cluster.server.startswith("https://127.0.0.1:")
    assert cluster.startup_seconds is not None


def test_nodes_keep_labels_taints_and_node_info(
    k8s: client.ApiClient, sample_nodes: list[str]
) -> None:
    core = client.CoreV1Api(k8s)
    expected = _sample()
    assert sorted(sample_nodes) == sorted(expected)

    def heartbeat_seen() -> bool:
        # The first heartbeat stage has run when lastHeartbeatTime moved past
        # the Ready transition: nodeInfo must have survived every kwok write.
        for name in expected:
            ready = next(c for c in core.read_node(name).status.conditions if c.type == "Ready")
            if ready.last_heartbeat_time <= ready.last_transition_time:
                return False
        return True

    wait_for(heartbeat_seen, timeout=60, message="a kwok heartbeat on every sample node")
    for name, source in expected.items():
        node = k8s.sanitize_for_serialization(core.read_node(name))
        labels = node["metadata"]["labels"]
        for key, value in source["metadata"]["labels"].items():
            assert labels.get(key) == value, (name, key)
        assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
        for taint in source["spec"].get("taints", []):
            assert taint in node["spec"].get("taints", []), (name, taint)
        for key, value in source["status"]["nodeInfo"].items():
            assert node["status"]["nodeInfo"].get(key, "") == value, (name, key)
        assert node["status"]["capacity"] == source["status"]["capacity"]
        assert node["status"]["allocatable"] == source["status"]["allocatable"]
        assert "uid" in node["metadata"] and node["metadata"]["uid"] != source["metadata"]["uid"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_windows_daemonset_runs_only_on_windows_nodes(
    k8s: client.ApiClient, sample_nodes: list[str], namespace: str
) -> None:
    apps = client.AppsV1Api(k8s)
    core = client.CoreV1Api(k8s)
    labels = {"app": "win-agent"}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "win-agent"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "windows"},
                    "tolerations": [
                        {
                            "key": "os",
                            "operator": "Equal",
                            "value": "windows",
                            "effect": "NoSchedule",
                        }
                    ],
                    "containers": [
                        {"name": "agent", "image": "mcr.microsoft.com/oss/kubernetes/pause:3.9"}
                    ],
                },
            },
        },
    }
    apps.create_namespaced_daemon_set(namespace, daemonset)

    def rolled_out() -> client.V1DaemonSetStatus | None:
        status = apps.read_namespaced_daemon_set_status("win-agent", namespace).status
        if status and status.number_ready == status.desired_number_scheduled == 3:
            return status
        return None

    status = wait_for(rolled_out, timeout=60, message="win-agent DaemonSet ready on 3 nodes")
    assert status.desired_number_scheduled == 3
    assert status.current_number_scheduled == 3
    assert status.number_misscheduled == 0

    pods = core.list_namespaced_pod(namespace, label_selector="app=win-agent").items
    assert len(pods) == 3
    assert {p.spec.node_name for p in pods} == WINDOWS_NODES
    for pod in pods:
        assert pod.status.phase == "Running", pod.metadata.name
        ready = [c for c in pod.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"
        # The default scheduler placed it (DaemonSet pods carry node affinity).
        assert pod.spec.affinity.node_affinity is not None
        assert pod.status.pod_ip


def test_extra_node_from_multi_document_yaml(k8s: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s)
    name_a, name_b = unique_name("extra-linux"), unique_name("extra-windows")
    inventory = textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Node
        metadata:
          name: {name_a}
          labels: {{kubernetes.io/os: linux, kubernetes.io/arch: amd64}}
        ---
        apiVersion: v1
        kind: Node
        metadata:
          name: {name_b}
          labels: {{kubernetes.io/os: windows, kubernetes.io/arch: amd64}}
        spec:
          taints: [{{key: os, value: windows, effect: NoSchedule}}]
        status:
          nodeInfo:
            operatingSystem: windows
            architecture: amd64
            kernelVersion: 10.0.20348.9999
            osImage: Windows Server 2022 Datacenter
            kubeletVersion: v1.34.0
        """
    )
    try:
        assert create_nodes(k8s, inventory) == [name_a, name_b]
        a, b = core.read_node(name_a), core.read_node(name_b)
        assert a.status.capacity["cpu"] == "32"
        assert a.status.capacity["memory"] == "256Gi"
        assert a.status.allocatable["pods"] == "110"
        assert a.status.node_info.operating_system == "linux"
        assert b.status.node_info.kernel_version == "10.0.20348.9999"
        assert b.status.node_info.os_image == "Windows Server 2022 Datacenter"
        assert [(t.key, t.value, t.effect) for t in b.spec.taints] == [
            ("os", "windows", "NoSchedule")
        ]
        # Idempotent: creating again updates in place.
        assert create_nodes(k8s, inventory) == [name_a, name_b]
    finally:
        delete_nodes(k8s, [name_a, name_b])
    names = {n.metadata.name for n in core.list_node().items}
    assert not names & {name_a, name_b}


def test_user_and_serviceaccount_identities(
    cluster: LocalCluster, k8s: client.ApiClient, namespace: str
) -> None:
    def whoami(kubeconfig: Path) -> tuple[str, list[str]]:
        with api_client_for(kubeconfig) as api:
            review = client.AuthenticationV1Api(api).create_self_subject_review(
                client.V1SelfSubjectReview()
            )
            info = review.status.user_info
            return info.username, info.groups or []

    user_cfg = cluster.user_kubeconfig("ambient-operator", ["ambient:operators"])
    username, groups = whoami(user_cfg)
    assert username == "ambient-operator"
    assert "ambient:operators" in groups
    with api_client_for(user_cfg) as api, pytest.raises(ApiException) as denied:
        client.CoreV1Api(api).list_node()
    assert denied.value.status == 403

    sa_cfg = cluster.serviceaccount_kubeconfig(namespace, "default")
    username, groups = whoami(sa_cfg)
    assert username == f"system:serviceaccount:{namespace}:default"
    assert "system:serviceaccounts" in groups


def test_restart_keeps_data(cluster: LocalCluster, k8s: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "survivor"}, "data": {"k": "v"}}
    )
    before = cluster.pids()
    # etcd crashes (SIGKILL), the API server is stopped gracefully.
    for component, graceful in (("etcd", False), ("kube-apiserver", True)):
        cluster.restart(component, graceful=graceful)
        assert cluster.pids()[component] != before[component]
    cm = wait_for(
        lambda: core.read_namespaced_config_map("survivor", namespace),
        timeout=30,
        message="API answers after restarts",
    )
    assert cm.data == {"k": "v"}
    for component in BINARIES:
        assert cluster.healthy(component), component


def test_start_failure_reports_log_tail_and_cleans_up(tmp_path: Path) -> None:
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in BINARIES:
        (bin_dir / name).symlink_to((BIN_DIR / name).resolve())
    broken = bin_dir / "kube-apiserver"
    broken.unlink()
    broken.write_text("#!/bin/sh\necho 'boom: unknown flag --frobnicate' >&2\nexit 3\n")
    broken.chmod(0o755)
    cluster = LocalCluster(tmp_path / "work", bin_dir=bin_dir, start_timeout=60)
    with pytest.raises(ClusterError) as failed:
        cluster.start()
    message = str(failed.value)
    assert "kube-apiserver exited with status 3" in message
    assert "boom: unknown flag --frobnicate" in message
    assert not cluster.pids()
    assert not find_processes(cmdline_contains=str(tmp_path / "work"))


# --------------------------------------------------- no process survives

_CHILD = textwrap.dedent(
    """\
    import json, signal, sys
    from pathlib import Path
    from ambient_devcluster import LocalCluster

    # Background jobs may inherit an ignored SIGINT; this test needs Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir = Path(sys.argv[1])
    with LocalCluster(workdir / "cluster", bin_dir=sys.argv[2]) as c:
        (workdir / "pids.json").write_text(json.dumps(c.pids()))
        while True:
            signal.pause()
    """
)


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["sigterm", "sigint", "sigkill"]
)
def test_no_component_survives_its_parent(tmp_path: Path, sig: signal.Signals) -> None:
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}")
    with (tmp_path / "child.log").open("wb") as log:
        parent = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path), str(BIN_DIR)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def pids() -> dict[str, int] | None:
            assert parent.poll() is None, (tmp_path / "child.log").read_text()
            path = tmp_path / "pids.json"
            return json.loads(path.read_text()) if path.exists() else None

        started = wait_for(pids, timeout=120, message="child cluster up")
        assert set(started) == set(BINARIES)
        assert all(pid_alive(p) for p in started.values())
        parent.send_signal(sig)
        parent.wait(timeout=60)
        wait_for(
            lambda: not any(pid_alive(p) for p in started.values()),
            timeout=30,
            message=f"components gone after {sig.name} to their parent",
        )
        assert not find_processes(cmdline_contains=str(tmp_path / "cluster"))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_cli_up_and_down(tmp_path: Path) -> None:
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}")
    state = tmp_path / "state"
    crd_dir = tmp_path / "crds"
    crd_dir.mkdir()
    plural = "widgets"
    (crd_dir / "widgets.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.example.com"},
                "spec": {
                    "group": "example.com",
                    "scope": "Namespaced",
                    "names": {"kind": "Widget", "plural": plural, "singular": "widget"},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {"openAPIV3Schema": {"type": "object"}},
                        }
                    ],
                },
            }
        )
    )
    env = {**os.environ, "AMBIENT_BIN_DIR": str(BIN_DIR)}
    cli = [sys.executable, "-m", "ambient_devcluster"]
    try:
        up = subprocess.run(
            [
                *cli,
                "up",
                "--state-dir",
                str(state),
                "--nodes",
                str(SAMPLE_NODES),
                "--crds",
                str(crd_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        assert up.returncode == 0, up.stderr
        last = up.stdout.strip().splitlines()[-1]
        assert last.startswith("export KUBECONFIG=")
        kubeconfig = Path(last.split("=", 1)[1])
        assert kubeconfig.is_absolute() and kubeconfig.exists()
        daemon_pid = int((state / "daemon.pid").read_text())
        assert pid_alive(daemon_pid)
        with api_client_for(kubeconfig) as api:
            nodes = {n.metadata.name for n in client.CoreV1Api(api).list_node().items}
            assert nodes >= WINDOWS_NODES
            crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(
                f"{plural}.example.com"
            )
            conditions = {c.type: c.status for c in crd.status.conditions}
            assert conditions.get("Established") == "True"
        components = [p.pid for p in find_processes(cmdline_contains=str(state / "cluster"))]
        assert len(components) >= len(BINARIES)
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert not pid_alive(daemon_pid)
    assert not any(pid_alive(p) for p in components)
    assert not (state / "daemon.pid").exists()


def test_a_closed_forwarder_gives_its_port_back() -> None:
    """The real node's forwarders (RealNode.expose) listen on fixed ports (the API
    server's 6443 on the node's address): once closed, the next node, in another
    process, must be able to bind the same port, even while this process lives on."""
    import socket

    from ambient_devcluster.realnode import TcpForwarder

    forwarder = TcpForwarder(("127.0.0.1", 0), ("127.0.0.1", 9))
    port = forwarder.address[1]
    tid = forwarder._acceptor.native_id
    # Barrier: the accept thread is blocked in accept4 (x86-64 syscall 288) or
    # accept (43), where a plain close() of its socket does not reach it.
    wait_for(
        lambda: Path(f"/proc/self/task/{tid}/syscall").read_text().split()[0] in ("288", "43"),
        10,
        "the forwarder's thread in accept()",
    )
    forwarder.close()
    again = socket.create_server(("127.0.0.1", port))
    again.close()
