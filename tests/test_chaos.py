"""Chaos (issue 8): the operator is killed, the control plane restarts under it, two
replicas race, and random input reaches it through the real API server.

- SIGKILL in the middle of large reconciles, 20 times: a validating webhook
  of the test's own holds the operator's k-th write of the pass until the
  process is dead, so every kill lands between two writes on any machine.
  Each restart converges to what tests/oracle.py says the spec asks for
  (objects, where each DaemonSet lands, images, log levels, owners), with no
  duplicate, orphaned or stale object.
- kube-apiserver, and etcd, restarted mid-run: the same process reconnects and
  reconciles what changed meanwhile and afterwards.
- Two replicas with leader election: one acts; SIGKILL it and the other takes the
  lease at its first attempt after the lease expired (never before), and reconciles.
- Fuzzing (hypothesis, fresh examples each run): AmbientMesh specs, Gateways,
  namespace labels and Node shapes are rejected by the API server exactly when
  the documents say so, and otherwise answered with the reason the oracle
  expects; a namespace that deserves no Event gets none; the operator never dies
  and never logs a traceback. The seed is printed on failure; set
  AMBIENT_FUZZ_SEED (and AMBIENT_CHAOS_SEED for the kills) to replay a run.

A webhook outage (pods still admitted, misses reported afterwards) is covered by
tests/test_webhook.py::test_outage_admits_pods_and_reports_the_miss.

Every test runs its own operator process. The AmbientMesh `default` is shared
with the other modules: created here when absent, and its spec put back after.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, example, given, seed, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import oracle
from ambient_devcluster import (
    LocalCluster,
    api_client_for,
    create_nodes,
    delete_nodes,
    install_istiod_objects,
)
from ambient_devcluster.harness import (
    borrowed_mesh,
    condition,
    get_mesh,
    set_mesh_spec,
)
from ambient_operator.api import constants as c
from ambient_operator.app.options import OWNED_API_KINDS
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.resources import KINDS
from conftest import BIN_DIR, ignoring, unique_name, wait_for
from operator_harness import OPERATOR_USER, AuditLog, RunningOperator
from write_gate import WriteGate

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
AGENTS_NS = "istio-system"
SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},ambientoperator.io/controller=dataplane"
CONVERGE_TIMEOUT = 120.0


def _seed(variable: str) -> int:
    """The run's seed: from the environment to replay a run, else fresh."""
    given_seed = os.environ.get(variable)
    return int(given_seed) if given_seed else int.from_bytes(os.urandom(4), "big")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def istio_env(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> None:
    """istiod's objects as upstream's chart renders them, and a cluster DNS Service."""
    install_istiod_objects(k8s, BIN_DIR, AGENTS_NS)


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, istio_env: None) -> Iterator[None]:
    """The shared AmbientMesh with every default; its spec (or absence) restored afterwards."""
    with borrowed_mesh(k8s, lambda _original: None):
        yield


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Kube:
    """The operator's own REST client, as admin: lists come back as plain dicts."""
    return Kube(load_credentials(str(cluster.kubeconfig)))


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

ObjectKey = tuple[str, str, str]  # kind, namespace, name


def _key(obj: dict[str, Any]) -> ObjectKey:
    meta = obj["metadata"]
    return (str(obj["kind"]), meta.get("namespace") or "", str(meta["name"]))


def live_nodes(k8s: client.ApiClient) -> list[oracle.Node]:
    """Every Node as the oracle judges it."""
    nodes = client.CoreV1Api(k8s).list_node().items
    return [oracle.Node.of(k8s.sanitize_for_serialization(n)) for n in nodes]


def live_objects(kube: Kube) -> dict[ObjectKey, dict[str, Any]]:
    """Every object carrying the data plane's labels, whatever its kind and namespace."""
    found: dict[ObjectKey, dict[str, Any]] = {}
    for api_version, kind in OWNED_API_KINDS:
        for obj in kube.list(KINDS[(api_version, kind)], label_selector=SELECTOR):
            found[_key(obj)] = obj
    return found


def _daemonset_problems(
    name: str, obj: dict[str, Any], spec: dict[str, Any], nodes: list[oracle.Node], want: Any
) -> list[str]:
    """How a live DaemonSet differs from what the spec asks of it."""
    pod = obj["spec"]["template"]["spec"]
    problems = []
    landed = {n.name for n in nodes if oracle.daemon_pod_lands(pod, n)}
    if landed != want:
        problems.append(f"{name} lands on {sorted(landed ^ want)} wrongly")
    tag, level = oracle.image_tag(spec), oracle.log_level(spec)
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    stale = [ct["image"] for ct in containers if not ct["image"].endswith(f":{tag}")]
    if stale:
        problems.append(f"{name} runs {stale}, not tag {tag}")
    if name.startswith("ztunnel"):
        env = [e for ct in containers for e in ct.get("env") or []]
        rust = {e.get("value") for e in env if e["name"] == "RUST_LOG"}
        if rust != {level}:
            problems.append(f"{name} logs at {rust}, not {level}")
    else:
        flag = f"--log_output_level={oracle.cni_log_level(level)}"
        if not any(flag in (ct.get("args") or []) for ct in containers):
            problems.append(f"{name} lacks {flag}")
    return problems


def divergence(k8s: client.ApiClient, kube: Kube) -> list[str]:
    """Everything that differs between the cluster and the oracle's answer ([] = converged)."""
    mesh = get_mesh(k8s)
    spec = mesh.get("spec") or {}
    nodes = live_nodes(k8s)
    wanted = oracle.objects(spec, nodes)
    live = live_objects(kube)
    problems = [f"missing {k}" for k in sorted(wanted - live.keys())]
    problems += [f"orphaned {k}" for k in sorted(live.keys() - wanted)]
    placement = oracle.placement(spec, nodes)
    for key in sorted(wanted & live.keys()):
        if key[0] == "DaemonSet":
            problems += _daemonset_problems(key[2], live[key], spec, nodes, placement[key[2]])
    binding = live.get(("ClusterRoleBinding", "", "istio-cni"))
    if binding is not None:
        # istio-cni's grant is for the agents where they run now, nowhere else.
        subjects = {(s["kind"], s["name"], s.get("namespace")) for s in binding.get("subjects", [])}
        if subjects != {("ServiceAccount", "istio-cni", oracle.agents_namespace(spec))}:
            problems.append(f"istio-cni is granted to {sorted(subjects)}")
    uid = mesh["metadata"]["uid"]
    for key, obj in sorted(live.items()):
        refs = obj["metadata"].get("ownerReferences") or []
        controllers = [r for r in refs if r.get("controller")]
        if len(controllers) != 1 or controllers[0].get("uid") != uid or len(refs) != 1:
            problems.append(f"owner references of {key}: {refs}")
    reconciled = condition(mesh, "Reconciled")
    if reconciled.get("observedGeneration") != mesh["metadata"]["generation"]:
        problems.append(f"status not reconciled for generation {mesh['metadata']['generation']}")
    elif reconciled.get("status") != "True":
        problems.append(f"Reconciled is {reconciled}")
    return problems


def wait_converged(k8s: client.ApiClient, kube: Kube, what: str, op: RunningOperator) -> None:
    """Until the cluster holds exactly what the oracle says the spec asks for."""
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
        images["tag"] = "1.30.3" if images.get("tag", "1.31.0") == "1.31.0" else "1.31.0"

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
        # Every namespaced object moves: all created anew, the old ones pruned
        # once the new agents are Ready.
        spec["namespace"] = chaos_ns if spec.get("namespace", AGENTS_NS) == AGENTS_NS else AGENTS_NS

    return [
        ("logLevel", log_level),
        ("images.tag", tag),
        ("windows.enabled", windows),
        ("windows.builds", builds),
        ("namespace", namespace),
    ]


def _least_writes(
    nodes: list[oracle.Node], before: dict[str, Any], after: dict[str, Any], mutation: str
) -> int:
    """Writes the pass from `before` to `after` makes at the least, by the oracle.

    Objects it creates and (but for a move, which prunes only once the new
    agents are Ready, in a later pass) the ones it prunes; every DaemonSet
    when its image tag or log level changed; and the status of the new
    generation.
    """
    was, wants = oracle.objects(before, nodes), oracle.objects(after, nodes)
    writes = len(wants - was) + 1
    if mutation != "namespace":
        writes += len(was - wants)
    if mutation in ("logLevel", "images.tag"):
        writes += sum(1 for key in wants & was if key[0] == "DaemonSet")
    return writes


def test_sigkill_mid_reconcile_converges_to_the_same_state(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Kube,
    operator: RunningOperator,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(k8s)
    pool = unique_name("chaos")
    chaos_ns = unique_name("chaos-agents")
    core.create_namespace({"metadata": {"name": chaos_ns}})
    names = create_nodes(k8s, _chaos_nodes(pool), timeout=180)
    run_seed = _seed("AMBIENT_CHAOS_SEED")
    rng = random.Random(run_seed)
    spec: dict[str, Any] = {}
    history: list[str] = []
    gate = WriteGate(tmp_path, OPERATOR_USER, unique_name("chaos-gate"))
    as_operator = api_client_for(cluster.user_kubeconfig(OPERATOR_USER, ["system:masters"]))
    try:
        with gate.installed(k8s, as_operator):
            wait_converged(k8s, kube, "first convergence on the extra nodes", operator)
            for round_ in range(20):
                name, mutate = rng.choice(_mutations(chaos_ns))
                before = copy.deepcopy(spec)
                mutate(spec)
                least = _least_writes(live_nodes(k8s), before, spec, name)
                # Kill while a random one of the writes the pass makes at the
                # least (objects applied or pruned, then the status) is held.
                kill_at = rng.randint(1, least)
                gate.arm(kill_at)
                set_mesh_spec(k8s, copy.deepcopy(spec))
                held = gate.held.wait(60)
                operator.stop(signal.SIGKILL)
                gate.disarm()
                history.append(
                    f"round {round_}: {name}, killed at write {kill_at} of at least {least}"
                    + (f" ({gate.held_request})" if held else f", but only {gate.count} came")
                )
                assert held, "\n".join(history)
                operator.start()
                wait_converged(k8s, kube, f"after {history[-1]}", operator)
                assert operator.alive(), operator.log_text()[-3000:]
    except BaseException as exc:
        exc.add_note(f"chaos seed: AMBIENT_CHAOS_SEED={run_seed}\n" + "\n".join(history))
        raise
    finally:
        as_operator.close()
        set_mesh_spec(k8s, {})
        delete_nodes(k8s, names, wait=False)
        with ignoring(404):
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
    set_mesh_spec(k8s, {"logLevel": "debug"})  # a change in flight when the server goes
    cluster.restart(component, graceful=False)
    wait_converged(k8s, kube, f"the change made just before {component} restarted", operator)
    set_mesh_spec(k8s, {"logLevel": "warn"})
    wait_converged(k8s, kube, f"a change made after {component} restarted", operator)
    assert operator.alive() and operator.proc is not None and operator.proc.pid == pid
    set_mesh_spec(k8s, {})
    wait_converged(k8s, kube, "back to the defaults", operator)


# -- two replicas -------------------------------------------------------------------------------


def _lease(k8s: client.ApiClient) -> client.V1Lease:
    return client.CoordinationV1Api(k8s).read_namespaced_lease("ambient-operator", AGENTS_NS)


def _lease_holder(k8s: client.ApiClient) -> str:
    return str(_lease(k8s).spec.holder_identity or "")


def _identity(op: RunningOperator) -> str:
    """The identity a replica logged when it started leading ('' if it never did)."""
    for line in op.log_text().splitlines():
        if "leader election: now leading as " in line:
            return line.rsplit("now leading as ", 1)[1].strip()
    return ""


def _acting(audit: AuditLog, since: int, user: str) -> list[str]:
    """A replica's writes but its attempts on the Lease (a create's URI names no Lease)."""
    return [w for w in audit.writes(since, user=user) if "leases" not in w.split("?")[0].split("/")]


def _received(event: dict[str, Any]) -> datetime:
    """When the API server received a request (its audit timestamp, microseconds)."""
    text = str(event["requestReceivedTimestamp"]).rstrip("Z")
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


REPLICA_USERS = ("ambient-operator-a", "ambient-operator-b")


def _replicas(
    cluster: LocalCluster, tmp_path: Path, users: tuple[str, ...], lease_seconds: float
) -> dict[str, RunningOperator]:
    """One operator process per user, with leader election on a short lease (not started)."""
    return {
        user: RunningOperator(
            cluster,
            tmp_path / user,
            extra_args=["--leader-election", "--lease-seconds", str(lease_seconds)],
            kubeconfig=cluster.user_kubeconfig(user, ["system:masters"]),
        )
        for user in users
    }


def test_two_replicas_one_leader_and_a_takeover_at_the_first_chance(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Kube,
    audit: AuditLog,
    mesh: None,
    tmp_path: Path,
) -> None:
    with ignoring(404):  # a lease left by another module's operator
        client.CoordinationV1Api(k8s).delete_namespaced_lease("ambient-operator", AGENTS_NS)
    lease_seconds = 5.0
    replicas = _replicas(cluster, tmp_path, REPLICA_USERS, lease_seconds)
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
        set_mesh_spec(k8s, {"logLevel": "debug"})
        wait_converged(k8s, kube, "the leader reconciles a change", leader)
        assert audit.writes(mark, user=leader_user)
        # The standby never wrote anything but (failed) attempts on the Lease.
        assert _acting(audit, start, standby_user) == []
        assert not _identity(standby)

        # SIGKILL the leader. Its last renewal, as the Lease keeps it, starts the clock.
        killed = audit.mark()
        leader.stop(signal.SIGKILL)
        held_until: datetime | None = None

        def taken() -> client.V1Lease | None:
            nonlocal held_until
            lease = _lease(k8s)
            if lease.spec.holder_identity == _identity(leader):
                duration = timedelta(seconds=lease.spec.lease_duration_seconds)
                held_until = lease.spec.renew_time + duration
                return None
            return lease if lease.spec.holder_identity else None

        lease = wait_for(taken, lease_seconds * 4, "the standby to take the lease", interval=0.05)
        assert held_until is not None, "the lease changed hands before it was read"
        expiry = held_until
        # Never before the lease ran out: the acquire time is the standby's own clock
        # at the attempt that took it.
        assert lease.spec.acquire_time >= expiry, (lease.spec.acquire_time, expiry)
        # And at its first attempt after that: the standby reads the Lease on every
        # attempt, so between the expiry and the write that took it there is the
        # read of that attempt, and at most one of an attempt whose clock read
        # came a moment before the expiry.
        attempts = [
            e
            for e in audit.events(killed, user=standby_user)
            if "/leases/ambient-operator" in str(e.get("requestURI"))
        ]
        takeover = next(
            e for e in attempts if e["verb"] == "update" and e["responseStatus"]["code"] == 200
        )
        reads_after_expiry = [
            e
            for e in attempts
            if e["verb"] == "get" and expiry <= _received(e) < _received(takeover)
        ]
        assert len(reads_after_expiry) <= 2, [(e["verb"], _received(e)) for e in attempts]
        assert _lease_holder(k8s) == wait_for(lambda: _identity(standby), 10, "its log line")

        mark = audit.mark()
        set_mesh_spec(k8s, {"logLevel": "warn"})
        wait_converged(k8s, kube, "the new leader reconciles a change", standby)
        assert _acting(audit, mark, standby_user)
        assert standby.alive()
        set_mesh_spec(k8s, {})
        wait_converged(k8s, kube, "back to the defaults", standby)
    finally:
        for op in replicas.values():
            op.stop()
    for op in replicas.values():
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _acting_in_order(audit: AuditLog, since: int, users: list[str]) -> list[tuple[datetime, str]]:
    """(received, user) of every non-Lease write of `users` since the mark, in server order."""
    acting = [
        (_received(e), user)
        for user in users
        for e in audit.events(since, user=user)
        if e["verb"] in ("create", "update", "patch", "delete", "deletecollection")
        and "leases" not in str(e.get("requestURI")).split("?")[0].split("/")
    ]
    return sorted(acting)


def test_api_server_frozen_longer_than_the_lease_makes_no_split_brain(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Kube,
    audit: AuditLog,
    mesh: None,
    tmp_path: Path,
) -> None:
    """SIGSTOP the API server for longer than the lease while two replicas run.

    The leader's renewals hang; by its own clock its lease runs out, and so it
    must stop acting by then, as the standby may take over the moment the
    server answers again. In the audit log, the writes of the two replicas
    never interleave: at most one hand-over, from the old leader to the new.
    """
    with ignoring(404):  # a lease left by another module's operator
        client.CoordinationV1Api(k8s).delete_namespaced_lease("ambient-operator", AGENTS_NS)
    lease_seconds = 5.0
    users = list(REPLICA_USERS)
    replicas = _replicas(cluster, tmp_path, REPLICA_USERS, lease_seconds)
    for user, op in replicas.items():
        (tmp_path / user).mkdir()
        op.start()
    apiserver = cluster.pids()["kube-apiserver"]
    try:
        leader_user = wait_for(
            lambda: next((u for u, op in replicas.items() if _identity(op)), None),
            60,
            "a replica to lead",
        )
        leader = replicas[leader_user]
        wait_converged(k8s, kube, "converged before the freeze", leader)
        mark = audit.mark()
        # A change in flight when the server stops: the leader's pass is writing.
        set_mesh_spec(k8s, {"logLevel": "debug"})
        wait_for(lambda: _acting(audit, mark, leader_user), 30, "the leader's pass to write")
        os.kill(apiserver, signal.SIGSTOP)
        frozen_log = len(leader.log_text())
        try:
            # Until the leader itself says it stopped leading, with a deadline
            # well past the lease: the server is frozen, nothing else can tell.
            wait_for(
                lambda: "standing by" in leader.log_text()[frozen_log:],
                lease_seconds * 4,
                "the frozen-out leader to stop acting by its own clock",
                interval=0.1,
            )
        finally:
            os.kill(apiserver, signal.SIGCONT)
        set_mesh_spec(k8s, {"logLevel": "warn"})
        now_leading = wait_for(
            lambda: next((u for u, op in replicas.items() if _identity_now(op)), None),
            60,
            "a replica leading again",
        )
        wait_converged(k8s, kube, "a change after the freeze", replicas[now_leading])
        order = _acting_in_order(audit, mark, users)
        runs = [user for i, (_, user) in enumerate(order) if i == 0 or order[i - 1][1] != user]
        assert runs and runs[0] == leader_user, runs
        assert len(runs) <= 2, [(t.isoformat(), u) for t, u in order]
        set_mesh_spec(k8s, {})
        wait_converged(k8s, kube, "back to the defaults", replicas[now_leading])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(apiserver, signal.SIGCONT)
        for op in replicas.values():
            op.stop()
    for op in replicas.values():
        assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _identity_now(op: RunningOperator) -> bool:
    """Whether a replica's last leader-election line says it leads."""
    lines = [line for line in op.log_text().splitlines() if "leader election: " in line]
    return bool(lines) and "now leading as " in lines[-1]


# -- fuzzing --------------------------------------------------------------------------------------

LABEL_VALUE = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?\Z").filter(
    lambda v: ".." not in v
)
ODD_TEXT = st.text(alphabet=st.characters(codec="ascii"), max_size=12)


def _string_map(keys: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(keys), LABEL_VALUE, max_size=2)


MESH_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "logLevel": st.sampled_from(["info", "debug", "trace", "bogus", ""]),
        "namespace": st.sampled_from([AGENTS_NS, "no-such-ns", "Bad_NS", AGENTS_NS]),
        "images": st.fixed_dictionaries(
            {}, optional={"tag": st.sampled_from(["1.30.4", "1.31.0-dev", "bad tag", ""]),
                          "hub": st.sampled_from(["docker.io/istio", "", "http://x"]),
                          "pullPolicy": st.sampled_from(["Always", "IfNotPresent", "Sometimes"]),
                          "pullSecrets": st.lists(st.sampled_from(["key", "Bad_Key"]), max_size=2)},
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
                "logAsJson": st.one_of(st.booleans(), st.just("yes")),
                "dnsPolicy": st.sampled_from(["ClusterFirst", "None", "Cluster"]),
                "podAnnotations": _string_map(["a", "example.com/x"]),
            },
        ),
        "newPodWorkaround": st.fixed_dictionaries(
            {}, optional={"timeoutSeconds": st.integers(-1, 4000), "enabled": st.booleans()}
        ),
        "istiod": st.fixed_dictionaries(
            {}, optional={"address": st.sampled_from(["istiod.x:15012", "nope", "a:99999"]),
                          "caAddress": st.sampled_from(["ca.x:15012", "ca.x"])},
        ),
        # Fields Istio's chart values become (api/helm_values.py).
        "multiCluster": st.fixed_dictionaries(
            {}, optional={"clusterName": st.sampled_from(["west", "c-1.a", "bad name", "", "-x"])}
        ),
        "network": st.sampled_from(["net1", "bad/net", "n" * 254]),
        "istioCni": st.fixed_dictionaries(
            {},
            optional={
                "excludeNamespaces": st.lists(st.sampled_from(["kube-system", "X_Y"]), max_size=2),
                "nativeNftables": st.one_of(st.booleans(), st.just("on")),
                "env": _string_map(["A", "a.b", "1A", "A=B"]),
                "podLabels": _string_map(["team", "app.kubernetes.io/name"]),
                "repairMode": st.sampled_from(["Repair", "Label", "Delete", "Restart"]),
                "provider": st.sampled_from(["default", "multus", "Multus"]),
            },
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


def _events(core: client.CoreV1Api, kind: str, name: str) -> set[str]:
    found = core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    ).items
    return {e.reason for e in found}


def _told(core: client.CoreV1Api, name: str, reasons: set[str]) -> bool:
    """Whether the namespace's Events include `reasons` (trivially so when none is due)."""
    return reasons <= _events(core, "Namespace", name)


def test_fuzzed_input_is_rejected_or_handled(
    k8s: client.ApiClient,
    fuzz_namespace: str,
    operator: RunningOperator,
) -> None:
    core, custom = client.CoreV1Api(k8s), client.CustomObjectsApi(k8s)
    counter = iter(range(10_000))
    outcomes: dict[str, int] = {}
    fuzz_seed = _seed("AMBIENT_FUZZ_SEED")

    def tally(what: str) -> None:
        outcomes[what] = outcomes.get(what, 0) + 1

    def handled(what: str, check: Any, last: Any = None) -> Any:
        """Wait for `check`; on a timeout, say what `last()` saw."""
        try:
            found = wait_for(check, 60, what)
        except TimeoutError as exc:
            if last is not None:
                exc.add_note(f"last seen: {last()}")
            raise
        assert operator.alive(), operator.log_text()[-4000:]
        return found

    def created(create: Any, rejected: bool, what: str) -> Any:
        """Create, and hold the API server's answer against the documents' prediction."""
        try:
            made = create()
        except ApiException as exc:
            assert exc.status in (400, 422), exc
            assert rejected, f"{what} refused, though the documents allow it: {exc.body}"
            tally(f"{what} rejected")
            return None
        assert not rejected, f"{what} accepted, though the documents forbid it"
        tally(f"{what} accepted")
        return made

    # No shrinking: each example costs seconds of a live cluster, and the failing one
    # is printed whole (with the seed that replays the run).
    @seed(fuzz_seed)
    @settings(max_examples=25, database=None, phases=[Phase.explicit, Phase.generate])
    @given(spec=MESH_SPECS, gw=GATEWAYS, ns_labels=NAMESPACE_LABELS, node=NODE_SHAPES)
    # Each outcome at least once whatever the seed draws (seed 819575396 drew
    # 25 invalid Gateways): a waypoint's one listener with a refused spec,
    # then a Gateway without listeners with an accepted one.
    @example(
        spec={"ztunnel": {"terminationGracePeriodSeconds": 0}},
        gw={"listeners": [{"port": 15008, "protocol": "HBONE"}], "annotations": {}, "labels": {}},
        ns_labels={},
        node={"os": "linux", "arch": "amd64", "build": None, "kernel": "6.8.0", "taint": False},
    )
    @example(
        spec={},
        gw={"listeners": [], "annotations": {}, "labels": {}},
        ns_labels={c.LABEL_DATAPLANE_MODE: "ambient"},
        node={
            "os": "windows",
            "arch": "amd64",
            "build": c.BUILD_WS2022,
            "kernel": "10.0.20348.2762",
            "taint": True,
        },
    )
    def one_example(
        spec: dict[str, Any], gw: dict[str, Any], ns_labels: dict[str, str], node: dict[str, Any]
    ) -> None:
        n = next(counter)
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
        # Earlier examples' Gateways stay, and so do the ServiceAccounts made as
        # theirs: one the annotation names is then somebody else's.
        accounts = {
            sa.metadata.name: sa.metadata.labels or {}
            for sa in core.list_namespaced_service_account(fuzz_namespace).items
        }
        gateway = created(
            lambda: custom.create_namespaced_custom_object(
                GW_GROUP, GW_VERSION, fuzz_namespace, "gateways", body
            ),
            oracle.gateway_rejected(listeners),
            "gateway",
        )
        ns_name = f"{fuzz_namespace}-{n}"
        # Sorts after ns_name: the pass that warns about it has judged ns_name too.
        sentinel = f"{ns_name}-z"
        namespace = created(
            lambda: core.create_namespace({"metadata": {"name": ns_name, "labels": ns_labels}}),
            False,
            "namespace",
        )
        node_name = f"{fuzz_namespace}-node-{n}"
        stored = created(lambda: core.create_node(_node_body(node_name, node)), False, "node")
        try:
            if gateway is not None:
                reasons = oracle.waypoint_accepted_reasons(gateway, accounts)
                generation = gateway["metadata"]["generation"]

                seen: dict[str, Any] = {}

                def judged() -> dict[str, Any] | None:
                    live = custom.get_namespaced_custom_object(
                        GW_GROUP, GW_VERSION, fuzz_namespace, "gateways", f"fuzz-{n}"
                    )
                    seen.update(condition(live, "Accepted"))
                    done = seen.get("observedGeneration") == generation
                    return seen if done and seen.get("reason") in reasons else None

                handled(f"Accepted with a reason of {sorted(reasons)}", judged, lambda: seen)
            if namespace is not None:
                due = oracle.namespace_events(ns_labels, {})
                core.create_namespace(
                    {"metadata": {"name": sentinel, "labels": {c.LABEL_DATAPLANE_MODE: "on"}}}
                )
                handled(
                    f"Events {sorted(due)} on {ns_name}",
                    lambda: _told(core, ns_name, due),
                    lambda: _events(core, "Namespace", ns_name),
                )
                handled(
                    f"the sentinel's Event after {ns_name}",
                    lambda: _told(core, sentinel, {"InvalidDataplaneMode"}),
                    lambda: _events(core, "Namespace", sentinel),
                )
                # Exactly those, and none when none is due.
                assert _events(core, "Namespace", ns_name) == due, ns_labels
            if stored is not None:
                nodes = live_nodes(k8s)
                mine = next(x for x in nodes if x.name == node_name)
                _, reason = oracle.verdict(mine, {})
                expected = {x.name: r for x in nodes if (r := oracle.verdict(x, {})[1]) is not None}
                unsupported = len(expected)

                def counted() -> dict[str, Any] | None:
                    counts = get_mesh(k8s)["status"]["nodes"]
                    live = len(client.CoreV1Api(k8s).list_node().items)
                    ok = counts["total"] == live == len(nodes)
                    # Equal counts alone can be a status a node behind: one
                    # deleted and one added since. The names must be the live ones.
                    names = {u["name"] for u in counts.get("unsupportedNodes") or []}
                    if unsupported <= 20:
                        ok = ok and names == set(expected)
                    return counts if ok and counts["unsupported"] == unsupported else None

                counts = handled(
                    f"the status to count {unsupported} unsupported nodes",
                    counted,
                    lambda: get_mesh(k8s)["status"]["nodes"],
                )
                listed = {u["name"]: u["reason"] for u in counts.get("unsupportedNodes") or []}
                if reason is None:
                    assert node_name not in listed, (mine, listed.get(node_name))
                elif unsupported <= 20:  # the status names at most 20
                    assert listed.get(node_name) == reason, mine

            # Then the AmbientMesh: rejected, or its status answers for the generation.
            mesh = created(lambda: set_mesh_spec(k8s, spec), oracle.spec_rejected(spec), "spec")
            if mesh is not None:
                generation = mesh["metadata"]["generation"]
                expected = "Reconciled"
                if oracle.agents_namespace(spec) == "no-such-ns":
                    expected = "NamespaceNotFound"
                handled(
                    f"Reconciled={expected} for generation {generation}",
                    lambda: (
                        (got := condition(get_mesh(k8s), "Reconciled")).get("observedGeneration")
                        == generation
                        and got.get("reason") == expected
                    ),
                    lambda: condition(get_mesh(k8s), "Reconciled"),
                )
        finally:
            set_mesh_spec(k8s, {})
            for name in (ns_name, sentinel):
                with ignoring(404):
                    core.delete_namespace(name)
            if stored is not None:
                with ignoring(404):
                    core.delete_node(node_name)

    try:
        one_example()
    except BaseException as exc:
        exc.add_note(f"fuzz seed: AMBIENT_FUZZ_SEED={fuzz_seed}; outcomes {outcomes}")
        raise
    assert operator.alive(), operator.log_text()[-4000:]
    print(f"fuzz seed {fuzz_seed}:", json.dumps(outcomes))
    # Both outcomes happened for the mesh and the Gateways: the examples probed
    # the API server's validation and the operator's handling alike.
    for what in ("spec", "gateway"):
        assert outcomes.get(f"{what} rejected") and outcomes.get(f"{what} accepted"), outcomes
