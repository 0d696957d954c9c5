"""Istio's control plane in a local cluster, from Istio's own charts and program.

:class:`IstioControlPlane` installs upstream's ``base`` and ``istiod`` Helm
charts (copied by ``hack/build-binaries.sh`` from the ``istio.io/istio``
module pinned in ``hack/cluster/istio``) with ``profile=ambient``, exactly as a
user would, so istiod's Deployment, Services, ConfigMaps, GatewayClasses and
webhooks are real objects. kwok runs the Deployment's pod, which does
nothing; the real istiod is ``pilot-discovery`` built from the same module and
run here, out of cluster, with that Deployment's arguments and environment.

The API server reaches istiod's webhooks through the charts' own URL values
(``istiodRemote.injectionURL``, ``base.validationURL``), which point at this
process on loopback; istiod serves them with a certificate from the local
cluster's CA that names 127.0.0.1, passed with ``--tlsCertFile``.

:func:`install_istiod_objects` is the cheap variant for clusters that need
only what the operator reads of istiod (its Service and Deployment): the
same chart rendered by ``helm template``, without webhooks or a process.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client as k8s_client

from .launcher import LOOPBACK, ClusterError, api_client_for, free_ports, repo_root
from .manifests import apply_objects
from .pki import CertificateAuthority
from .process import ManagedProcess

ISTIO_NAMESPACE = "istio-system"
BASE_RELEASE = "istio-base"
ISTIOD_RELEASE = "istiod"
# What the operator's Windows agents trust besides upstream's default ztunnel
# account; the demo and most tests install istiod with both, as the
# operator's IstiodTrustMissing message tells a user to.
ZTUNNEL_ACCOUNTS = ("ztunnel", "ztunnel-windows")
# The fields a pod's environment may take from itself, as they would read
# for a pod named like the Deployment running on this host.
_POD_NAME = "istiod-local"
_SERVICE_ACCOUNT = "istiod"


def charts_dir() -> Path:
    """Where ``hack/build-binaries.sh`` copies Istio's charts (``$AMBIENT_ISTIO_CHARTS``)."""
    env = os.environ.get("AMBIENT_ISTIO_CHARTS")
    return Path(env) if env else repo_root() / ".cache" / "istio" / "charts"


def helm(
    bin_dir: Path,
    *args: str,
    kubeconfig: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run the built helm with a private home, so no user setting leaks in or out."""
    binary = bin_dir / "helm"
    if not binary.exists():
        raise ClusterError(f"{binary} missing; run hack/build-binaries.sh")
    with tempfile.TemporaryDirectory(prefix="ambient-helm-home-") as home:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": f"{home}/cache",
            "HELM_CONFIG_HOME": f"{home}/config",
            "HELM_DATA_HOME": f"{home}/data",
        }
        env.pop("KUBECONFIG", None)
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        return subprocess.run(
            [str(binary), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )


def _chart(name: str) -> Path:
    path = charts_dir() / name
    if not (path / "Chart.yaml").is_file():
        raise ClusterError(f"Istio chart {path} missing; run hack/build-binaries.sh")
    return path


def _set_flags(values: Mapping[str, str]) -> list[str]:
    # --set-string: values such as "true" or comma lists stay strings, as
    # environment variables must be; commas inside a value are escaped.
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-string", f"{key}={value.replace(',', chr(92) + ',')}"]
    return out


def trusted_accounts_value(namespace: str, names: Sequence[str] = ZTUNNEL_ACCOUNTS) -> str:
    """CA_TRUSTED_NODE_ACCOUNTS listing the given ztunnel ServiceAccounts."""
    return ",".join(f"{namespace}/{name}" for name in names)


def istiod_values(
    namespace: str, *, trust_windows: bool = True, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Chart values of the istiod release a local cluster gets (besides the profile)."""
    values: dict[str, str] = {}
    if trust_windows:
        values["env.CA_TRUSTED_NODE_ACCOUNTS"] = trusted_accounts_value(namespace)
    values.update(extra or {})
    return values


def render_istiod_chart(
    bin_dir: Path, namespace: str = ISTIO_NAMESPACE, values: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Upstream's istiod chart as ``helm template --set profile=ambient`` renders it."""
    done = helm(
        bin_dir,
        "template",
        ISTIOD_RELEASE,
        str(_chart("istio-discovery")),
        "--namespace",
        namespace,
        "--set",
        "profile=ambient",
        *_set_flags(values or {}),
    )
    if done.returncode != 0:
        raise ClusterError(f"helm template istiod failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def cluster_dns_service() -> dict[str, Any]:
    """The cluster DNS Service every real cluster has (CoreDNS is not Istio's to ship)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns"},
        },
        "spec": {
            "selector": {"k8s-app": "kube-dns"},
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        },
    }


# The objects of the istiod chart the operator reads or that they need; the
# rest (webhooks, RBAC, GatewayClass config) matter only to a running istiod.
_FACT_KINDS = frozenset({"ServiceAccount", "ConfigMap", "Service", "Deployment"})


def install_istiod_objects(
    api_client: Any,
    bin_dir: Path,
    namespace: str = ISTIO_NAMESPACE,
    values: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Apply the istiod chart's Service, Deployment, ServiceAccount and ConfigMaps.

    For clusters whose tests need to know istiod is there but not what it
    does: no webhook is registered, so nothing depends on a running istiod.
    Returns the applied objects. Idempotent (server-side apply).
    """
    rendered = render_istiod_chart(bin_dir, namespace, istiod_values(namespace, extra=values))
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        cluster_dns_service(),
        *(obj for obj in rendered if obj.get("kind") in _FACT_KINDS),
    ]
    apply_objects(api_client, objects, field_manager="helm-template-istiod")
    return objects


@dataclass(frozen=True)
class IstiodPorts:
    """Loopback ports of one istiod process."""

    http: int
    https: int
    grpc: int
    secure_grpc: int
    monitoring: int
    ctrlz: int

    @classmethod
    def allocate(cls) -> IstiodPorts:
        """Six currently free, distinct loopback ports."""
        return cls(*free_ports(6))


def _env_value(entry: Mapping[str, Any], namespace: str) -> str | None:
    """A container env entry's value as the kubelet would give it to this pod."""
    if "value" in entry:
        return str(entry["value"])
    source = entry.get("valueFrom") or {}
    field = (source.get("fieldRef") or {}).get("fieldPath")
    pod_fields = {
        "metadata.name": _POD_NAME,
        "metadata.namespace": namespace,
        "spec.serviceAccountName": _SERVICE_ACCOUNT,
        "status.podIP": LOOPBACK,
        "status.hostIP": LOOPBACK,
        "spec.nodeName": "localhost",
    }
    if field in pod_fields:
        return pod_fields[field]
    # resourceFieldRef (GOMEMLIMIT, GOMAXPROCS): the chart sets no limits, so
    # the kubelet would pass the node's capacity; leaving them unset does the same.
    return None


class IstioControlPlane:
    """Upstream's base and istiod charts installed, and istiod running on loopback."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        bin_dir: Path,
        *,
        namespace: str = ISTIO_NAMESPACE,
        values: Mapping[str, str] | None = None,
        revision: str | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        # A revision installs the istiod chart alone as `istiod-<revision>`
        # (--set revision=...), beside the default's base and istiod.
        self.revision = revision
        self.release = f"{ISTIOD_RELEASE}-{revision}" if revision else ISTIOD_RELEASE
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.namespace = namespace
        self.values = dict(values or {})
        # istiod's serving certificate comes from a CA of its own; the charts'
        # caBundle values tell the API server to trust it for the webhooks.
        self.ca_dir = workdir / "ca"
        self.ports = IstiodPorts.allocate()
        self._process: ManagedProcess | None = None

    # -- install ---------------------------------------------------------------
    def _webhook_cert(self) -> tuple[Path, Path, Path]:
        ca_file = self.ca_dir / "ca.crt"
        cert, key = self.workdir / "certs" / "istiod.crt", self.workdir / "certs" / "istiod.key"
        if cert.exists() and key.exists():
            return ca_file, cert, key
        ca = (
            CertificateAuthority.load(self.ca_dir)
            if ca_file.exists()
            else CertificateAuthority.create(self.ca_dir, "istiod-local-ca")
        )
        host = f"{self.release}.{self.namespace}.svc"
        pair = ca.issue(
            self.workdir / "certs",
            "istiod",
            host,
            server=True,
            dns_names=(host, self.release, "localhost"),
            ip_addresses=(LOOPBACK,),
        )
        return ca.cert_file, pair.cert_file, pair.key_file

    def chart_values(self, *, trust_windows: bool = True) -> dict[str, str]:
        """Every value of the istiod release besides the profile."""
        ca_file, _, _ = self._webhook_cert()
        bundle = base64.b64encode(ca_file.read_bytes()).decode()
        webhook = f"https://{LOOPBACK}:{self.ports.https}"
        return istiod_values(
            self.namespace,
            trust_windows=trust_windows,
            extra={
                "istiodRemote.injectionURL": f"{webhook}/inject",
                "istiodRemote.injectionCABundle": bundle,
                "base.validationURL": f"{webhook}/validate",
                "base.validationCABundle": bundle,
                **({"revision": self.revision} if self.revision else {}),
                **self.values,
            },
        )

    def install(self, *, trust_windows: bool = True) -> None:
        """``helm upgrade --install`` of base, then istiod, with ``profile=ambient``.

        Run again to upgrade; ``trust_windows=False`` leaves istiod's
        CA_TRUSTED_NODE_ACCOUNTS at the chart's default, as a user who never
        heard of our Windows ztunnels would.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        values = self.chart_values(trust_windows=trust_windows)
        releases = [
            (BASE_RELEASE, "base", {"base.validationURL": values["base.validationURL"]}),
            (self.release, "istio-discovery", values),
        ]
        for release, chart, extra in releases[1:] if self.revision else releases:
            done = helm(
                self.bin_dir,
                "upgrade",
                "--install",
                release,
                str(_chart(chart)),
                "--namespace",
                self.namespace,
                "--create-namespace",
                "--set",
                "profile=ambient",
                *_set_flags(extra),
                kubeconfig=self.kubeconfig,
            )
            if done.returncode != 0:
                raise ClusterError(f"helm install {release} failed: {done.stderr.strip()}")

    # -- the process -----------------------------------------------------------
    def _deployment_container(self) -> dict[str, Any]:
        with api_client_for(self.kubeconfig) as api:
            dep = k8s_client.AppsV1Api(api).read_namespaced_deployment(self.release, self.namespace)
            raw: dict[str, Any] = api.sanitize_for_serialization(dep)
        containers = raw["spec"]["template"]["spec"]["containers"]
        return next(c for c in containers if c["name"] == "discovery")

    def command(self) -> tuple[list[str], dict[str, str]]:
        """argv and environment of istiod: the Deployment's, bound to loopback ports."""
        container = self._deployment_container()
        env = {
            name: value
            for entry in container.get("env") or []
            if (name := str(entry["name"]))
            and (value := _env_value(entry, self.namespace)) is not None
        }
        _, cert, key = self._webhook_cert()
        ca_file = self.ca_dir / "ca.crt"
        ports = self.ports
        argv = [
            str(self.bin_dir / "pilot-discovery"),
            *(container.get("args") or []),
            # pflag keeps the last value of a flag: these override the chart's.
            f"--kubeconfig={self.kubeconfig}",
            f"--httpAddr={LOOPBACK}:{ports.http}",
            f"--httpsAddr={LOOPBACK}:{ports.https}",
            f"--grpcAddr={LOOPBACK}:{ports.grpc}",
            f"--secureGRPCAddr={LOOPBACK}:{ports.secure_grpc}",
            f"--monitoringAddr={LOOPBACK}:{ports.monitoring}",
            f"--ctrlz_port={ports.ctrlz}",
            f"--tlsCertFile={cert}",
            f"--tlsKeyFile={key}",
            f"--caCertFile={ca_file}",
        ]
        env["KUBECONFIG"] = str(self.kubeconfig)
        for inherited in ("PATH", "HOME", "TMPDIR"):
            if inherited in os.environ:
                env[inherited] = os.environ[inherited]
        return argv, env

    def start(self, timeout: float = 120.0) -> None:
        """Run istiod and wait until it reports ready."""
        if self.running():
            raise ClusterError("istiod is already running")
        binary = self.bin_dir / "pilot-discovery"
        if not binary.exists():
            raise ClusterError(f"{binary} missing; run hack/build-binaries.sh")
        argv, env = self.command()
        # istiod keeps relative paths (mesh files it looks for, DNS certs) under its cwd.
        cwd = self.workdir / "root"
        cwd.mkdir(parents=True, exist_ok=True)
        self._process = ManagedProcess(
            "istiod", argv, self.workdir / "istiod.log", cwd=cwd, env=env
        )
        self._process.start()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self._process.running():
                raise ClusterError(f"istiod exited:\n{self._process.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"istiod not ready after {timeout}s:\n{self._process.log_tail()}"
                )
            time.sleep(0.2)

    def ready(self) -> bool:
        """Whether istiod answers its readiness endpoint."""
        try:
            with urllib.request.urlopen(
                f"http://{LOOPBACK}:{self.ports.http}/ready", timeout=2
            ) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        """Whether the istiod process is alive."""
        return self._process is not None and self._process.running()

    def stop(self) -> None:
        """Stop istiod (the charts' objects stay)."""
        if self._process is not None:
            self._process.stop()
            self._process = None

    def log_tail(self, lines: int = 60) -> str:
        """Last lines of istiod's log."""
        return self._process.log_tail(lines) if self._process else ""

    @property
    def log_file(self) -> Path:
        """istiod's log."""
        return self.workdir / "istiod.log"

    # -- what istiod thinks ----------------------------------------------------
    def debug(self, path: str, timeout: float = 10.0) -> Any:
        """A debug endpoint of istiod's monitoring port, parsed from JSON (``/debug/ambientz``)."""
        url = f"http://{LOOPBACK}:{self.ports.monitoring}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read().decode())

    def __enter__(self) -> IstioControlPlane:
        self.install()
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
