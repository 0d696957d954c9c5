"""A real Kubernetes control plane on loopback ports, without containers.

``LocalCluster`` runs etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok as child processes of the calling Python process, in a
work directory that holds their certificates, data and one log file each.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from . import kwokstages, pki
from .process import ManagedProcess, ProcInfo, find_processes, pid_alive

LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
# The first address of the service range is the "kubernetes" Service's.
KUBERNETES_SERVICE_IP = "10.96.0.1"
POD_CIDR = "10.244.0.0/16"
CLUSTER_NAME = "ambient-dev"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Start order; restart() and stop walk this list.
COMPONENTS = BINARIES

_REPO_ROOT = Path(__file__).resolve().parents[3]  # hack/devcluster/ambient_devcluster/launcher.py


def api_client_for(kubeconfig: Path | str) -> k8s_client.ApiClient:
    """A ``kubernetes`` ApiClient for a kubeconfig, leaving the library's global
    default configuration untouched."""
    api: k8s_client.ApiClient = k8s_config.new_client_from_config(
        config_file=str(kubeconfig), persist_config=False
    )
    return api


class ClusterError(RuntimeError):
    """A component failed to start, became unhealthy or the cluster is misused."""


def default_bin_dir() -> Path:
    """``$AMBIENT_BIN_DIR`` if set, else the repository's ``.cache/bin``."""
    env = os.environ.get("AMBIENT_BIN_DIR")
    return Path(env) if env else _REPO_ROOT / ".cache" / "bin"


def repo_root() -> Path:
    """Root of the source checkout this package is imported from."""
    return _REPO_ROOT


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now."""
    # Holding every socket until all are chosen keeps the ports distinct.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one cluster, fixed for its whole life."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def allocate(cls) -> Ports:
        """Pick six currently free, distinct loopback ports."""
        return cls(*free_ports(6))


@dataclass
class _Component:
    process: ManagedProcess
    check: Callable[[], bool]


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok.

    Use as a context manager::

        with LocalCluster(workdir) as cluster, cluster.api_client() as api:
            kubernetes.client.CoreV1Api(api).list_namespace()

    The work directory is reset on start (fresh CA, fresh etcd data). When no
    work directory is given a temporary one is created and removed on a clean
    stop. Components die with the Python process however it ends: SIGTERM
    stops them (unless the program installed its own SIGTERM handler), and
    the kernel SIGKILLs them if the process is killed (``PR_SET_PDEATHSIG``;
    note that this follows the *thread* that started them, so start clusters
    from a long-lived thread such as the main one).
    """

    def __init__(
        self,
        workdir: Path | str | None = None,
        *,
        bin_dir: Path | str | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 15.0,
        verbose: bool = True,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        node_heartbeat_ms: tuple[int, int] | None = None,
    ):
        self._owns_workdir = workdir is None
        self.workdir = Path(
            tempfile.mkdtemp(prefix="ambient-devcluster-") if workdir is None else workdir
        ).resolve()
        self.bin_dir = Path(bin_dir) if bin_dir is not None else default_bin_dir()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.verbose = verbose
        # Flags added to a component's command line, by component name.
        self.extra_args = {name: list(args) for name, args in (extra_args or {}).items()}
        # (least, most) ms between a kwok node's status heartbeats. The default
        # keeps kube-controller-manager's grace period; a benchmark of a large
        # cluster asks for a kubelet's own pace (a status every 5 minutes).
        self.node_heartbeat_ms = node_heartbeat_ms or (
            kwokstages.HEARTBEAT_MS,
            kwokstages.HEARTBEAT_JITTER_MS,
        )
        self.ports = Ports.allocate()
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        # Every request, as JSON lines: tests count what a client really sent.
        self.audit_log = self.log_dir / "audit.log"
        self.ca_file = self.pki_dir / "ca.crt"
        self.startup_seconds: float | None = None
        self._ca: pki.CertificateAuthority | None = None
        self._components: dict[str, _Component] = {}
        self._lock = threading.RLock()
        self._started = False
        self._atexit_registered = False

    # ------------------------------------------------------------------ info

    @property
    def server(self) -> str:
        """HTTPS URL of the API server."""
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        """Client URL of etcd (plain HTTP, loopback only)."""
        return f"http://{LOOPBACK}:{self.ports.etcd_client}"

    def binary(self, name: str) -> Path:
        """Path of one of the upstream programs (also ``kubectl``, ``helm``)."""
        return self.bin_dir / name

    def pids(self) -> dict[str, int]:
        """Pids of the running components."""
        return {
            name: comp.process.pid
            for name, comp in self._components.items()
            if comp.process.pid is not None and comp.process.running()
        }

    def exited_components(self) -> dict[str, int]:
        """Components that were started and have exited since, with exit status."""
        result = {}
        for name, comp in self._components.items():
            code = comp.process.returncode()
            if code is not None:
                result[name] = code
        return result

    def log_file(self, component: str) -> Path:
        """Log file of a component."""
        return self.log_dir / f"{component}.log"

    def leftover_processes(self) -> list[ProcInfo]:
        """Processes of our binaries that still reference this work directory."""
        return find_processes(
            exe_in=[self.binary(b) for b in BINARIES if self.binary(b).exists()],
            cmdline_contains=str(self.workdir),
        )

    # ------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(remove_workdir=exc_type is None)

    def start(self) -> None:
        """Start every component and wait until each is healthy."""
        with self._lock:
            if self._started:
                raise ClusterError("cluster already started")
            missing = [b for b in BINARIES if not self.binary(b).exists()]
            if missing:
                raise ClusterError(
                    f"missing binaries in {self.bin_dir}: {', '.join(missing)} "
                    "(run hack/build-binaries.sh or set AMBIENT_BIN_DIR)"
                )
            self._started = True
            _LIVE.add(self)
            _install_sigterm_handler()
            if not self._atexit_registered:
                atexit.register(self.stop)
                self._atexit_registered = True
            began = time.monotonic()
            try:
                self._prepare_workdir()
                self._define_components()
                # etcd and the API server must come up in order; the three
                # clients of the API server can start together.
                for name in ("etcd", "kube-apiserver"):
                    self._components[name].process.start()
                    self._wait_healthy(name, began + self.start_timeout)
                rest = ("kube-controller-manager", "kube-scheduler", "kwok")
                for name in rest:
                    self._components[name].process.start()
                for name in rest:
                    self._wait_healthy(name, began + self.start_timeout)
            except BaseException:
                self.stop(remove_workdir=False)
                raise
            self.startup_seconds = time.monotonic() - began
            self._say(f"control plane ready in {self.startup_seconds:.1f}s at {self.server}")

    def stop(self, remove_workdir: bool = False) -> None:
        """Stop all components (SIGTERM, then SIGKILL after ``stop_timeout``)."""
        with self._lock:
            for name in reversed(COMPONENTS):
                comp = self._components.get(name)
                if comp is not None:
                    comp.process.stop(self.stop_timeout)
            self._started = False
            _LIVE.discard(self)
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            if remove_workdir and self._owns_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(
        self, component: str, *, graceful: bool = True, timeout: float | None = None
    ) -> None:
        """Stop one component and start it again with the same ports and data.

        ``graceful=False`` SIGKILLs it instead of SIGTERM, like a crash. A
        graceful etcd stop takes ~7 s while the API server holds watches open
        (etcd's own request timeout bounds its drain).
        """
        with self._lock:
            comp = self._component(component)
            comp.process.stop(self.stop_timeout, graceful=graceful)
            comp.process.start()
            self._wait_healthy(component, time.monotonic() + (timeout or self.start_timeout))

    def stop_component(self, component: str, *, graceful: bool = True) -> None:
        """Stop one component without starting it again (see :meth:`start_component`)."""
        with self._lock:
            self._component(component).process.stop(self.stop_timeout, graceful=graceful)

    def _component(self, component: str) -> _Component:
        comp = self._components.get(component)
        if comp is None or not self._started:
            raise ClusterError(
                f"unknown component {component!r} or cluster not started "
                f"(components: {', '.join(COMPONENTS)})"
            )
        return comp

    def start_component(self, component: str, timeout: float | None = None) -> None:
        """Start a component stopped by :meth:`stop_component` and wait for it."""
        with self._lock:
            comp = self._component(component)
            comp.process.start()
            self._wait_healthy(component, time.monotonic() + (timeout or self.start_timeout))

    def healthy(self, component: str) -> bool:
        """One health probe of a component (no waiting)."""
        comp = self._component(component)
        try:
            return comp.process.running() and comp.check()
        except Exception:  # a failed probe is simply "not healthy"
            return False

    # ------------------------------------------------------------ identities

    def api_client(self) -> k8s_client.ApiClient:
        """A new admin ApiClient (close it, or use it as a context manager)."""
        return api_client_for(self.kubeconfig)

    def user_kubeconfig(self, user: str, groups: list[str] | None = None) -> Path:
        """Issue a client certificate for ``user`` in ``groups`` and return a
        kubeconfig that authenticates with it."""
        if self._ca is None:
            raise ClusterError("cluster not started")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        pair = self._ca.issue(self.pki_dir / "users", safe, user, groups or [], client=True)
        return pki.write_kubeconfig(
            self.workdir / "users" / f"{safe}.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user=user,
            client=pair,
        )

    def serviceaccount_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> Path:
        """Kubeconfig with a bound token (TokenRequest) for a ServiceAccount."""
        with self.api_client() as api:
            request = k8s_client.AuthenticationV1TokenRequest(
                spec=k8s_client.V1TokenRequestSpec(
                    audiences=[SA_ISSUER], expiration_seconds=expiration_seconds
                )
            )
            response = k8s_client.CoreV1Api(api).create_namespaced_service_account_token(
                name, namespace, request
            )
        if response.status is None:
            raise ClusterError(f"TokenRequest for {namespace}/{name} returned no token")
        return pki.write_kubeconfig(
            self.workdir / "serviceaccounts" / f"{namespace}.{name}.kubeconfig",
            server=self.server,
            ca_file=self.ca_file,
            user=f"system:serviceaccount:{namespace}:{name}",
            token=response.status.token,
        )

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary (used by the CLI's state file)."""
        return {
            "workdir": str(self.workdir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "ca_file": str(self.ca_file),
            "pids": self.pids(),
            "ports": self.ports.__dict__,
            "startup_seconds": self.startup_seconds,
        }

    # -------------------------------------------------------------- internals

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"devcluster: {message}", file=sys.stderr, flush=True)

    def _prepare_workdir(self) -> None:
        for sub in ("pki", "etcd", "users", "serviceaccounts", "kwok-home", "certs", "logs"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        d = self.pki_dir
        ca = pki.CertificateAuthority.create(d)
        self._ca = ca
        front_proxy_ca = pki.CertificateAuthority.create(d / "front-proxy", "front-proxy-ca")
        front_proxy_ca.issue(d, "front-proxy-client", "front-proxy-client", client=True)
        ca.issue(
            d,
            "apiserver",
            "kube-apiserver",
            server=True,
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=[LOOPBACK, KUBERNETES_SERVICE_IP],
        )
        sa_key = pki.new_key()
        pki.write_private_key(d / "sa.key", sa_key)
        (d / "sa.pub").write_bytes(pki.public_key_pem(sa_key))
        identities = {
            "admin": ("kubernetes-admin", ["system:masters"]),
            "kube-controller-manager": ("system:kube-controller-manager", []),
            "kube-scheduler": ("system:kube-scheduler", []),
            # kwok impersonates nothing and needs broad node/pod status
            # access, the same trust a kubelet fleet would have.
            "kwok": ("kwok-controller", ["system:masters"]),
        }
        for basename, (cn, groups) in identities.items():
            pair = ca.issue(d, basename, cn, groups, client=True)
            path = (
                self.kubeconfig if basename == "admin" else self.workdir / f"{basename}.kubeconfig"
            )
            pki.write_kubeconfig(
                path, server=self.server, ca_file=ca.cert_file, user=cn, client=pair
            )
        (self.workdir / "kwok.yaml").write_text(kwokstages.config_yaml(self.node_heartbeat_ms))
        # Metadata of every completed request; the control plane's own chatter
        # (kwok heartbeats, controllers) is left out to keep the file small.
        (self.workdir / "audit-policy.yaml").write_text(
            "apiVersion: audit.k8s.io/v1\n"
            "kind: Policy\n"
            "omitStages: [RequestReceived, ResponseStarted]\n"
            "rules:\n"
            "- level: None\n"
            "  users: [kwok-controller, system:kube-controller-manager, system:kube-scheduler,\n"
            "          system:apiserver]\n"
            "- level: None\n"
            "  userGroups: [system:serviceaccounts:kube-system]\n"
            "- level: Metadata\n"
        )
        (self.workdir / "kwok-home").mkdir()

    def _define_components(self) -> None:
        w, d, p = self.workdir, self.pki_dir, self.ports
        etcd_peer = f"http://{LOOPBACK}:{p.etcd_peer}"
        argv: dict[str, list[str]] = {
            "etcd": [
                str(self.binary("etcd")),
                "--name=devcluster",
                f"--data-dir={w / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={etcd_peer}",
                f"--initial-advertise-peer-urls={etcd_peer}",
                f"--initial-cluster=devcluster={etcd_peer}",
                "--initial-cluster-state=new",
                # Durability across host crashes is irrelevant for a throwaway
                # cluster and fsync dominates etcd latency on shared disks.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(self.binary("kube-apiserver")),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                # The endpoint reconciler refuses a loopback advertise address;
                # nothing in this cluster can reach the "kubernetes" Service's
                # endpoints anyway (pods are simulated).
                "--endpoint-reconciler-type=none",
                # A real node's kubelet (logs, exec) by its address: its
                # hostname is no name the machine's resolver knows.
                "--kubelet-preferred-address-types=InternalIP",
                f"--secure-port={p.apiserver}",
                f"--cert-dir={w / 'certs' / 'apiserver'}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,"
                "ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
                "--allow-privileged=true",
                f"--requestheader-client-ca-file={d / 'front-proxy' / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={d / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={d / 'front-proxy-client.key'}",
                # Without it a graceful stop waits up to 60 s for clients'
                # HTTP/2 watch streams; with it the server answers with
                # Retry-After and closes connections after 2 s, so restart()
                # takes seconds.
                "--shutdown-send-retry-after=true",
                "--profiling=false",
                f"--audit-policy-file={w / 'audit-policy.yaml'}",
                f"--audit-log-path={w / 'logs' / 'audit.log'}",
                "--audit-log-format=json",
                "--audit-log-maxsize=1024",
            ],
            "kube-controller-manager": [
                str(self.binary("kube-controller-manager")),
                f"--kubeconfig={w / 'kube-controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={w / 'kube-controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={w / 'kube-controller-manager.kubeconfig'}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={p.controller_manager}",
                f"--cert-dir={w / 'certs' / 'kube-controller-manager'}",
                "--leader-elect=false",
                # Every controller that is on by default in a real cluster,
                # daemonset/deployment/replicaset/garbage-collector/namespace/
                # serviceaccount(-token)/endpointslice among them.
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--cluster-signing-cert-file={d / 'ca.crt'}",
                f"--cluster-signing-key-file={d / 'ca.key'}",
                f"--cluster-name={CLUSTER_NAME}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Notice Ready/NotReady fake nodes within ~2 s instead of 5 s,
                # so node taints follow kwok (and chaos tests) promptly.
                "--node-monitor-period=2s",
                "--profiling=false",
            ],
            "kube-scheduler": [
                str(self.binary("kube-scheduler")),
                f"--kubeconfig={w / 'kube-scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={w / 'kube-scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={w / 'kube-scheduler.kubeconfig'}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={p.scheduler}",
                f"--cert-dir={w / 'certs' / 'kube-scheduler'}",
                "--leader-elect=false",
                "--profiling=false",
                # A pod that found no node (say, its node was not in the
                # scheduler's cache yet) is retried within seconds, not after
                # the default 5 minutes: simulated node churn is fast.
                "--pod-max-in-unschedulable-pods-duration=10s",
            ],
            "kwok": [
                str(self.binary("kwok")),
                f"--kubeconfig={w / 'kwok.kubeconfig'}",
                f"--config={w / 'kwok.yaml'}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
                f"--server-address={LOOPBACK}:{p.kwok}",
                f"--cidr={POD_CIDR}",
            ],
        }
        for name, args in self.extra_args.items():
            argv[name] += args
        # kwok always reads ~/.kwok/kwok.yaml when it exists; a private HOME
        # keeps a developer's own kwok settings out of the tests.
        kwok_env = {**os.environ, "HOME": str(w / "kwok-home")}
        checks: dict[str, Callable[[], bool]] = {
            "etcd": self._etcd_healthy,
            "kube-apiserver": self._apiserver_ready,
            "kube-controller-manager": lambda: self._https_ok(p.controller_manager, "/healthz"),
            "kube-scheduler": lambda: self._https_ok(p.scheduler, "/healthz"),
            "kwok": lambda: self._http_ok(p.kwok, "/healthz"),
        }
        self._components = {
            name: _Component(
                ManagedProcess(
                    name,
                    argv[name],
                    self.log_file(name),
                    cwd=w,
                    env=kwok_env if name == "kwok" else None,
                ),
                checks[name],
            )
            for name in COMPONENTS
        }

    def _wait_healthy(self, name: str, deadline: float) -> None:
        comp = self._components[name]
        last_error = ""
        while True:
            code = comp.process.returncode()
            if code is not None:
                raise ClusterError(
                    f"{name} exited with status {code} while starting; "
                    f"last lines of {comp.process.log_file}:\n{comp.process.log_tail()}"
                )
            try:
                if comp.check():
                    return
            except Exception as exc:  # any probe failure just means "not yet"
                last_error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{name} not healthy before the deadline ({last_error or 'no answer'}); "
                    f"last lines of {comp.process.log_file}:\n{comp.process.log_tail()}"
                )
            time.sleep(0.1)

    # Probes: each returns True when healthy and raises or returns False
    # otherwise; short timeouts so a hung server cannot stall the deadline.

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
            return bool(json.load(resp).get("health") == "true")

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return ctx

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.server}/readyz", timeout=3, context=self._admin_ssl()
            ) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    @staticmethod
    def _https_ok(port: int, path: str) -> bool:
        # kube-controller-manager and kube-scheduler serve self-signed certs.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(
                f"https://{LOOPBACK}:{port}{path}", timeout=2, context=ctx
            ) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    @staticmethod
    def _http_ok(port: int, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False


# Clusters started and not yet stopped in this process.
_LIVE: weakref.WeakSet[LocalCluster] = weakref.WeakSet()
_handler_lock = threading.Lock()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Stop every live cluster, then die of SIGTERM exactly as the default
    # action would (raising SystemExit instead could be swallowed, e.g. by a
    # test runner recording it as one failed test and carrying on).
    try:
        for cluster in list(_LIVE):
            cluster.stop()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    """Stop clusters on SIGTERM, unless the program handles SIGTERM itself."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _handler_lock:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)


def wait_processes_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if pid_alive(p)]
    return alive


@contextlib.contextmanager
def local_cluster(workdir: Path | str | None = None, **kwargs: Any) -> Iterator[LocalCluster]:
    """Function form of ``with LocalCluster(...)``."""
    with LocalCluster(workdir, **kwargs) as cluster:
        yield cluster
