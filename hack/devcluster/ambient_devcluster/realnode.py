"""One real Linux node beside kwok's simulated ones, as host processes.

:class:`RealNode` runs containerd (with runc under its shim), the CNI
reference plugins (bridge, host-local, loopback, portmap), the kubelet,
kube-proxy (nftables mode) and CoreDNS for a :class:`LocalCluster`, and
:meth:`RealNode.stop` takes back everything they made on the machine.

What it makes, all named here so that a stop (or the next start, after a
crash) can find it again:

- the cgroup directory ``/<CGROUP_PARENT>`` in every cgroup hierarchy: the
  kubelet's ``cgroupRoot``, its own ``kubeletCgroups`` and every pod's cgroup
  live there and nowhere else (``systemCgroups`` stays unset: the kubelet
  would move every process of the root cgroup into it, the machine's own);
- the bridge ``BRIDGE`` with the node's address ``NODE_IP``, the pods' veths on
  it, and routes of the whole pod and service ranges to it, so that a packet
  for a simulated pod's address or an unused ClusterIP stays on this machine;
- the nftables tables of kube-proxy and of the portmap plugin
  (``NFT_TABLES``); the bridge plugin masquerades nothing, and the kubelet
  makes no iptables chains (``makeIPTablesUtilChains: false``);
- mounts (the node's folder itself, bound shared; overlay root file systems,
  ``/dev/shm`` of sandboxes, network namespaces, the kubelet's volumes), all
  under the node's own folder;
- the host folders the agents' pods make (``AGENT_HOST_PATHS``: istio-cni's and
  ztunnel's sockets), when they did not exist before;
- the sysctls the kubelet and the bridge plugin set (``SAVED_SYSCTLS``),
  put back as they were.

Only one real node runs on a machine at a time (kube-proxy's table and the
bridge have fixed names): a start waits for the lock ``LOCK_FILE``, which its
process holds until the stop, and the kernel releases when it dies. The
state file ``STATE_FILE`` names the node folder and the sysctls as found, so
the next start can clean up after a process that died without stopping.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from . import pki
from .istio import cluster_dns_service
from .launcher import LOOPBACK, POD_CIDR, SERVICE_CIDR, LocalCluster, free_ports, repo_root
from .manifests import apply_objects
from .process import ManagedProcess, find_processes, pid_alive

NODE_NAME = "ambient-real-linux"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "ambient-node"
BRIDGE = "ambnode0"
# The node's own slice of the cluster's pod range, far from the addresses kwok
# hands out from the start of that range; its first address is the bridge's,
# and the node's: the kubelet refuses a loopback node address.
NODE_POD_CIDR = "10.244.240.0/24"
NODE_IP = "10.244.240.1"
NFT_TABLES = (
    ("ip", "kube-proxy"),
    ("ip6", "kube-proxy"),
    ("ip", "cni_hostport"),
    ("ip6", "cni_hostport"),
)
# The kubelet sets the first six (it refuses to start with
# protectKernelDefaults instead); the bridge plugin turns on forwarding.
SAVED_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
LOCK_FILE = Path("/run/ambient-devcluster-node.lock")
# containerd's sockets and the kubelet's root folder (its plugin sockets are
# made there): a unix socket's path must fit in 104 bytes, which a test's
# temporary folder does not leave room for.
RUN_DIR = Path("/run/ambient-devcluster-node")
STATE_FILE = Path("/run/ambient-devcluster-node.json")
# The kubelet links each container's log here (a fixed path, not configurable).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# Fixed paths outside the node's folder that its programs create when missing:
# the shims' sockets (containerd picks /run/containerd/s for root whatever its
# state dir), the kubelet's device plugin socket, its container log links.
# Those that did not exist at the start are removed at the stop.
# The Linux agents' hostPath folders (istio-cni's plugin event socket, the ZDS
# socket between istio-cni and ztunnel), fixed by Istio's programs.
AGENT_HOST_PATHS = (Path("/var/run/istio-cni"), Path("/var/run/ztunnel"))
FIXED_PATHS = (
    Path("/run/containerd"),
    Path("/var/lib/kubelet"),
    CONTAINER_LOG_LINKS,
    *AGENT_HOST_PATHS,
)
CLUSTER_DOMAIN = "cluster.local"
# The repository the pipeline's pause image is imported under; its tag is the
# layout's own (org.opencontainers.image.ref.name), and that is the sandbox image.
SANDBOX_REPOSITORY = "localhost/ambient-devcluster/pause"
REF_NAME = "org.opencontainers.image.ref.name"
NODE_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "crictl",
    "kubelet",
    "kube-proxy",
    "coredns",
)
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# The node's one network configuration (containerd reads the first file, by name).
CNI_CONFLIST = "10-ambient-node.conflist"
# The programs the kubelet, kube-proxy and the plugins run by name.
HOST_PROGRAMS = ("nft", "iptables", "ip", "mount", "umount", "unshare", "ipset")
# What istio-cni puts on the host for the kubelet's probes of enrolled pods
# (istio.io/istio cni/pkg/iptables, nodeagent): a nat chain that SNATs them,
# jumped to from POSTROUTING, and the address sets it matches. Its pod removes
# them when its DaemonSet is deleted; killed with the node, it leaves them.
AGENT_NAT_CHAIN = "ISTIO_POSTRT"
AGENT_IPSETS = ("istio-inpod-probes-v4", "istio-inpod-probes-v6")
IPTABLES_PROGRAMS = ("iptables-legacy", "ip6tables-legacy", "iptables-nft", "ip6tables-nft")
COREDNS_USER = "system:ambient-devcluster:coredns"
ENDPOINT_SLICE_MANAGER = "ambient-devcluster"
# Where pods reach the API server (the `kubernetes` Service's endpoint): the
# server listens on loopback only, and the node forwards this port to it.
APISERVER_NODE_PORT = 6443
# Order of the stop: the kubelet first (no new pods), the rest in reverse.
COMPONENTS = ("containerd", "coredns", "kube-proxy", "kubelet")


class RealNodeError(RuntimeError):
    """The real node cannot start on this machine, failed, or left something behind."""


def default_cni_bin_dir() -> Path:
    """The CNI plugins hack/build-binaries.sh links (``.cache/cni/bin``)."""
    return repo_root() / ".cache" / "cni" / "bin"


def default_pause_layout() -> Path:
    """The pause image's OCI layout that the image pipeline writes."""
    return repo_root() / ".cache" / "images" / "pause"


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 60) -> str:
    """Run a short host command; its stdout, or RealNodeError with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RealNodeError(
            f"{' '.join(argv)} exited with {proc.returncode}: {proc.stderr.strip()}"
        )
    return proc.stdout


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def read_sysctls() -> dict[str, str]:
    """The current values of ``SAVED_SYSCTLS``."""
    return {name: _sysctl_path(name).read_text().strip() for name in SAVED_SYSCTLS}


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy under /sys/fs/cgroup (v1 ones and cgroup2)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mount_point = Path(left.split()[4])
        if fstype in ("cgroup", "cgroup2") and mount_point.parent == CGROUP_ROOT:
            found.append(mount_point)
    return sorted(found)


def node_cgroup_dirs() -> list[Path]:
    """The node's cgroup directories that exist now, deepest first."""
    dirs: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / CGROUP_PARENT
        if top.is_dir():
            dirs += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or under ``folder`` (mountinfo's escaping undone), deepest first."""
    prefix = str(folder)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        point = raw.encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=len, reverse=True)


def links_on_bridge() -> list[str]:
    """Names of the links enslaved to ``BRIDGE`` (the pods' host-side veths)."""
    out = _run(["ip", "-j", "link", "show", "master", BRIDGE], check=False)
    try:
        return [link["ifname"] for link in json.loads(out or "[]")]
    except ValueError:
        return []


def link_exists(name: str) -> bool:
    """Whether a network link of that name exists."""
    return Path("/sys/class/net", name).exists()


def nft_tables_present() -> list[tuple[str, str]]:
    """Those of ``NFT_TABLES`` that exist now."""
    out = _run(["nft", "list", "tables"], check=False)
    present = {tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("table ")}
    return [t for t in NFT_TABLES if t in present]


class TcpForwarder:
    """Accepts TCP connections on the node's address and relays each to a loopback port.

    Pods reach host programs only at an address of the node, and those
    programs listen on loopback only (the API server, istiod).
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(listen)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept, name=f"forward-{listen}", daemon=True
        )
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    upstream.close()
                    return
                self._conns |= {conn, upstream}
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop accepting and cut every relayed connection."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, set()
        # close() alone leaves the socket listening while the accept thread is
        # blocked in accept(): the port stays taken for as long as this
        # process lives, and the next node (another test worker) cannot bind it.
        # shutdown() wakes that accept() first.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        # The kernel lets go of the port once that accept() has returned.
        self._acceptor.join(timeout=10)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@dataclass(frozen=True)
class NodePorts:
    """Loopback (and node address) ports of the node's components."""

    kubelet: int
    kubelet_healthz: int
    kube_proxy_healthz: int
    kube_proxy_metrics: int
    coredns_health: int
    coredns_ready: int
    coredns_metrics: int

    @classmethod
    def allocate(cls) -> NodePorts:
        """Currently free, distinct ports."""
        return cls(*free_ports(7))


class RealNode:
    """containerd, runc, CNI, the kubelet, kube-proxy and CoreDNS for one cluster.

    Use as a context manager inside the cluster's::

        with LocalCluster(workdir) as cluster, RealNode(cluster) as node:
            ...  # pods with nodeName=node.name run for real

    Its processes die with the calling process, like the cluster's; what they
    leave behind when that process is killed (containers, mounts, the bridge)
    is swept by the next start on this machine.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        name: str = NODE_NAME,
        bin_dir: Path | None = None,
        cni_bin_dir: Path | None = None,
        pause_layout: Path | None = None,
        start_timeout: float = 180.0,
        lock_timeout: float = 900.0,
        verbose: bool = True,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.bin_dir = bin_dir or cluster.bin_dir
        self.cni_bin_dir = cni_bin_dir or default_cni_bin_dir()
        self.pause_layout = pause_layout or default_pause_layout()
        self.start_timeout = start_timeout
        self.lock_timeout = lock_timeout
        self.verbose = verbose
        self.dir = cluster.workdir / "node"
        self.log_dir = cluster.log_dir
        self.containerd_socket = RUN_DIR / "containerd.sock"
        self.ports = NodePorts.allocate()
        self.dns_ip: str | None = None
        self.sandbox_image = ""
        self._lock: IO[str] | None = None
        self._procs: dict[str, ManagedProcess] = {}
        self._forwarders: list[TcpForwarder] = []
        self._started = False

    # ------------------------------------------------------------------ info

    @property
    def cni_conf_dir(self) -> Path:
        """The CNI configuration folder containerd reads (istio-cni chains its plugin there)."""
        return self.dir / "cni" / "net.d"

    @property
    def cni_plugin_dir(self) -> Path:
        """The CNI plugin folder containerd runs plugins from: the node's own copy of
        ``cni_bin_dir``, so that an agent installing its plugin (istio-cni) writes
        into the node's folder, not into the shared build cache."""
        return self.dir / "cni" / "bin"

    @property
    def netns_dir(self) -> Path:
        """Where containerd keeps the pods' network namespaces (under its state folder)."""
        return self.dir / "containerd" / "state" / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def runtime_endpoint(self) -> str:
        """The CRI endpoint of the node's containerd."""
        return f"unix://{self.containerd_socket}"

    def binary(self, name: str) -> Path:
        """Path of one of the node's programs."""
        return self.bin_dir / name

    def log_file(self, component: str) -> Path:
        """Log file of a component (beside the control plane's)."""
        return self.log_dir / f"node-{component}.log"

    def exited_components(self) -> dict[str, int]:
        """Components that were started and have exited since, with exit status."""
        codes = {name: p.returncode() for name, p in self._procs.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def crictl(self, *args: str, timeout: float = 60) -> str:
        """Run crictl against the node's containerd; its stdout."""
        return _run(
            [str(self.binary("crictl")), "--runtime-endpoint", self.runtime_endpoint,
             "--image-endpoint", self.runtime_endpoint, "--timeout", "20s", *args],
            timeout=timeout,
        )  # fmt: skip

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """Run ctr in containerd's ``k8s.io`` namespace (the CRI's); its stdout."""
        return _run(
            [str(self.binary("ctr")), "--address", str(self.containerd_socket),
             "--namespace", "k8s.io", *args],
            timeout=timeout,
        )  # fmt: skip

    def container_pids(self, container_id: str) -> list[int]:
        """The machine's pids of a container's processes (found by its cgroup,
        named after its id): the CRI reports pids of containerd's own pid namespace."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if f"/{CGROUP_PARENT}/" in (text := (entry / "cgroup").read_text()) and (
                    f"/{container_id}\n" in text
                ):
                    found.append(int(entry.name))
        return sorted(found)

    def expose(self, loopback_port: int, node_port: int = 0) -> tuple[str, int]:
        """Make a host program that listens on loopback reachable from pods, at
        the node's address; that (address, port). Closed by :meth:`stop`."""
        forwarder = TcpForwarder((NODE_IP, node_port), (LOOPBACK, loopback_port))
        self._forwarders.append(forwarder)
        return forwarder.address

    def serve_service_from_host(
        self, namespace: str, service: str, loopback_ports: Mapping[str, int]
    ) -> dict[str, int]:
        """Make a Service's named ports lead to host programs listening on loopback
        (istiod runs on the host, not in its Deployment's pod); the port at the
        node's address each is served on (a free one: the targetPort may be taken
        there, as 15014 by istio-cni's metrics on the host network).

        The Service loses its selector, so the EndpointSlice controller stops
        pointing it at the Deployment's pods (its slices are deleted), and gets a
        slice of our own at the node's address, as the ``kubernetes`` and
        ``kube-dns`` Services do. Pods then dial the Service's own name, the one
        its program's certificate names.
        """
        with self.cluster.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            svc = core.read_namespaced_service(service, namespace)
            names = {p.name for p in (svc.spec.ports if svc.spec else None) or []}
            unknown = sorted(set(loopback_ports) - names)
            if unknown:
                raise RealNodeError(f"Service {namespace}/{service} has no ports {unknown}")
            served: dict[str, int] = {}
            for name, loopback in loopback_ports.items():
                served[name] = self.expose(loopback)[1]
            core.patch_namespaced_service(service, namespace, {"spec": {"selector": None}})
            discovery = k8s_client.DiscoveryV1Api(api)
            discovery.delete_collection_namespaced_endpoint_slice(
                namespace,
                label_selector=f"kubernetes.io/service-name={service},"
                "endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io",
            )
            with contextlib.suppress(ApiException):
                core.delete_namespaced_endpoints(service, namespace)
            slice_body = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{service}-real-node",
                    "namespace": namespace,
                    "labels": {
                        "kubernetes.io/service-name": service,
                        "endpointslice.kubernetes.io/managed-by": ENDPOINT_SLICE_MANAGER,
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                "ports": [
                    {"name": name, "port": port, "protocol": "TCP"} for name, port in served.items()
                ],
            }
            apply_objects(api, [slice_body])
        return served

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary (for the CLI's state file)."""
        return {
            "name": self.name,
            "node_ip": NODE_IP,
            "pod_cidr": NODE_POD_CIDR,
            "dir": str(self.dir),
            "runtime_endpoint": self.runtime_endpoint,
            "dns_ip": self.dns_ip,
            "sandbox_image": self.sandbox_image,
            "cgroup_parent": CGROUP_PARENT,
            "bridge": BRIDGE,
            "pids": {n: p.pid for n, p in self._procs.items() if p.running()},
        }

    # ---------------------------------------------------------- preconditions

    def missing(self) -> list[str]:
        """What this machine lacks for a real node, as readable reasons (empty: nothing)."""
        reasons = []
        if os.geteuid() != 0:
            reasons.append("not root: containerd, the kubelet and the CNI plugins need root")
        absent = [b for b in NODE_BINARIES if not self.binary(b).exists()]
        if absent:
            reasons.append(
                f"node programs missing in {self.bin_dir}: {', '.join(absent)} "
                "(run hack/build-binaries.sh)"
            )
        plugins = [p for p in CNI_PLUGINS if not (self.cni_bin_dir / p).exists()]
        if plugins:
            reasons.append(
                f"CNI plugins missing in {self.cni_bin_dir}: {', '.join(plugins)} "
                "(run hack/build-binaries.sh)"
            )
        tools = [t for t in HOST_PROGRAMS if shutil.which(t) is None]
        if tools:
            reasons.append(
                f"host programs missing on PATH: {', '.join(tools)} "
                "(hack/build-binaries.sh installs nftables and iptables)"
            )
        if not (self.pause_layout / "index.json").is_file():
            reasons.append(
                f"no pause image at {self.pause_layout} (an OCI layout: index.json missing; "
                "`make images` builds it)"
            )
        if not any(h.name == "memory" for h in cgroup_hierarchies()) and not any(
            (h / "cgroup.controllers").exists()
            and "memory" in (h / "cgroup.controllers").read_text()
            for h in cgroup_hierarchies()
        ):
            reasons.append("no memory cgroup controller mounted under /sys/fs/cgroup")
        return reasons

    # ------------------------------------------------------------- lifecycle

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Take the machine's node lock, clean up after a dead predecessor, start
        every component and wait until the Node is Ready."""
        if self._started:
            raise RealNodeError("real node already started")
        reasons = self.missing()
        if reasons:
            raise RealNodeError("cannot run a real node here: " + "; ".join(reasons))
        self._take_lock()
        self._started = True
        began = time.monotonic()
        try:
            sweep_previous()
            _write_state(
                {
                    "dir": str(self.dir),
                    "sysctls": read_sysctls(),
                    "created_paths": [str(f) for f in FIXED_PATHS if not f.exists()],
                    "pid": os.getpid(),
                }
            )
            self._prepare()
            self.expose(self.cluster.ports.apiserver, APISERVER_NODE_PORT)
            self._start_containerd(began + self.start_timeout)
            self._import_pause()
            # kube-proxy waits for its Node, which the kubelet registers.
            for name in ("coredns", "kubelet", "kube-proxy"):
                self._start(name)
            self._wait_ready(began + self.start_timeout)
            # The kubelet set its kernel tunables while starting its container
            # manager, before its Node turned Ready; the machine gets its own back.
            _restore_sysctls(_read_state().get("sysctls", {}), skip=("net/ipv4/ip_forward",))
        except BaseException:
            self.stop()
            raise
        self._say(f"real node {self.name} Ready in {time.monotonic() - began:.1f}s")

    def stop(self) -> None:
        """Remove the node's pods through the CRI, stop every component and take
        back everything they made (see the module's docstring); idempotent."""
        if not self._started:
            return
        try:
            self._stop_kubelet_and_pods()
            for name in ("kube-proxy", "coredns", "containerd"):
                proc = self._procs.get(name)
                if proc is not None:
                    proc.stop(15)
            self._close_forwarders()
            leftovers = sweep(self.dir, _read_state())
            with contextlib.suppress(FileNotFoundError):
                STATE_FILE.unlink()
            if leftovers:
                raise RealNodeError(f"the real node left behind: {'; '.join(leftovers)}")
        finally:
            # Even when a step above failed: the next node binds the same ports.
            self._close_forwarders()
            self._started = False
            self._release_lock()

    def _close_forwarders(self) -> None:
        forwarders, self._forwarders = self._forwarders, []
        for forwarder in forwarders:
            forwarder.close()

    # -------------------------------------------------------------- internals

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"devcluster: {message}", flush=True)

    def _take_lock(self) -> None:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        fh = LOCK_FILE.open("a+")
        deadline = time.monotonic() + self.lock_timeout
        said = False
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fh.close()
                    raise RealNodeError(
                        f"another real node holds {LOCK_FILE} after {self.lock_timeout:.0f}s "
                        f"(state: {_read_state()})"
                    ) from None
                if not said:
                    self._say(f"waiting for {LOCK_FILE}: another real node runs here")
                    said = True
                time.sleep(1)
        self._lock = fh

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _prepare(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        for sub in ("containerd", "cni/net.d", "cni/bin", "cni/state", "pod-logs", "pki"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for plugin in CNI_PLUGINS:
            shutil.copy2(self.cni_bin_dir / plugin, self.cni_plugin_dir / plugin)
        # containerd runs in a mount namespace of its own (see _define_components):
        # what the kubelet mounts later (the pods' volumes under RUN_DIR) reaches it
        # only through shared mounts, as a host's root is shared under systemd.
        for folder in (self.dir, RUN_DIR):
            _run(["mount", "--bind", str(folder), str(folder)])
            _run(["mount", "--make-rshared", str(folder)])
        (RUN_DIR / "kubelet").mkdir(parents=True, exist_ok=True)
        _make_cgroup_parent()
        self._make_bridge()
        self._write_identities()
        self._write_cluster_objects()
        self._write_configs()
        self._define_components()

    def _make_bridge(self) -> None:
        gateway = ipaddress.ip_interface(f"{NODE_IP}/{NODE_POD_CIDR.split('/')[1]}")
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", str(gateway), "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        # Every pod and service address not in use here goes to the bridge,
        # where nothing answers, instead of out of the machine's default route.
        for cidr in (POD_CIDR, SERVICE_CIDR):
            _run(["ip", "route", "add", cidr, "dev", BRIDGE])

    def _write_identities(self) -> None:
        c = self.cluster
        self.kubelet_kubeconfig = c.user_kubeconfig(f"system:node:{self.name}", ["system:nodes"])
        # Bound to the built-in ClusterRole system:node-proxier.
        self.proxy_kubeconfig = c.user_kubeconfig("system:kube-proxy")
        self.coredns_kubeconfig = c.user_kubeconfig(COREDNS_USER)

    def _write_cluster_objects(self) -> None:
        group = "rbac.authorization.k8s.io"
        role = "ambient-devcluster:coredns"
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": f"{group}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["services", "pods", "namespaces"],
                        "verbs": ["list", "watch"],
                    },
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "resources": ["endpointslices"],
                        "verbs": ["list", "watch"],
                    },
                ],
            },
            {
                "apiVersion": f"{group}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": group, "kind": "User", "name": COREDNS_USER}],
            },
            cluster_dns_service(),
        ]
        with self.cluster.api_client() as api:
            apply_objects(api, objects)
            core = k8s_client.CoreV1Api(api)
            svc = core.read_namespaced_service("kube-dns", "kube-system")
            if svc.spec is None or not svc.spec.cluster_ip:
                raise RealNodeError("the kube-dns Service has no cluster IP")
            self.dns_ip = str(svc.spec.cluster_ip)
            # CoreDNS runs on the host, at the node's address: the Service's
            # endpoints are a slice of our own, which the EndpointSlice
            # controller leaves alone (it manages only slices it labels).
            slice_body = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kube-dns-real-node",
                    "namespace": "kube-system",
                    "labels": {
                        "kubernetes.io/service-name": "kube-dns",
                        "endpointslice.kubernetes.io/managed-by": ENDPOINT_SLICE_MANAGER,
                    },
                },
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": [NODE_IP], "conditions": {"ready": True}, "nodeName": self.name}
                ],
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            }
            # The API server's own endpoint reconciler is off (it refuses a
            # loopback address); pods reach it through the node's forwarder.
            api_slice = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kubernetes-real-node",
                    "namespace": "default",
                    "labels": {
                        "kubernetes.io/service-name": "kubernetes",
                        "endpointslice.kubernetes.io/managed-by": ENDPOINT_SLICE_MANAGER,
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": APISERVER_NODE_PORT, "protocol": "TCP"}],
            }
            apply_objects(api, [slice_body, api_slice])

    def _write_configs(self) -> None:
        d, p = self.dir, self.ports
        self.sandbox_image = f"{SANDBOX_REPOSITORY}:{layout_tag(self.pause_layout)}"
        ca = self.cluster.ca_file
        (d / "containerd" / "config.toml").write_text(_containerd_config(self))
        (self.cni_conf_dir / CNI_CONFLIST).write_text(
            json.dumps(_cni_config(d / "cni" / "state"), indent=2)
        )
        (d / "resolv.conf").write_text(f"nameserver {self.dns_ip}\n")
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": p.kubelet,
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": p.kubelet_healthz,
            # The API server reaches the kubelet (logs, exec) without a client
            # certificate; the kubelet listens on the node's own bridge only.
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupRoot": f"/{CGROUP_PARENT}",
            "kubeletCgroups": f"/{CGROUP_PARENT}/kubelet",
            "cgroupsPerQOS": True,
            "containerRuntimeEndpoint": self.runtime_endpoint,
            "clusterDNS": [self.dns_ip],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(d / "pod-logs"),
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "5s",
            "tlsCertFile": str(d / "pki" / "kubelet.crt"),
            "tlsPrivateKeyFile": str(d / "pki" / "kubelet.key"),
            "staticPodPath": "",
            "maxPods": 110,
        }
        pki.CertificateAuthority.load(self.cluster.pki_dir).issue(
            d / "pki",
            "kubelet",
            f"system:node:{self.name}",
            ["system:nodes"],
            server=True,
            dns_names=[self.name],
            ip_addresses=[NODE_IP],
        )
        (d / "kubelet.yaml").write_text(json.dumps(kubelet, indent=2))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.proxy_kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "nftables",
            "clusterCIDR": POD_CIDR,
            "detectLocalMode": "ClusterCIDR",
            "healthzBindAddress": f"{LOOPBACK}:{p.kube_proxy_healthz}",
            "metricsBindAddress": f"{LOOPBACK}:{p.kube_proxy_metrics}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            # Zero leaves the machine's conntrack limits and timeouts as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (d / "kube-proxy.yaml").write_text(json.dumps(proxy, indent=2))
        # Cluster names only: a name outside the cluster domain is refused,
        # never sent to the machine's resolver.
        (d / "Corefile").write_text(
            f"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{\n"
            f"    bind {NODE_IP}\n"
            "    errors\n"
            f"    health {LOOPBACK}:{p.coredns_health}\n"
            f"    ready {LOOPBACK}:{p.coredns_ready}\n"
            f"    prometheus {LOOPBACK}:{p.coredns_metrics}\n"
            f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
            f"        kubeconfig {self.coredns_kubeconfig}\n"
            "        pods insecure\n"
            "        fallthrough in-addr.arpa ip6.arpa\n"
            "    }\n"
            "    cache 5\n"
            "}\n"
        )

    def _define_components(self) -> None:
        d = self.dir
        argv = {
            # containerd is the first process of a pid namespace of its own, with
            # that namespace's /proc: a pod's hostPath /proc (istio-cni's) then has
            # a process 1 whose namespaces can be read. This machine's own process 1
            # refuses that even to root ("readlink /proc/1/ns/net: permission
            # denied"), and istio-cni stats /host/proc/1/ns/net to know the host's
            # network namespace, and will not start without it. The mount
            # namespace is the new /proc's; it is a slave of the machine's, so the
            # pods' volume mounts reach containerd, and the containers' mounts stay
            # in it and vanish with it. --kill-child: containerd dies with unshare.
            # Inside, the node's folder is shared again (and still the machine's
            # slave): the network namespaces containerd mounts there reach the
            # containers that mount the folder with HostToContainer (istio-cni).
            "containerd": [
                "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                "--propagation", "slave",
                "sh", "-c", 'mount --make-rshared "$0" && exec "$@"', str(d),
                str(self.binary("containerd")), "--config", str(d / "containerd" / "config.toml"),
            ],
            "kubelet": [
                str(self.binary("kubelet")),
                f"--config={d / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubelet_kubeconfig}",
                f"--root-dir={RUN_DIR / 'kubelet'}",
                f"--cert-dir={d / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
            "kube-proxy": [str(self.binary("kube-proxy")), f"--config={d / 'kube-proxy.yaml'}"],
            "coredns": [str(self.binary("coredns")), "-conf", str(d / "Corefile")],
        }  # fmt: skip
        # containerd finds runc and the shim, the kubelet and plugins find
        # nft and iptables, on PATH.
        env = {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._procs = {
            name: ManagedProcess(name, argv[name], self.log_file(name), cwd=d, env=env)
            for name in COMPONENTS
        }

    def _start(self, name: str) -> None:
        proc = self._procs[name]
        proc.start()
        if proc.pid is not None:
            enter_node_cgroup(proc.pid, name)

    def _start_containerd(self, deadline: float) -> None:
        self._start("containerd")
        proc = self._procs["containerd"]
        _wait(
            lambda: self.containerd_socket.exists() and bool(self.ctr("version", timeout=10)),
            deadline,
            "containerd answering on its socket",
            proc,
        )
        # unshare forked containerd before it was moved: containerd follows it.
        if proc.pid is not None:
            for child in _children(proc.pid):
                enter_node_cgroup(child, "containerd")

    def _import_pause(self) -> None:
        self.import_layout(self.pause_layout, SANDBOX_REPOSITORY)

    def import_layout(self, layout: Path, repository: str) -> str:
        """Load an OCI image layout (one image, named by its tag) into the node's
        containerd as ``<repository>:<tag>``, where the kubelet finds it; that name.

        Pods name it with ``imagePullPolicy: Never`` (or IfNotPresent).
        """
        reference = f"{repository}:{layout_tag(layout)}"
        archive = self.dir / f"import-{os.getpid()}.tar"
        with tarfile.open(archive, "w") as tar:
            for entry in sorted(layout.rglob("*")):
                tar.add(entry, arcname=str(entry.relative_to(layout)), recursive=False)
        try:
            # The layout names its image by tag alone; ctr puts the base name before it.
            self.ctr("images", "import", "--base-name", repository, str(archive))
        finally:
            archive.unlink()
        if reference not in self.ctr("images", "list", "--quiet").split():
            raise RealNodeError(f"importing {layout} made no {reference}")
        return reference

    def _wait_ready(self, deadline: float) -> None:
        p = self.ports
        probes = {
            "coredns": lambda: _http_ok(f"http://{LOOPBACK}:{p.coredns_ready}/ready"),
            "kubelet": lambda: _http_ok(f"http://{LOOPBACK}:{p.kubelet_healthz}/healthz"),
            "kube-proxy": lambda: _http_ok(f"http://{LOOPBACK}:{p.kube_proxy_healthz}/healthz"),
        }
        for name, probe in probes.items():
            _wait(probe, deadline, f"{name} healthy", self._procs[name])
        with self.cluster.api_client() as api:
            core = k8s_client.CoreV1Api(api)
            _wait(
                lambda: _node_ready(core, self.name),
                deadline,
                f"Node {self.name} Ready",
                self._procs["kubelet"],
            )

    def _stop_kubelet_and_pods(self) -> None:
        kubelet = self._procs.get("kubelet")
        if kubelet is not None:
            kubelet.stop(15)
        containerd = self._procs.get("containerd")
        if containerd is None or not containerd.running():
            return
        # Removing each sandbox through the CRI runs the CNI plugins' DEL
        # (veth, address, portmap rules) and unmounts its /dev/shm and netns.
        try:
            self.crictl("rmp", "--all", "--force", timeout=90)
        except (RealNodeError, subprocess.TimeoutExpired) as exc:
            self._say(f"crictl rmp failed, sweeping instead: {exc}")


# ------------------------------------------------------------------ configs


def _containerd_config(node: RealNode) -> str:
    d = node.dir / "containerd"
    return f"""version = 3
root = "{d / "root"}"
state = "{d / "state"}"
# Plugins that would write outside the node's folder (opt: /opt/containerd,
# nri: /var/run/nri) or need what this machine lacks.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{node.containerd_socket}"

[ttrpc]
  address = "{RUN_DIR / "containerd.ttrpc.sock"}"

[debug]
  address = "{RUN_DIR / "debug.sock"}"
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{node.sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  enable_selinux = false
  # No process here has CAP_SYS_RESOURCE, so none may lower its OOM score
  # below its parent's (the pause container asks for -998): containers keep
  # containerd's score at least.
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{node.binary("runc")}"
        Root = "{d / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{node.cni_plugin_dir}"]
    conf_dir = "{node.cni_conf_dir}"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
"""


def _cni_config(state_dir: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "ambient-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(state_dir / "host-local"),
                    "ranges": [[{"subnet": NODE_POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "backend": "nftables", "capabilities": {"portMappings": True}},
        ],
    }


# ------------------------------------------------------------------ helpers


def layout_tag(layout: Path) -> str:
    """The tag an OCI layout of one image names it by (index.json's ref.name annotation)."""
    index = json.loads((layout / "index.json").read_text())
    tags = [
        m["annotations"][REF_NAME]
        for m in index.get("manifests", [])
        if REF_NAME in (m.get("annotations") or {})
    ]
    if len(tags) != 1:
        raise RealNodeError(f"{layout}/index.json names {len(tags)} images, not one: {tags}")
    return str(tags[0])


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _node_ready(core: Any, name: str) -> bool:
    try:
        node = core.read_node(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _wait(probe: Any, deadline: float, what: str, proc: ManagedProcess) -> None:
    last = ""
    while True:
        code = proc.returncode()
        if code is not None:
            raise RealNodeError(
                f"{proc.name} exited with status {code} while waiting for {what}; "
                f"last lines of {proc.log_file}:\n{proc.log_tail()}"
            )
        try:
            if probe():
                return
        except Exception as exc:  # a failed probe is "not yet"
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise RealNodeError(
                f"timed out waiting for {what} ({last or 'no answer'}); "
                f"last lines of {proc.log_file}:\n{proc.log_tail()}"
            )
        time.sleep(0.2)


def _make_cgroup_parent() -> None:
    for hierarchy in cgroup_hierarchies():
        _make_cgroup(hierarchy, hierarchy / CGROUP_PARENT)


def _make_cgroup(hierarchy: Path, path: Path) -> None:
    path.mkdir(exist_ok=True)
    # A new cpuset has no CPUs and no memory nodes until given its parent's.
    for name in ("cpuset.cpus", "cpuset.mems"):
        if (hierarchy / name).exists() and not (path / name).read_text().strip():
            (path / name).write_text((hierarchy / name).read_text())


def enter_node_cgroup(pid: int, component: str) -> None:
    """Move a process of the node into ``/<CGROUP_PARENT>/<component>`` of every hierarchy.

    The kubelet would move itself into its ``kubeletCgroups``, but first
    checks that it runs in the host's pid namespace by reading
    ``/proc/1/ns/pid``, which this machine refuses ("Failed to ensure state
    ... failed to find pid namespace of init process"); so it, and every
    other component, is put there from outside, right after it starts.
    """
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / CGROUP_PARENT / component
        _make_cgroup(hierarchy, path)
        (path / "cgroup.procs").write_text(str(pid))


def _children(pid: int) -> list[int]:
    """The direct children of a process."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(x) for x in (task / "children").read_text().split()]
    return found


def _read_state() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(STATE_FILE.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def _write_state(state: dict[str, Any]) -> None:
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(STATE_FILE)


def _restore_sysctls(saved: dict[str, str], skip: Sequence[str] = ()) -> None:
    for name, value in saved.items():
        if name in skip or name not in SAVED_SYSCTLS:
            continue
        path = _sysctl_path(name)
        if path.read_text().strip() != value:
            path.write_text(value)


def _cgroup_pids() -> list[int]:
    pids: set[int] = set()
    for d in node_cgroup_dirs():
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return sorted(pids)


def _kill_and_wait(pids: Sequence[int], timeout: float = 10) -> list[int]:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def sweep_previous(owner: Path | None = None) -> list[str]:
    """Clean up after a node whose process died without stopping (from the state
    file); what could not be removed, as readable items.

    With ``owner``, only a node whose folder is under ``owner`` is swept, and
    only when no live process holds the machine's node lock (that one is
    running, not dead). Without it the caller holds the lock already.
    """
    state = _read_state()
    if not state:
        return []
    node_dir = Path(state["dir"])
    if owner is None:
        return sweep(node_dir, state)
    if not node_dir.is_relative_to(owner):
        return []
    with LOCK_FILE.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []
        left = sweep(node_dir, state)
        if not left:
            with contextlib.suppress(FileNotFoundError):
                STATE_FILE.unlink()
        return left


def sweep(node_dir: Path, state: dict[str, Any]) -> list[str]:
    """Kill, unmount and remove everything a node of ``node_dir`` made and put
    back what ``state`` (the state file) saved; what is left despite that, as
    readable items (empty when clean)."""
    left: list[str] = []
    # Shims re-parent themselves to init, and containers live in the node's
    # cgroups: neither dies with containerd.
    shims = [p.pid for p in find_processes(cmdline_contains=str(node_dir))]
    shims += [p.pid for p in find_processes(cmdline_contains=str(RUN_DIR))]
    for _ in range(3):
        survivors = _kill_and_wait(shims + _cgroup_pids())
        shims = []
        if not survivors:
            break
    else:
        left.append(f"processes {survivors}")
    for point in mounts_under(node_dir) + mounts_under(RUN_DIR):
        proc = subprocess.run(["umount", point], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    remaining = mounts_under(node_dir) + mounts_under(RUN_DIR)
    if remaining:
        left.append(f"mounts {remaining}")
    for veth in links_on_bridge():
        _run(["ip", "link", "del", veth], check=False)
    if link_exists(BRIDGE):
        _run(["ip", "link", "del", BRIDGE], check=False)
        if link_exists(BRIDGE):
            left.append(f"link {BRIDGE}")
    for family, table in nft_tables_present():
        _run(["nft", "delete", "table", family, table], check=False)
    tables = nft_tables_present()
    if tables:
        left.append(f"nft tables {tables}")
    left += sweep_agent_rules()
    for d in node_cgroup_dirs():
        try:
            d.rmdir()
        except OSError as exc:
            left.append(f"cgroup {d}: {exc.strerror}")
    _restore_sysctls(state.get("sysctls", {}))
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(node_dir)):
                    link.unlink()
    for created in state.get("created_paths", []):
        if Path(created) in FIXED_PATHS:
            shutil.rmtree(created, ignore_errors=True)
    if not mounts_under(node_dir):
        shutil.rmtree(node_dir, ignore_errors=True)
    if not mounts_under(RUN_DIR):
        shutil.rmtree(RUN_DIR, ignore_errors=True)
    return left


def _status(argv: Sequence[str]) -> int:
    return subprocess.run(list(argv), capture_output=True, timeout=30, check=False).returncode


def agent_rules_present() -> list[str]:
    """istio-cni's host chains and address sets that exist now, as readable items."""
    found = [
        f"{tool} nat {AGENT_NAT_CHAIN}"
        for tool in IPTABLES_PROGRAMS
        if shutil.which(tool) and _status([tool, "-t", "nat", "-S", AGENT_NAT_CHAIN]) == 0
    ]
    if shutil.which("ipset"):
        found += [f"ipset {name}" for name in AGENT_IPSETS if _status(["ipset", "list", name]) == 0]
    return found


def sweep_agent_rules() -> list[str]:
    """Remove istio-cni's host chains (in both iptables back ends, where it may
    have picked either) and then its address sets; what is left, as readable items."""
    for tool in IPTABLES_PROGRAMS:
        if not shutil.which(tool) or _status([tool, "-t", "nat", "-S", AGENT_NAT_CHAIN]):
            continue
        while _status([tool, "-t", "nat", "-D", "POSTROUTING", "-j", AGENT_NAT_CHAIN]) == 0:
            pass
        _status([tool, "-t", "nat", "-F", AGENT_NAT_CHAIN])
        _status([tool, "-t", "nat", "-X", AGENT_NAT_CHAIN])
    if shutil.which("ipset"):
        for name in AGENT_IPSETS:
            _status(["ipset", "destroy", name])
    return agent_rules_present()


@contextlib.contextmanager
def real_node(cluster: LocalCluster, **kwargs: Any) -> Iterator[RealNode]:
    """Function form of ``with RealNode(cluster, ...)``."""
    with RealNode(cluster, **kwargs) as node:
        yield node
