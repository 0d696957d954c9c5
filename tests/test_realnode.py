"""The real Linux node of the dev cluster (hack/devcluster's RealNode).

containerd, runc, the CNI plugins, the kubelet, kube-proxy and CoreDNS run on
this machine beside kwok's simulated nodes; a pod of the pipeline's pause
image runs for real. The first test drives `up --real-node` and `down` as
`make cluster-up` and `make cluster-down` do, and compares the machine before
and after, read with the machine's own tools (ip, iptables-save, nft,
mountinfo, the cgroup file system, /proc); the rest share one cluster with a
node. A machine that cannot run the node fails these tests with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import LocalCluster, api_client_for
from ambient_devcluster.realnode import LOCK_FILE, RealNode
from conftest import BIN_DIR, REPO_ROOT, own_node_cluster, unique_name, wait_for

# What the node is documented to make (hack/devcluster/ambient_devcluster/realnode.py).
NODE = "ambient-real-linux"
BRIDGE = "ambnode0"
CGROUP_PARENT = "ambient-node"
NODE_IP = "10.244.240.1"
POD_PREFIX = "10.244.240."
# The pipeline's pause image (hack/images, tag 3.10-ambient), imported under our name.
PAUSE = "localhost/ambient-devcluster/pause:3.10-ambient"
RUN_DIR = "/run/ambient-devcluster-node"
# Created by containerd (the shims' sockets) and the kubelet (device plugins' socket,
# log links) at fixed paths when missing.
FIXED_PATHS = ("/run/containerd", "/var/lib/kubelet", "/var/log/containers")
NODE_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "kubelet", "kube-proxy", "coredns")
KUBERNETES_SERVICE_IP = "10.96.0.1"


# ------------------------------------------------------------------ the machine


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def _links() -> set[str]:
    return {
        line.split(":")[1].strip().split("@")[0] for line in _sh("ip", "-o", "link").splitlines()
    }


def _iptables() -> str:
    # Comments carry the time of the dump, counters change on their own.
    lines = _sh("iptables-save").splitlines() + _sh("ip6tables-save").splitlines()
    return "\n".join(re.sub(r"\[\d+:\d+\]", "", x) for x in lines if not x.startswith("#"))


def _nft() -> str:
    return _sh("nft", "list", "ruleset")


def _mounts() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _cgroup_dirs() -> set[str]:
    found = set()
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / CGROUP_PARENT
        if top.is_dir():
            found |= {d for d, _, _ in os.walk(top)}
    return found


def _node_processes(marker: str) -> set[str]:
    """'pid exe' of live processes of the node's programs, or mentioning `marker`."""
    exes = {str((BIN_DIR / p).resolve()) for p in NODE_PROGRAMS}
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (exe in exes or marker in cmdline):
            found.add(f"{entry.name} {exe}")
    return found


# Set by the kubelet as it starts (it refuses to start with protectKernelDefaults
# instead), and forwarding by the bridge plugin.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def _sysctls() -> dict[str, str]:
    names = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward")
    return {n: (Path("/proc/sys") / n).read_text().strip() for n in names}


def _snapshot(marker: str) -> dict[str, Any]:
    return {
        "sysctls": _sysctls(),
        "links": _links(),
        "iptables": _iptables(),
        "nft": _nft(),
        "mounts": _mounts(),
        "cgroups": _cgroup_dirs(),
        "processes": _node_processes(marker),
    }


@contextlib.contextmanager
def _no_node_running() -> Iterator[None]:
    """Hold the machine's node lock: no real node (another worker's) runs meanwhile."""
    with LOCK_FILE.open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ------------------------------------------------------------------ pods


def _pause_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "pause", "image": PAUSE, "imagePullPolicy": "Never"}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def _running(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" and pod.status.pod_ip else None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambient_devcluster", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
        cwd=REPO_ROOT,
    )


# ------------------------------------------------------------------ down is clean


@pytest.mark.parametrize("daemon_killed", [False, True], ids=["stopped", "daemon-killed"])
def test_cluster_down_leaves_nothing_behind(tmp_path: Path, daemon_killed: bool) -> None:
    """`down` after a running pod; or after the daemon that owned the node was
    SIGKILLed, so that nothing of the node could stop by itself."""
    state_dir = tmp_path / "state"
    node_dir = state_dir / "cluster" / "node"
    with _no_node_running():
        before = _snapshot(str(state_dir))
        fixed_before = {f for f in FIXED_PATHS if Path(f).exists()}
    up = _cli("up", "--state-dir", str(state_dir), "--real-node", "--no-crds", "--bin-dir",
              str(BIN_DIR))  # fmt: skip
    try:
        assert up.returncode == 0, f"up failed (the real node cannot run here?):\n{up.stderr}"
        kubeconfig = up.stdout.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
        with api_client_for(kubeconfig) as api:
            core = client.CoreV1Api(api)
            wait_for(
                lambda: core.read_namespaced_service_account("default", "default"),
                60,
                "ServiceAccount default/default",
            )
            core.create_namespaced_pod("default", _pause_pod("pause"))
            pod = wait_for(lambda: _running(core, "default", "pause"), 120, "pause Running")
            assert pod.status.pod_ip.startswith(POD_PREFIX)
        during = _snapshot(str(state_dir))
        # The snapshots see what the node made, so their equality below means something.
        assert BRIDGE in during["links"]
        assert any(name.startswith("veth") for name in during["links"] - before["links"])
        assert "table ip kube-proxy" in during["nft"]
        assert any(m.startswith(str(node_dir)) for m in during["mounts"])
        assert any(m.startswith(f"{RUN_DIR}/kubelet/pods/") for m in during["mounts"])
        assert f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/kubelet" in during["cgroups"]
        assert len(during["processes"] - before["processes"]) >= 6
        # The machine's kernel settings are back once the node is up.
        assert {n: during["sysctls"][n] for n in KUBELET_SYSCTLS} == {
            n: before["sysctls"][n] for n in KUBELET_SYSCTLS
        }
        if daemon_killed:
            os.kill(int((state_dir / "daemon.pid").read_text()), signal.SIGKILL)
    finally:
        down = _cli("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    with _no_node_running():
        after = _snapshot(str(state_dir))
    assert BRIDGE not in after["links"]
    assert not [x for x in after["links"] - before["links"] if x.startswith("veth")]
    assert "kube-proxy" not in after["nft"] and "cni_hostport" not in after["nft"]
    assert "KUBE-" not in after["iptables"] and "CNI-" not in after["iptables"]
    assert not [m for m in after["mounts"] if m.startswith((str(node_dir), RUN_DIR))]
    assert after["cgroups"] == set()
    assert after["processes"] == set()
    assert not node_dir.exists() and not Path(RUN_DIR).exists()
    assert {f for f in FIXED_PATHS if Path(f).exists()} == fixed_before
    assert after["links"] == before["links"]
    assert after["iptables"] == before["iptables"]
    assert after["nft"] == before["nft"]
    assert after["mounts"] == before["mounts"]
    assert after["sysctls"] == before["sysctls"]


# ------------------------------------------------------------------ a running node


@pytest.fixture(scope="module")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, RealNode]]:
    with own_node_cluster(tmp_path_factory, "realnode") as pair:
        yield pair


@pytest.fixture(scope="module")
def api(node_cluster: tuple[LocalCluster, RealNode]) -> Iterator[client.ApiClient]:
    with node_cluster[0].api_client() as api_client:
        yield api_client


def test_node_registers_as_linux_beside_kwok(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    node = core.read_node(NODE)
    assert node.metadata.labels["kubernetes.io/os"] == "linux"
    assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == NODE_IP
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    assert node.status.node_info.container_runtime_version == "containerd://2.4.2"
    assert node.status.node_info.kubelet_version == "v1.37.2"
    names = {n.metadata.name for n in core.list_node().items}
    assert {"linux-amd64-1", "win2022-1", NODE} <= names


def test_a_pod_runs_for_real_and_its_service_answers(
    api: client.ApiClient, node_cluster: tuple[LocalCluster, RealNode]
) -> None:
    core = client.CoreV1Api(api)
    ns = unique_name("realpod")
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, "default SA")
    core.create_namespaced_pod(ns, _pause_pod("pause"))
    pod = wait_for(lambda: _running(core, ns, "pause"), 120, "pause Running")
    assert pod.status.pod_ip.startswith(POD_PREFIX)
    sandboxes = json.loads(node_cluster[1].crictl("pods", "-o", "json"))["items"]
    assert [s["metadata"]["name"] for s in sandboxes if s["metadata"]["namespace"] == ns] == [
        "pause"
    ]
    svc = core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "pause"},
            "spec": {"selector": {"app": "pause"}, "ports": [{"port": 80}]},
        },
    )

    # Nothing listens in the pause pod: its kernel refuses the connection, which
    # only a packet that kube-proxy sent into the pod's network namespace can get.
    def refused() -> bool:
        with socket.socket() as s:
            s.settimeout(2)
            try:
                s.connect((svc.spec.cluster_ip, 80))
            except ConnectionRefusedError:
                return True
        return False

    assert wait_for(refused, 60, f"connection to {svc.spec.cluster_ip}:80 refused by the pod")


def _dns_query(server: str, name: str) -> list[str]:
    """The A records of `name` from a DNS server (one UDP query)."""
    qid = 0x4242
    header = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(header + qname + struct.pack(">HH", 1, 1), (server, 53))
        data = s.recv(4096)
    rid, flags, _, ancount, _, _ = struct.unpack(">HHHHHH", data[:12])
    assert rid == qid and flags & 0x000F == 0, f"DNS answer code {flags & 0xF}"
    pos = 12 + len(qname) + 4
    found = []
    for _ in range(ancount):
        pos += 2 if data[pos] & 0xC0 == 0xC0 else len(data[pos:].split(b"\0", 1)[0]) + 1
        rtype, _, _, rdlen = struct.unpack(">HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1:
            found.append(socket.inet_ntoa(data[pos : pos + rdlen]))
        pos += rdlen
    return found


def test_cluster_dns_answers_through_the_kube_dns_service(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    dns_ip = core.read_namespaced_service("kube-dns", "kube-system").spec.cluster_ip
    answers = wait_for(
        lambda: _dns_query(dns_ip, "kubernetes.default.svc.cluster.local"),
        60,
        "CoreDNS answering through the kube-dns Service",
    )
    assert answers == [KUBERNETES_SERVICE_IP]


def test_pods_reach_the_api_server_through_the_kubernetes_service(
    node_cluster: tuple[LocalCluster, RealNode],
) -> None:
    # The path a pod's in-cluster client takes: the `kubernetes` Service's
    # ClusterIP, which kube-proxy sends to the node's forwarder to the API server.
    cluster = node_cluster[0]
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    pki = cluster.pki_dir
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def ready() -> str:
        url = f"https://{KUBERNETES_SERVICE_IP}:443/readyz"
        with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
            return str(resp.read().decode())

    assert wait_for(ready, 60, "/readyz through the kubernetes Service") == "ok"


SAMPLE_APP_LAYOUT = REPO_ROOT / ".cache" / "images" / "sample-app"
# The pipeline's sample app (hack/images, tag 0.1.0), imported under our name.
SAMPLE_APP = "localhost/ambient-devcluster/sample-app:0.1.0"


def test_a_pod_reaches_another_by_service_name(
    api: client.ApiClient, node_cluster: tuple[LocalCluster, RealNode]
) -> None:
    """Cluster DNS (CoreDNS), the Service (kube-proxy) and the pod network (CNI), from a pod."""
    if not (SAMPLE_APP_LAYOUT / "index.json").is_file():
        pytest.fail(f"no sample-app image at {SAMPLE_APP_LAYOUT}: run `make images`")
    repository = SAMPLE_APP.rsplit(":", maxsplit=1)[0]
    assert node_cluster[1].import_layout(SAMPLE_APP_LAYOUT, repository) == SAMPLE_APP
    core = client.CoreV1Api(api)
    ns = unique_name("realpair")
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, "default SA")
    app = {"name": "app", "image": SAMPLE_APP, "imagePullPolicy": "Never"}
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "server", "labels": {"app": "server"}},
            "spec": {"nodeName": NODE, "containers": [app]},
        },
    )
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "server"},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    wait_for(lambda: _running(core, ns, "server"), 120, "server Running")
    url = f"http://server.{ns}.svc.cluster.local/"
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "client"},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "Never",
                "containers": [{**app, "args": ["get", "-count", "3", url]}],
            },
        },
    )
    phase = wait_for(
        lambda: (
            core.read_namespaced_pod("client", ns).status.phase in ("Succeeded", "Failed")
            and core.read_namespaced_pod("client", ns).status.phase
        ),
        120,
        "client finished",
    )
    log = core.read_namespaced_pod_log("client", ns)
    assert phase == "Succeeded", log
    lines = log.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("server=server peer=") for line in lines), log
