"""The one harness the tests, the benchmarks and the demo drive the operator with.

- :class:`OperatorProcess`: ``ambient-operator run`` as a subprocess of its
  own user (so the API server's audit log tells its requests apart), logging
  to a file, with its ``/metrics`` page at hand, stopped and started again at
  will.
- :func:`wait_for`: poll a predicate until a deadline (never a fixed sleep
  standing in for a wait).
- :class:`AuditLog`: the API server's audit log, read between byte offsets.
- The AmbientMesh ``default`` (create, read, replace its spec, its
  conditions), namespaces whose ``default`` ServiceAccount exists, and the
  Windows node and pod bodies several of them need.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_operator.api import constants as c

from .launcher import LOOPBACK, LocalCluster, free_ports, repo_root
from .process import tail

T = TypeVar("T")

REPO_ROOT = repo_root()
CRDS_DIR = REPO_ROOT / "crds"
SAMPLES_DIR = REPO_ROOT / "operator" / "ambient_operator" / "samples"
SAMPLE_NODES = SAMPLES_DIR / "nodes-mixed.yaml"
OPERATOR_USER = "ambient-operator"
OPERATOR_GROUPS = ("system:masters",)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def gateway_api_dir(version: str = "v1.6") -> Path:
    """The Gateway API CRDs of `version` that hack/build-binaries.sh fetched."""
    return REPO_ROOT / ".cache" / "gateway-api" / version


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    return free_ports(1)[0]


# -- waiting -------------------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    message: str = "condition",
    interval: float = 0.2,
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that.

    Exceptions from the predicate count as "not yet" (an object may not exist
    yet); the last one is chained to the ``TimeoutError`` raised at the
    deadline.
    """
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
        except Exception as exc:  # retried until the deadline
            last_exc = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}") from last_exc
        time.sleep(interval)


# -- the operator process ------------------------------------------------------------------


def webhook_args(port: int, tls_namespace: str, url: str | None = None) -> list[str]:
    """`run` flags serving the webhook on loopback `port`, its TLS Secret in `tls_namespace`.

    The API server calls `url` (default: that same port).
    """
    return [
        "--webhook-url",
        url or f"https://{LOOPBACK}:{port}",
        "--webhook-listen-address",
        LOOPBACK,
        "--webhook-port",
        str(port),
        "--webhook-namespace",
        tls_namespace,
    ]


def parse_metrics(text: str) -> dict[str, float]:
    """A Prometheus text page as {'name{labels}': value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def metric_total(samples: Mapping[str, float], name: str, labels: Mapping[str, str]) -> float:
    """Sum of the samples of metric `name` whose labels include `labels`."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


class OperatorProcess:
    """``ambient-operator run`` as a subprocess, with its log and metrics at hand.

    It logs to `workdir`/`log_name`, appending across restarts.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path,
        extra_args: Sequence[str] = (),
        *,
        log_name: str = "operator.log",
        user: str = OPERATOR_USER,
        groups: Sequence[str] = OPERATOR_GROUPS,
        kubeconfig: Path | None = None,
        health_port: int | None = None,
        log_level: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`health_port` None is a free port of its own; `log_level` None is the default.

        `env` is added to this process's environment for every start.
        """
        self.cluster = cluster
        self.workdir = workdir
        self.log_path = workdir / log_name
        self.extra_args = list(extra_args)
        self.kubeconfig = kubeconfig or cluster.user_kubeconfig(user, list(groups))
        self.metrics_port = free_port()
        self.health_port = free_port() if health_port is None else health_port
        self.log_level = log_level
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at = 0.0

    def command(self, extra_args: Sequence[str] = ()) -> list[str]:
        """The command line of one start."""
        level = ["--log-level", self.log_level] if self.log_level else []
        return [
            sys.executable, "-m", "ambient_operator.cli.main", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            *level, *self.extra_args, *extra_args,
        ]  # fmt: skip

    def start(self, extra_args: Sequence[str] = ()) -> None:
        """Start the process (again), appending to its log; `extra_args` for this start only.

        `started_at` is the monotonic time of the spawn.
        """
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                self.command(extra_args),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Send `sig`, and SIGKILL if it still runs after `timeout` s; return once it is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    @contextlib.contextmanager
    def running(self) -> Iterator[Self]:
        """Start, yield, stop."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def metrics(self) -> dict[str, float]:
        """The /metrics page as {'name{labels}': value}; OSError when it cannot be read."""
        url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text: str = resp.read().decode()
        return parse_metrics(text)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        return metric_total(self.metrics(), name, labels)

    def log_text(self) -> str:
        """Everything the operator printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of its log."""
        return tail(self.log_path, lines)


# -- the audit log -------------------------------------------------------------------------


def is_write(event: Mapping[str, Any]) -> bool:
    """Whether an audit event is a write request."""
    return event.get("verb") in WRITE_VERBS


class AuditLog:
    """The API server's audit log (JSON lines), read from byte offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """An offset: later reads see only requests logged after it."""
        return self.path.stat().st_size if self.path.exists() else 0

    def events(
        self, since: int = 0, until: int | None = None, *, user: str = OPERATOR_USER
    ) -> list[dict[str, Any]]:
        """Completed requests of `user` logged between the marks `since` and `until`."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(since)
            data = fh.read(-1 if until is None else max(0, until - since))
        out = []
        for line in data.decode(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written right now
            if (
                event.get("stage") == "ResponseComplete"
                and (event.get("user") or {}).get("username") == user
            ):
                out.append(event)
        return out

    def writes(self, since: int = 0, *, user: str = OPERATOR_USER) -> list[str]:
        """'verb uri' of each write request `user` made after `since`."""
        return [
            f"{e['verb']} {e.get('requestURI')}"
            for e in self.events(since, user=user)
            if is_write(e)
        ]


# -- the AmbientMesh -----------------------------------------------------------------------


def _custom(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def mesh_body(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The AmbientMesh `default`; without a spec when `spec` is None."""
    body: dict[str, Any] = {
        "apiVersion": f"{c.API_GROUP}/{c.API_VERSION}",
        "kind": c.KIND,
        "metadata": {"name": c.MESH_NAME},
    }
    if spec is not None:
        body["spec"] = dict(spec)
    return body


def create_mesh(api: client.ApiClient, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Create the AmbientMesh `default` (see :func:`mesh_body`); the stored object."""
    obj: dict[str, Any] = _custom(api).create_cluster_custom_object(
        c.API_GROUP, c.API_VERSION, c.PLURAL, mesh_body(spec)
    )
    return obj


def get_mesh(api: client.ApiClient) -> dict[str, Any]:
    """The AmbientMesh `default` as a dict."""
    obj: dict[str, Any] = _custom(api).get_cluster_custom_object(
        c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME
    )
    return obj


def read_mesh(api: client.ApiClient) -> dict[str, Any] | None:
    """The AmbientMesh `default`, or None when there is none."""
    try:
        return get_mesh(api)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def set_mesh_spec(api: client.ApiClient, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Replace the whole spec of the AmbientMesh `default`; the stored object."""
    obj: dict[str, Any] = _custom(api).patch_cluster_custom_object(
        c.API_GROUP,
        c.API_VERSION,
        c.PLURAL,
        c.MESH_NAME,
        [{"op": "replace", "path": "/spec", "value": dict(spec)}],
        # Without it the client sends the list as a merge patch: 400.
        _content_type="application/json-patch+json",
    )
    return obj


def delete_mesh(api: client.ApiClient, timeout: float = 180) -> None:
    """Delete the AmbientMesh `default`, if there is one, and wait until it is
    gone with everything it owned.

    In the foreground, so the name stays taken until the garbage collector has
    deleted the mesh's objects. A mesh made again at once would otherwise race
    kube-controller-manager: when its watch of AmbientMeshes is re-listing at
    that moment (after an API server restart), the list shows `default` with a
    new uid, which its garbage collector takes for an update of the old mesh.
    The old mesh's objects are then never collected, and the new mesh finds
    them controlled by its namesake (seen in CI after tests/test_chaos_compaction.py).
    """
    try:
        _custom(api).delete_cluster_custom_object(
            c.API_GROUP,
            c.API_VERSION,
            c.PLURAL,
            c.MESH_NAME,
            body=client.V1DeleteOptions(propagation_policy="Foreground"),
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        return
    wait_for(lambda: read_mesh(api) is None, timeout, "the AmbientMesh and its objects deleted")


@contextlib.contextmanager
def borrowed_mesh(
    api: client.ApiClient,
    spec_for: Callable[[dict[str, Any] | None], Mapping[str, Any] | None],
) -> Iterator[dict[str, Any]]:
    """The shared AmbientMesh `default` with the spec `spec_for(original)` while in use.

    `original` is the mesh as found (None when there is none: then it is
    created, without a spec when `spec_for` says None). Yields the stored
    object; afterwards the original spec is put back, or the mesh deleted
    when there was none.
    """
    original = read_mesh(api)
    spec = spec_for(original)
    stored = create_mesh(api, spec) if original is None else set_mesh_spec(api, spec or {})
    try:
        yield stored
    finally:
        if original is None:
            delete_mesh(api)
        else:
            set_mesh_spec(api, original.get("spec") or {})


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """One status condition of an object ({} when absent)."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def current(obj: Mapping[str, Any], kind: str, status: str = "True") -> bool:
    """The condition has `status` for the object's current generation."""
    cond = condition(obj, kind)
    return cond.get("status") == status and cond.get("observedGeneration") == obj["metadata"].get(
        "generation"
    )


# -- namespaces, nodes, pods ---------------------------------------------------------------


def create_namespace(
    api: client.ApiClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create a namespace and wait until its `default` ServiceAccount exists.

    The API server rejects pods until the serviceaccount controller made it.
    """
    core = client.CoreV1Api(api)
    meta = client.V1ObjectMeta(name=name, labels=dict(labels) if labels else None)
    core.create_namespace(client.V1Namespace(metadata=meta))
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout,
        f"ServiceAccount default in {name}",
    )
    return name


def windows_node(name: str, build: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A tainted Windows Node of `build` (for `create_nodes` or `to_kwok_node`)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                c.LABEL_OS: "windows",
                c.LABEL_ARCH: "amd64",
                c.LABEL_WINDOWS_BUILD: build,
                **(labels or {}),
            },
        },
        "spec": {"taints": [{"key": "os", "value": "windows", "effect": "NoSchedule"}]},
        "status": {
            "nodeInfo": {
                "operatingSystem": "windows",
                "architecture": "amd64",
                "kernelVersion": f"{build}.2314",
                "osImage": f"{c.WINDOWS_BUILD_NAMES.get(build, 'Windows Server')} Datacenter",
            }
        },
    }


def ws2025_node(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A tainted Windows Server 2025 Node (for `create_nodes` or `to_kwok_node`)."""
    return windows_node(name, c.BUILD_WS2025, labels)


def ws2022_pod(name: str) -> dict[str, Any]:
    """A pod pinned to WS2022 nodes: the redirection-wait webhook's case."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022},
            "tolerations": [{"key": "os", "operator": "Exists"}],
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        },
    }
