"""Chaos (issue 8): the operator is killed, the control plane restarts under it, two
replicas race, and random input reaches it through the real API server.

- SIGKILL at random points of large reconciles, 20 times: each restart converges
  to exactly what render asks for, with no duplicate, orphaned or stale object.
- kube-apiserver, and etcd, restarted mid-run: the same process reconnects and
  reconciles what changed meanwhile and afterwards.
- Two replicas with leader election: one acts; SIGKILL it and the other takes over
  within the lease time plus one renew period, and reconciles.
- Fuzzing (hypothesis): AmbientMesh specs, Gateways, namespace labels and Node
  shapes are either rejected by the API server or handled (a status reason, an
  Event); the operator never dies and never logs a traceback.

A webhook outage (pods still admitted, misses reported afterwards) is covered by
tests/test_webhook.py::test_outage_admits_pods_and_reports_the_miss.

Every test runs its own operator process. The AmbientMesh `default` is shared
with the other modules: created here when absent, and its spec put back after.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_operator import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply import Owner, key_of, prepare, up_to_date
from ambient_operator.devcluster import (
    LocalCluster,
    create_nodes,
    delete_nodes,
    install_istiod_objects,
)
from ambient_operator.enrollment import namespace_problems
from ambient_operator.facts import ClusterFacts, NodeFacts
from ambient_operator.kube.client import Kube, load_api_client
from ambient_operator.kube.resources import KINDS
from ambient_operator.render import render_dataplane
from ambient_operator.runner import OWNED_API_KINDS
from conftest import BIN_DIR, unique_name, wait_for
from operator_harness import AuditLog, RunningOperator

GROUP, VERSION, PLURAL = c.API_GROUP, c.API_VERSION, c.PLURAL
GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
AGENTS_NS = "istio-system"
SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},ambientoperator.io/controller=dataplane"
CONVERGE_TIMEOUT = 120.0


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def istio_env(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> None:
    """istiod's objects as upstream's chart renders them, and a cluster DNS Service."""
    install_istiod_objects(k8s, BIN_DIR, AGENTS_NS)


def _custom(k8s: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


def _mesh(k8s: client.ApiClient) -> dict[str, Any]:
    obj: dict[str, Any] = _custom(k8s).get_cluster_custom_object(GROUP, VERSION, PLURAL, "default")
    return obj


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _set_spec(k8s: client.ApiClient, spec: dict[str, Any]) -> dict[str, Any]:
    """Replace the whole spec; returns the stored object."""
    obj: dict[str, Any] = _custom(k8s).patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "default",
        [{"op": "replace", "path": "/spec", "value": spec}],
        _content_type="application/json-patch+json",
    )
    return obj


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, istio_env: None) -> Iterator[None]:
    """The shared AmbientMesh with every default; its spec (or absence) restored afterwards."""
    custom = _custom(k8s)
    try:
        original: dict[str, Any] | None = _mesh(k8s)
    except ApiException as exc:
        if exc.status != 404:
            raise
        original = None
    if original is None:
        custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": c.KIND, "metadata": {"name": "default"}},
        )
    else:
        _set_spec(k8s, {})
    yield
    if original is None:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "default")
    else:
        _set_spec(k8s, original.get("spec") or {})


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    """The operator's own REST client, as admin: lists come back as plain dicts."""
    return Kube(load_api_client(str(cluster.kubeconfig)))


@pytest.fixture(scope="module")
def audit(cluster: LocalCluster) -> AuditLog:
    """The API server's audit log."""
    return AuditLog(cluster.audit_log)


@pytest.fixture
def operator(cluster: LocalCluster, mesh: None, tmp_path: Path) -> Iterator[RunningOperator]:
    """A fresh operator process for one test; its log must stay free of tracebacks."""
    op = RunningOperator(cluster, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()
    assert "Traceback" not in op.log_text(), op.log_text()[-6000:]


# -- what converged means -------------------------------------------------------------------


def _kube_version(k8s: client.ApiClient) -> str:
    info = client.VersionApi(k8s).get_code()
    minor = str(info.minor).rstrip("+")
    return f"{info.major}.{minor}"


def _service_ip(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    try:
        ip = core.read_namespaced_service(name, namespace).spec.cluster_ip
    except ApiException:
        return None
    return ip if ip and ip != "None" else None


def desired_objects(
    k8s: client.ApiClient, spec_json: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[Any, dict[str, Any]]]:
    """The live AmbientMesh and what render asks for now (or for another spec),
    prepared as the operator applies it."""
    core = client.CoreV1Api(k8s)
    mesh = _mesh(k8s)
    spec = AmbientMeshSpec.model_validate(
        mesh.get("spec") or {} if spec_json is None else spec_json
    )
    nodes = sorted(
        (k8s.sanitize_for_serialization(n) for n in core.list_node().items),
        key=lambda n: n["metadata"]["name"],
    )
    facts = ClusterFacts(
        nodes=tuple(NodeFacts.from_node(n) for n in nodes),
        istiod_ip=_service_ip(core, spec.namespace, spec.istiod.service()),
        dns_ip=_service_ip(core, "kube-system", "kube-dns"),
        kube_version=_kube_version(k8s),
    )
    owner = Owner.of(mesh)
    wanted = [prepare(obj, owner, "dataplane") for obj in render_dataplane(spec, facts).objects]
    return mesh, {key_of(obj): obj for obj in wanted}


def live_objects(kube: Kube) -> dict[Any, dict[str, Any]]:
    """Every object carrying the data plane's labels, whatever its kind and namespace."""
    found: dict[Any, dict[str, Any]] = {}
    for api_version, kind in OWNED_API_KINDS:
        for obj in kube.list(KINDS[(api_version, kind)], label_selector=SELECTOR):
            found[key_of(obj)] = obj
    return found


def divergence(k8s: client.ApiClient, kube: Kube) -> list[str]:
    """Everything that differs between the cluster and render's answer ([] = converged)."""
    mesh, wanted = desired_objects(k8s)
    live = live_objects(kube)
    problems = [f"missing {k}" for k in sorted(wanted.keys() - live.keys())]
    problems += [f"orphaned {k}" for k in sorted(live.keys() - wanted.keys())]
    problems += [
        f"stale {k}"
        for k in sorted(wanted.keys() & live.keys())
        if not up_to_date(wanted[k], live[k])
    ]
    uid = mesh["metadata"]["uid"]
    for key, obj in sorted(live.items()):
        refs = obj["metadata"].get("ownerReferences") or []
        controllers = [r for r in refs if r.get("controller")]
        if len(controllers) != 1 or controllers[0].get("uid") != uid or len(refs) != 1:
            problems.append(f"owner references of {key}: {refs}")
    reconciled = _condition(mesh, "Reconciled")
    if reconciled.get("observedGeneration") != mesh["metadata"]["generation"]:
        problems.append(f"status not reconciled for generation {mesh['metadata']['generation']}")
    return problems


def wait_converged(k8s: client.ApiClient, kube: Kube, what: str, op: RunningOperator) -> None:
    """Until the cluster holds exactly what render asks for."""
    last: list[str] = []

    def converged() -> bool:
        nonlocal last
        last = divergence(k8s, kube)
        return not last

    try:
        wait_for(converged, CONVERGE_TIMEOUT, what, interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(
            f"{what}: still diverging: {last[:10]}\noperator log:\n{op.log_text()[-3000:]}"
        ) from exc


# -- SIGKILL mid-reconcile -------------------------------------------------------------------


def _chaos_nodes(pool: str, count: int = 60) -> list[dict[str, Any]]:
    """Kwok nodes: two thirds Linux, the rest WS2022 and WS2025."""
    docs = []
    for i in range(count):
        name = f"{pool}-{i:02d}"
        labels = {c.LABEL_ARCH: "amd64", c.LABEL_HOSTNAME: name, "ambient-test/pool": pool}
        status: dict[str, Any]
        if i % 3:
            labels[c.LABEL_OS] = "linux"
            status = {"nodeInfo": {"operatingSystem": "linux", "kernelVersion": "6.8.0"}}
            taints: list[dict[str, str]] = []
        else:
            build = c.BUILD_WS2022 if i % 2 else c.BUILD_WS2025
            labels |= {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: build}
            status = {"nodeInfo": {"operatingSystem": "windows", "kernelVersion": f"{build}.1"}}
            taints = [{"key": "os", "value": "windows", "effect": "NoSchedule"}]
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": taints},
                "status": status,
            }
        )
    return docs


def _mutations(chaos_ns: str) -> list[tuple[str, Any]]:
    """Spec changes that rewrite many objects at once: (name, function of the spec)."""

    def log_level(spec: dict[str, Any]) -> None:
        spec["logLevel"] = "debug" if spec.get("logLevel", "info") == "info" else "info"

    def tag(spec: dict[str, Any]) -> None:
        images = spec.setdefault("images", {})
        images["tag"] = "1.30.3" if images.get("tag", "1.30.4") == "1.30.4" else "1.30.4"

    def windows(spec: dict[str, Any]) -> None:
        win = spec.setdefault("platforms", {}).setdefault("windows", {})
        win["enabled"] = not win.get("enabled", True)

    def builds(spec: dict[str, Any]) -> None:
        win = spec.setdefault("platforms", {}).setdefault("windows", {})
        if "builds" in win:
            del win["builds"]
        else:
            win["builds"] = [c.BUILD_WS2022]

    def namespace(spec: dict[str, Any]) -> None:
        # Every namespaced object moves: all created anew, all the old ones pruned.
        spec["namespace"] = chaos_ns if spec.get("namespace", AGENTS_NS) == AGENTS_NS else AGENTS_NS

    return [
        ("logLevel", log_level),
        ("images.tag", tag),
        ("windows.enabled", windows),
        ("windows.builds", builds),
        ("namespace", namespace),
    ]


def _planned_writes(k8s: client.ApiClient, spec: dict[str, Any]) -> int:
    """Objects a pass from the current state to `spec` applies or prunes."""
    _, before = desired_objects(k8s)
    _, after = desired_objects(k8s, spec)
    changed = [k for k in after.keys() & before.keys() if after[k] != before[k]]
    return len(changed) + len(after.keys() ^ before.keys())


def _wait_kill_point(
    k8s: client.ApiClient, audit: AuditLog, mark: int, writes: int, generation: int, round_: int
) -> None:
    """Until the operator made `writes` writes since `mark`, or finished the pass."""
    polled = 0.0

    def reached() -> bool:
        nonlocal polled
        if len(audit.writes(mark)) >= writes:
            return True
        if time.monotonic() - polled < 0.25:  # the audit log often, the API rarely
            return False
        polled = time.monotonic()
        return _condition(_mesh(k8s), "Reconciled").get("observedGeneration") == generation

    wait_for(reached, 60, f"write {writes} of round {round_}", interval=0.01)


def test_sigkill_mid_reconcile_converges_to_the_same_state(
    k8s: client.ApiClient,
    kube: Kube,
    audit: AuditLog,
    operator: RunningOperator,
) -> None:
    core = client.CoreV1Api(k8s)
    pool = unique_name("chaos")
    chaos_ns = unique_name("chaos-agents")
    core.create_namespace({"metadata": {"name": chaos_ns}})
    names = create_nodes(k8s, _chaos_nodes(pool), timeout=180)
    rng = random.Random(20260808)
    spec: dict[str, Any] = {}
    history: list[str] = []
    try:
        wait_converged(k8s, kube, "first convergence on the extra nodes", operator)
        for round_ in range(20):
            name, mutate = rng.choice(_mutations(chaos_ns))
            mutate(spec)
            # Kill after a random one of the writes the pass will make (objects
            # applied or pruned, then the status), or once it is over.
            kill_after = rng.randint(1, max(1, _planned_writes(k8s, spec)))
            mark = audit.mark()
            generation = _set_spec(k8s, copy.deepcopy(spec))["metadata"]["generation"]

            _wait_kill_point(k8s, audit, mark, kill_after, generation, round_)
            operator.stop(signal.SIGKILL)
            made = len(audit.writes(mark))
            done = _condition(_mesh(k8s), "Reconciled").get("observedGeneration") == generation
            history.append(
                f"round {round_}: {name}, killed after {made} writes (aimed {kill_after}), "
                + ("after the pass" if done else "mid-pass" if made else "before the pass")
            )
            operator.start()
            wait_converged(k8s, kube, f"after {history[-1]}", operator)
            assert operator.alive(), operator.log_text()[-3000:]
        # Most kills landed inside a pass, between two of its writes.
        assert sum(1 for h in history if h.endswith("mid-pass")) >= 6, "\n".join(history)
    finally:
        _set_spec(k8s, {})
        delete_nodes(k8s, names, wait=False)
        with contextlib.suppress(ApiException):
            core.delete_namespace(chaos_ns)
    wait_converged(k8s, kube, "back to the defaults", operator)


# -- the control plane restarts ----------------------------------------------------------------


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_operator_survives_a_control_plane_restart(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Kube,
    operator: RunningOperator,
    component: str,
) -> None:
    wait_converged(k8s, kube, "converged before the restart", operator)
    assert operator.proc is not None
    pid = operator.proc.pid
    _set_spec(k8s, {"logLevel": "debug"})  # a change in flight when the server goes
    cluster.restart(component, graceful=False)
    wait_converged(k8s, kube, f"the change made just before {component} restarted", operator)
    _set_spec(k8s, {"logLevel": "warn"})
    wait_converged(k8s, kube, f"a change made after {component} restarted", operator)
    assert operator.alive() and operator.proc is not None and operator.proc.pid == pid
    _set_spec(k8s, {})
    wait_converged(k8s, kube, "back to the defaults", operator)


# -- two replicas -------------------------------------------------------------------------------


def _lease_holder(k8s: client.ApiClient) -> str:
    lease = client.CoordinationV1Api(k8s).read_namespaced_lease("ambient-operator", AGENTS_NS)
    return str(lease.spec.holder_identity or "")


def _identity(op: RunningOperator) -> str:
    """The identity a replica logged when it started leading ('' if it never did)."""
    for line in op.log_text().splitlines():
        if "leader election: now leading as " in line:
            return line.rsplit("now leading as ", 1)[1].strip()
    return ""


def _acting(audit: AuditLog, since: int, user: str) -> list[str]:
    return [w for w in audit.writes(since, user=user) if "/leases/" not in w]


def test_two_replicas_one_leader_and_a_fast_takeover(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Kube,
    audit: AuditLog,
    mesh: None,
    tmp_path: Path,
) -> None:
    with contextlib.suppress(ApiException):  # a lease left by another module's operator
        client.CoordinationV1Api(k8s).delete_namespaced_lease("ambient-operator", AGENTS_NS)
    lease_seconds = 5.0
    replicas = {
        user: RunningOperator(
            cluster,
            tmp_path / user,
            extra_args=["--leader-election", "--lease-seconds", str(lease_seconds)],
            kubeconfig=cluster.user_kubeconfig(user, ["system:masters"]),
        )
        for user in ("ambient-operator-a", "ambient-operator-b")
    }
    start = audit.mark()
    for user, op in replicas.items():
        (tmp_path / user).mkdir()
        op.start()
    try:
        leader_user = wait_for(
            lambda: next((u for u, op in replicas.items() if _identity(op)), None),
            60,
            "a replica to lead",
        )
        standby_user = next(u for u in replicas if u != leader_user)
        leader, standby = replicas[leader_user], replicas[standby_user]
        assert _lease_holder(k8s) == _identity(leader)

        # One acts: a change is reconciled, and only the leader wrote anything.
        mark = audit.mark()
        _set_spec(k8s, {"logLevel": "debug"})
        wait_converged(k8s, kube, "the leader reconciles a change", leader)
        assert audit.writes(mark, user=leader_user)
        # The standby never wrote anything but (failed) attempts on the Lease.
        assert _acting(audit, start, standby_user) == []
        assert not _identity(standby)

        # SIGKILL the leader: the standby takes over within the lease time plus a
        # renew period (the standby retries every lease/3).
        killed = time.monotonic()
        leader.stop(signal.SIGKILL)
        wait_for(
            lambda: _lease_holder(k8s) not in ("", _identity(leader)),
            lease_seconds * 3,
            "the standby to take the lease",
            interval=0.05,
        )
        took = time.monotonic() - killed
        assert took <= lease_seconds + lease_seconds / 3 + 1.0, f"takeover after {took:.1f}s"
        assert _lease_holder(k8s) == wait_for(lambda: _identity(standby), 10, "its log line")

        mark = audit.mark()
        _set_spec(k8s, {"logLevel": "warn"})
        wait_converged(k8s, kube, "the new leader reconciles a change", standby)
        assert _acting(audit, mark, standby_user)
        assert standby.alive()
        _set_spec(k8s, {})
        wait_converged(k8s, kube, "back to the defaults", standby)
    finally:
        for op in replicas.values():
            op.stop()
    for op in replicas.values():
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


# -- fuzzing --------------------------------------------------------------------------------------

LABEL_VALUE = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?\Z").filter(
    lambda v: ".." not in v
)
ODD_TEXT = st.text(alphabet=st.characters(codec="ascii"), max_size=12)

MESH_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "logLevel": st.sampled_from(["info", "debug", "trace", "bogus", ""]),
        "namespace": st.sampled_from([AGENTS_NS, "no-such-ns", "Bad_NS", AGENTS_NS]),
        "images": st.fixed_dictionaries(
            {}, optional={"tag": st.sampled_from(["1.30.4", "1.31.0-dev", "bad tag", ""]),
                          "hub": st.sampled_from(["docker.io/istio", "", "http://x"])},
        ),
        "platforms": st.fixed_dictionaries(
            {},
            optional={
                "linux": st.fixed_dictionaries({}, optional={"enabled": st.booleans()}),
                "windows": st.fixed_dictionaries(
                    {},
                    optional={
                        "enabled": st.booleans(),
                        "builds": st.lists(
                            st.sampled_from([c.BUILD_WS2022, c.BUILD_WS2025, c.BUILD_WS2019, "x"]),
                            max_size=3,
                        ),
                        "nodeSelector": st.dictionaries(
                            st.sampled_from(["pool", "zone", "a/b"]), LABEL_VALUE, max_size=2
                        ),
                    },
                ),
            },
        ),
        "ztunnel": st.fixed_dictionaries(
            {},
            optional={
                "rollout": st.fixed_dictionaries(
                    {},
                    optional={
                        "maxUnavailable": st.one_of(st.integers(-1, 3), st.just("10%")),
                        "maxSurge": st.one_of(st.integers(-1, 3), st.just("0%")),
                    },
                ),
                "terminationGracePeriodSeconds": st.integers(-5, 5000),
            },
        ),
        "newPodWorkaround": st.fixed_dictionaries(
            {}, optional={"timeoutSeconds": st.integers(-1, 4000), "enabled": st.booleans()}
        ),
        "istiod": st.fixed_dictionaries(
            {}, optional={"address": st.sampled_from(["istiod.x:15012", "nope", "a:99999"])}
        ),
        "unknownField": ODD_TEXT,
    },
)  # fmt: skip

GATEWAYS = st.fixed_dictionaries(
    {
        "listeners": st.lists(
            st.fixed_dictionaries(
                {
                    "port": st.sampled_from([15008, 15008, 80, 0, 70000]),
                    "protocol": st.sampled_from(["HBONE", "HTTP", "TCP", "hbone", "X/Y"]),
                }
            ),
            min_size=0,
            max_size=3,
        ),
        "annotations": st.dictionaries(
            st.sampled_from(
                [c.ANNOTATION_GATEWAY_NAME_OVERRIDE, c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT]
            ),
            st.one_of(LABEL_VALUE, ODD_TEXT),
            max_size=2,
        ),
        "labels": st.dictionaries(
            st.sampled_from([c.LABEL_WAYPOINT_FOR, "app"]),
            st.sampled_from(["service", "workload", "all", "none", "bogus"]),
            max_size=2,
        ),
    }
)

NAMESPACE_LABELS = st.dictionaries(
    st.sampled_from(
        [
            c.LABEL_DATAPLANE_MODE,
            c.LABEL_USE_WAYPOINT,
            "istio-injection",
            "istio.io/rev",
        ]
    ),
    st.one_of(st.sampled_from(["ambient", "none", "enabled", "waypoint"]), LABEL_VALUE),
    max_size=4,
)

NODE_SHAPES = st.fixed_dictionaries(
    {
        "os": st.sampled_from(["linux", "windows", "plan9", ""]),
        "arch": st.sampled_from(["amd64", "arm64", "s390x", ""]),
        "build": st.sampled_from(
            [None, c.BUILD_WS2019, c.BUILD_WS2022, c.BUILD_WS2025, "10.0.99999", "11"]
        ),
        "kernel": st.one_of(
            st.sampled_from(["10.0.20348.2762", "10.0.26100.1", "6.8.0", "", "10.0.17763"]),
            ODD_TEXT,
        ),
        "taint": st.booleans(),
    }
)


def _api_rejects(exc: ApiException) -> bool:
    return exc.status in (400, 422)


def _node_body(name: str, shape: dict[str, Any]) -> dict[str, Any]:
    labels: dict[str, str] = {c.LABEL_HOSTNAME: name}
    if shape["os"]:
        labels[c.LABEL_OS] = shape["os"]
    if shape["arch"]:
        labels[c.LABEL_ARCH] = shape["arch"]
    if shape["build"]:
        labels[c.LABEL_WINDOWS_BUILD] = shape["build"]
    info = {key: "" for key in (
        "architecture", "bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion",
        "kubeletVersion", "machineID", "operatingSystem", "osImage", "systemUUID",
    )}  # fmt: skip
    info |= {"kernelVersion": shape["kernel"], "operatingSystem": shape["os"]}
    taints = [{"key": "os", "value": "windows", "effect": "NoSchedule"}] if shape["taint"] else []
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"nodeInfo": info},
    }


@pytest.fixture(scope="module")
def fuzz_namespace(k8s: client.ApiClient, gateway_api_crds: None) -> Iterator[str]:
    """Where the fuzzed Gateways go."""
    core = client.CoreV1Api(k8s)
    name = unique_name("chaos-fuzz")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


def _spec_invalid(k8s: client.ApiClient) -> bool:
    """The operator reports the current spec as one it cannot render."""
    mesh = _mesh(k8s)
    reconciled = _condition(mesh, "Reconciled")
    return reconciled.get("observedGeneration") == mesh["metadata"][
        "generation"
    ] and reconciled.get("reason") in ("InvalidSpec", "RenderFailed")


def test_fuzzed_input_is_rejected_or_handled(
    k8s: client.ApiClient,
    fuzz_namespace: str,
    operator: RunningOperator,
) -> None:
    core, custom = client.CoreV1Api(k8s), client.CustomObjectsApi(k8s)
    counter = iter(range(10_000))
    outcomes: dict[str, int] = {}

    def tally(what: str) -> None:
        outcomes[what] = outcomes.get(what, 0) + 1

    def handled(waits: list[tuple[str, Any]]) -> None:
        for what, check in waits:
            wait_for(check, 60, what)
            assert operator.alive(), operator.log_text()[-4000:]

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(spec=MESH_SPECS, gw=GATEWAYS, ns_labels=NAMESPACE_LABELS, node=NODE_SHAPES)
    def example(
        spec: dict[str, Any], gw: dict[str, Any], ns_labels: dict[str, str], node: dict[str, Any]
    ) -> None:
        n = next(counter)
        waits: list[tuple[str, Any]] = []
        # A Gateway, a namespace and a Node first, under the default spec (put
        # back by the previous example): the operator must answer each.
        listeners = [
            {"name": f"l{i}", "port": x["port"], "protocol": x["protocol"]}
            for i, x in enumerate(gw["listeners"])
        ]
        body = {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "Gateway",
            "metadata": {
                "name": f"fuzz-{n}",
                "annotations": gw["annotations"],
                "labels": gw["labels"],
            },
            "spec": {"gatewayClassName": "ambient-waypoint", "listeners": listeners},
        }
        try:
            created = custom.create_namespaced_custom_object(
                GW_GROUP, GW_VERSION, fuzz_namespace, "gateways", body
            )
        except ApiException as exc:
            assert _api_rejects(exc), exc
            tally("gateway rejected")
        else:
            tally("gateway accepted")

            def judged(name: str = f"fuzz-{n}", g: int = created["metadata"]["generation"]) -> bool:
                live = custom.get_namespaced_custom_object(
                    GW_GROUP, GW_VERSION, fuzz_namespace, "gateways", name
                )
                accepted = _condition(live, "Accepted")
                return bool(accepted.get("reason")) and accepted.get("observedGeneration") == g

            waits.append(("the Gateway's Accepted condition", judged))

        ns_name = f"{fuzz_namespace}-{n}"
        try:
            core.create_namespace({"metadata": {"name": ns_name, "labels": ns_labels}})
        except ApiException as exc:
            assert _api_rejects(exc), exc
            tally("namespace rejected")
        else:
            tally("namespace accepted")
            problems = {reason for reason, _ in namespace_problems(ns_name, ns_labels, {})}

            def told(name: str = ns_name, reasons: set[str] = problems) -> bool:
                events = core.list_namespaced_event(
                    "default",
                    field_selector=f"involvedObject.kind=Namespace,involvedObject.name={name}",
                ).items
                return reasons <= {e.reason for e in events}

            waits.append((f"Events {sorted(problems)} on namespace {ns_name}", told))

        node_name = f"{fuzz_namespace}-node-{n}"
        try:
            core.create_node(_node_body(node_name, node))
        except ApiException as exc:
            assert _api_rejects(exc), exc
            tally("node rejected")
            node_name = ""
        else:
            tally("node accepted")

            def counted() -> bool:
                names = sorted(n.metadata.name for n in core.list_node().items)
                status = _mesh(k8s)["status"]
                # As an exception, so a timeout shows the last values seen.
                assert int(status["nodes"]["total"]) == len(names), (
                    f"status counts {status['nodes']['total']} nodes, the cluster has "
                    f"{len(names)}: {names}; conditions {status.get('conditions')}"
                )
                return True

            waits.append(("the status to count every node", counted))
        try:
            handled(waits)
            # Then the AmbientMesh: rejected, or its status answers for the generation.
            try:
                generation = _set_spec(k8s, spec)["metadata"]["generation"]
            except ApiException as exc:
                assert _api_rejects(exc), exc
                tally("spec rejected")
            else:
                tally("spec accepted")
                if _spec_invalid(k8s):
                    tally("spec invalid for the operator")
                handled(
                    [
                        (
                            "the AmbientMesh status for this generation",
                            lambda g=generation: (
                                _condition(_mesh(k8s), "Reconciled").get("observedGeneration") == g
                            ),
                        )
                    ]
                )
        finally:
            _set_spec(k8s, {})
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns_name)
            if node_name:
                with contextlib.suppress(ApiException):
                    core.delete_node(node_name)

    example()
    assert operator.alive(), operator.log_text()[-4000:]
    print(json.dumps(outcomes))
    # Both outcomes happened for the mesh and the Gateways: the examples probed
    # the API server's validation and the operator's handling alike.
    for what in ("spec", "gateway"):
        assert outcomes.get(f"{what} rejected") and outcomes.get(f"{what} accepted"), outcomes
