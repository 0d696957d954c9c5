"""The operator on a live control plane: convergence, nodes, drift, zero writes,
namespaces, metrics and garbage collection (issue 4's acceptance points).

Tests in this module run in order against one operator process.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import oracle
from ambient_devcluster import LocalCluster, create_nodes, install_istiod_objects
from ambient_devcluster.harness import condition, get_mesh, set_mesh_spec
from conftest import BIN_DIR, namespaces_settled, unique_name, wait_for
from operator_harness import (
    SAMPLE_MESH,
    AuditLog,
    RunningOperator,
    apply_sample_mesh,
    full_passes_finished,
)

GROUP, VERSION, PLURAL = "ambientoperator.io", "v1alpha1", "ambientmeshes"
AGENTS_NS = "istio-system"
SELECTOR = "app.kubernetes.io/managed-by=ambient-operator,ambientoperator.io/controller=dataplane"


def _daemonsets(api: client.ApiClient) -> dict[str, client.V1DaemonSet]:
    items = client.AppsV1Api(api).list_namespaced_daemon_set(AGENTS_NS, label_selector=SELECTOR)
    return {ds.metadata.name: ds for ds in items.items}


LINUX_SAMPLES = frozenset({"linux-amd64-1", "linux-amd64-2", "linux-arm64-1"})
# Where the sample mesh puts each agent on the sample nodes, written out by hand.
SAMPLE_PLACEMENT = {
    "istio-cni-node": LINUX_SAMPLES,
    "ztunnel": LINUX_SAMPLES,
    "istio-cni-node-windows-ltsc2022": frozenset({"win2022-1"}),
    "ztunnel-windows-ltsc2022": frozenset({"win2022-1"}),
    "istio-cni-node-windows-ltsc2025": frozenset({"win2025-1"}),
    "ztunnel-windows-ltsc2025": frozenset({"win2025-1"}),
}
SAMPLE_NAMES = frozenset(LINUX_SAMPLES | {"win2022-1", "win2025-1", "win2019-1"})


def _expected(api: client.ApiClient) -> dict[str, frozenset[str]]:
    """DaemonSet name -> nodes it should run on: the oracle over the live Nodes (other
    modules may have added some), which on the sample nodes must say what is written
    out above."""
    nodes = client.CoreV1Api(api).list_node().items
    judged = [oracle.Node.of(api.sanitize_for_serialization(n)) for n in nodes]
    spec = yaml.safe_load(SAMPLE_MESH.read_text())["spec"]
    expected = oracle.placement(spec, judged)
    on_samples = {name: placed & SAMPLE_NAMES for name, placed in expected.items()}
    assert on_samples == SAMPLE_PLACEMENT
    return expected


def _placed(api: client.ApiClient, ds: str) -> set[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(AGENTS_NS).items
    return {
        p.spec.node_name
        for p in pods
        if p.metadata.owner_references
        and p.metadata.owner_references[0].name == ds
        and p.status.phase == "Running"
    }


@pytest.fixture(scope="module")
def istio_env(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> None:
    """istiod's objects as upstream's chart renders them, and a cluster DNS Service."""
    install_istiod_objects(k8s, BIN_DIR, AGENTS_NS)


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster, istio_env: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningOperator]:
    """The operator process, with a short resync so no-op passes are observable."""
    op = RunningOperator(
        cluster, tmp_path_factory.mktemp("operator"), extra_args=["--resync-seconds", "2"]
    )
    with op.running():
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


@pytest.fixture(scope="module")
def audit(cluster: LocalCluster) -> AuditLog:
    """The API server's audit log."""
    return AuditLog(cluster.audit_log)


def _agent_pods(k8s: client.ApiClient) -> list[Any]:
    """What the agent pods look like, for failure messages."""
    return [
        (
            p.metadata.name,
            p.spec.node_name,
            p.status.phase,
            [(c.type, c.status, c.reason) for c in p.status.conditions or []],
            p.metadata.deletion_timestamp,
        )
        for p in client.CoreV1Api(k8s).list_namespaced_pod(AGENTS_NS).items
    ]


def _bound(k8s: client.ApiClient, ds: str) -> set[str]:
    """Nodes that have a pod of this DaemonSet bound to them (running or not yet)."""
    pods = client.CoreV1Api(k8s).list_namespaced_pod(AGENTS_NS).items
    return {
        p.spec.node_name
        for p in pods
        if p.metadata.owner_references and p.metadata.owner_references[0].name == ds
    }


def _wait_placed(k8s: client.ApiClient, ds: str, node: str, timeout: float) -> None:
    # Bound, not Running: starting it is kwok's part, and kwok alone can lag
    # behind on a node that has just joined when the machine is busy.
    try:
        wait_for(lambda: node in _bound(k8s, ds), timeout, f"{ds} pod bound to {node}")
    except TimeoutError as exc:
        raise AssertionError(f"{ds} not on {node}; agent pods: {_agent_pods(k8s)}") from exc


def _wait_converged(k8s: client.ApiClient, timeout: float, what: str) -> None:
    try:
        wait_for(lambda: _converged(k8s), timeout, what)
    except TimeoutError as exc:
        raise AssertionError(
            f"{what}: Ready is {condition(get_mesh(k8s), 'Ready')}; agent pods: {_agent_pods(k8s)}"
        ) from exc


def _converged(k8s: client.ApiClient) -> bool:
    mesh = get_mesh(k8s)
    ready = condition(mesh, "Ready")
    gen = mesh["metadata"]["generation"]
    return ready.get("status") == "True" and ready.get("observedGeneration") == gen


def test_sample_mesh_converges(
    cluster: LocalCluster, k8s: client.ApiClient, operator: RunningOperator
) -> None:
    apply_sample_mesh(cluster)
    expected = _expected(k8s)
    assert any("windows" in name for name in expected), expected
    wait_for(lambda: set(_daemonsets(k8s)) == set(expected), 60, f"DaemonSets {set(expected)}")
    for name, nodes in expected.items():
        wait_for(lambda n=name, w=set(nodes): _placed(k8s, n) == w, 90, f"{name} pods on {nodes}")
    _wait_converged(k8s, 60, "Ready=True")

    mesh = get_mesh(k8s)
    status = mesh["status"]
    assert condition(mesh, "Reconciled")["status"] == "True"
    degraded = condition(mesh, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "UnsupportedNodes"
    assert "win2019-1" in degraded["message"]
    assert status["readyComponents"] == f"{len(expected)}/{len(expected)}"
    by_name = {cs["name"]: cs for cs in status["components"]}
    for name, nodes in expected.items():
        assert by_name[name]["desired"] == len(nodes) == by_name[name]["ready"]
    assert status["nodes"]["unsupported"] >= 1
    assert any(n["name"] == "win2019-1" for n in status["nodes"]["unsupportedNodes"])

    # `kubectl get` shows readiness and node counts at a glance.
    out = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "get", "amesh"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = out.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "READY", "DEGRADED", "AGENTS", "LINUX", "WINDOWS"]
    assert row.split()[:3] == ["default", "True", "True"]

    events = (
        client.CoreV1Api(k8s)
        .list_namespaced_event("default", field_selector="involvedObject.kind=AmbientMesh")
        .items
    )
    assert {e.reason for e in events} >= {"UnsupportedNodes", "AgentsReady"}


def _node_doc(name: str, build: str, kernel: str, *, label: bool = True) -> dict[str, Any]:
    labels = {
        "kubernetes.io/os": "windows",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
    }
    if label:
        labels["node.kubernetes.io/windows-build"] = build
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": "os", "value": "windows", "effect": "NoSchedule"}]},
        "status": {
            "nodeInfo": {
                "kernelVersion": kernel,
                "operatingSystem": "windows",
                "architecture": "amd64",
                "osImage": "Windows Server",
            }
        },
    }


def _create_node_docs(
    k8s: client.ApiClient, tmp: Path, docs: list[dict[str, Any]], parallel: int = 1
) -> None:
    """Create kwok nodes; with `parallel`, from that many threads at once (a burst)."""
    chunks = [docs[i::parallel] for i in range(parallel)]
    paths = []
    for chunk in chunks:
        path = tmp / f"{unique_name('nodes')}.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": chunk}))
        paths.append(path)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for done in [pool.submit(create_nodes, k8s, p, timeout=180) for p in paths]:
            done.result()


def _desired(k8s: client.ApiClient, ds: str) -> int:
    found = _daemonsets(k8s).get(ds)
    return -1 if found is None or found.status is None else found.status.desired_number_scheduled


def test_nodes_come_and_go(
    k8s: client.ApiClient, operator: RunningOperator, tmp_path: Path
) -> None:
    core = client.CoreV1Api(k8s)
    ws2025 = next(n for n in _expected(k8s) if n.startswith("ztunnel") and "ltsc2025" in n)
    before = _desired(k8s, ws2025)
    extra = unique_name("win2025-x")
    _create_node_docs(k8s, tmp_path, [_node_doc(extra, "10.0.26100", "10.0.26100.2314")])
    try:
        wait_for(lambda: _desired(k8s, ws2025) == before + 1, 30, "WS2025 node gets its agent")
        _wait_placed(k8s, ws2025, extra, 150)
    finally:
        core.delete_node(extra)

    ws2022 = {n for n in _expected(k8s) if "ltsc2022" in n}
    assert ws2022
    # A Windows node without the build label still gets the agent of its build.
    unlabeled = unique_name("win2022-nolabel")
    _create_node_docs(
        k8s, tmp_path, [_node_doc(unlabeled, "10.0.20348", "10.0.20348.2762", label=False)]
    )
    ws2022_ztunnel = sorted(n for n in ws2022 if n.startswith("ztunnel"))[0]
    try:
        _wait_placed(k8s, ws2022_ztunnel, unlabeled, 150)
        assert "node.kubernetes.io/windows-build" not in (
            core.read_node(unlabeled).metadata.labels or {}
        )
    finally:
        core.delete_node(unlabeled)
    _wait_converged(k8s, 90, "Ready after the unlabelled node left")

    # The last node of a build leaves: that build's DaemonSets go. The shared
    # sample nodes stay put: the mesh is narrowed to a pool of our own nodes.
    custom = client.CustomObjectsApi(k8s)
    pool = {"ambient-test/pool": unique_name("pool")}
    custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "default",
        {"spec": {"platforms": {"windows": {"nodeSelector": pool}}}},
    )
    try:
        wait_for(lambda: not ws2022 & set(_daemonsets(k8s)), 30, "no WS2022 node in the pool")
        own = unique_name("win2022-own")
        doc = _node_doc(own, "10.0.20348", "10.0.20348.2762")
        doc["metadata"]["labels"].update(pool)
        _create_node_docs(k8s, tmp_path, [doc])
        wait_for(lambda: ws2022 <= set(_daemonsets(k8s)), 30, "WS2022 DaemonSets for the node")
        _wait_placed(k8s, ws2022_ztunnel, own, 150)
        core.delete_node(own)
        wait_for(lambda: not ws2022 & set(_daemonsets(k8s)), 30, "last WS2022 node left")
    finally:
        custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            "default",
            {"spec": {"platforms": {"windows": {"nodeSelector": None}}}},
        )
    wait_for(lambda: ws2022 <= set(_daemonsets(k8s)), 30, "WS2022 DaemonSets back")
    _wait_converged(k8s, 90, "Ready again")


# The loop's pacing, as docs/architecture.md states it.
IDLE_AFTER = 2.0  # seconds without a pass: the loop is idle, a change goes at once
URGENT_BURST = 5  # urgent passes that may run back to back before spacing starts
GAPS = (0.5, 1.0, 2.0, 4.0)  # "0.5 s doubling to 5 s"
MAX_GAP = 5.0
# A keyed change (a node's platform, a namespace) goes at once, each key at most
# once in this long: the burst's one platform adds one such pass per span.
KEY_QUIET = 2.0
_PASS = re.compile(
    r"^\[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*reconcile pass: "
    r"urgent=\w+ waited=(?P<waited>[0-9.]+)s took=(?P<took>[0-9.]+)s"
)


def _passes(log: str, since: datetime) -> list[tuple[datetime, datetime, datetime]]:
    """(woke, started, ended) of each pass of the loop that ended after `since`."""
    out = []
    for line in log.splitlines():
        match = _PASS.match(line)
        if not match:
            continue
        ended = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f")
        if ended < since:
            continue
        started = ended - timedelta(seconds=float(match["took"]))
        out.append((started - timedelta(seconds=float(match["waited"])), started, ended))
    return out


def _pacing_allowance(passes: list[tuple[datetime, datetime, datetime]]) -> int:
    """The most passes the pacing lets run in the busy periods these passes fall in.

    A busy period starts when a change wakes a loop idle for IDLE_AFTER; in it
    URGENT_BURST urgent passes may go back to back, each later urgent pass may
    skip the spacing only IDLE_AFTER after the previous urgent one, the nodes'
    one platform may go at once again KEY_QUIET after it last did, and every
    other pass waits a gap that doubles from 0.5 s to 5 s.
    """
    periods: list[float] = []
    first = passes[0][1]
    for i, (woke, started, ended) in enumerate(passes):
        if i == 0 or (woke - passes[i - 1][2]).total_seconds() >= IDLE_AFTER:
            periods.append(0.0)
            first = started
        periods[-1] = (ended - first).total_seconds()
    total = 0
    for length in periods:
        spaced, waited = 0, 0.0
        while True:
            gap = GAPS[spaced] if spaced < len(GAPS) else MAX_GAP
            if waited + gap > length:
                break
            waited += gap
            spaced += 1
        keyed = 1 + math.floor(length / KEY_QUIET)
        total += 1 + URGENT_BURST + math.floor(length / IDLE_AFTER) + keyed + spaced
    return total


def test_burst_of_nodes_is_a_handful_of_reconciles(
    k8s: client.ApiClient, operator: RunningOperator, tmp_path: Path
) -> None:
    count = 200
    names = [unique_name(f"burst-{i}") for i in range(count)]
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n,
                "labels": {
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/hostname": n,
                },
            },
            "status": {
                "nodeInfo": {
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "kernelVersion": "6.8.0",
                }
            },
        }
        for n in names
    ]
    core = client.CoreV1Api(k8s)

    def status_counts_live_nodes() -> bool:
        # Compared with the live list, not a delta: another module's nodes may
        # still be leaving while this test runs.
        live = {n.metadata.name for n in core.list_node().items}
        return get_mesh(k8s)["status"]["nodes"]["total"] == len(live)

    started = datetime.now()
    _create_node_docs(k8s, tmp_path, docs, parallel=10)
    try:
        wait_for(
            lambda: (
                set(names) <= {n.metadata.name for n in core.list_node().items}
                and status_counts_live_nodes()
            ),
            120,
            "status counts the new nodes",
        )
        # The loop's passes while the nodes joined, from its own log; the bound is
        # what the documented pacing allows in the time they took on this machine.
        passes = _passes(operator.log_text(), started)
        assert passes, "no pass of the loop while the nodes joined"
        allowed = _pacing_allowance(passes)
        span = (passes[-1][2] - passes[0][0]).total_seconds()
        assert len(passes) <= allowed, (
            f"{len(passes)} passes for {count} nodes joining in {span:.1f}s; "
            f"the pacing allows {allowed}"
        )
        # Folding, whatever the machine: far fewer passes than nodes.
        assert len(passes) < count / 4, len(passes)
    finally:
        for n in names:
            with contextlib.suppress(ApiException):
                core.delete_node(n)
    wait_for(
        lambda: (
            not set(names) & {n.metadata.name for n in core.list_node().items}
            and status_counts_live_nodes()
        ),
        120,
        "nodes gone",
    )
    _wait_converged(k8s, 180, "Ready again")


def test_drift_is_put_back(k8s: client.ApiClient, operator: RunningOperator) -> None:
    apps = client.AppsV1Api(k8s)
    sets = _daemonsets(k8s)
    first, second = sorted(sets)[:2]
    image = sets[first].spec.template.spec.containers[0].image
    apps.patch_namespaced_daemon_set(
        first,
        AGENTS_NS,
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": sets[first].spec.template.spec.containers[0].name,
                                "image": "docker.io/evil/image:1",
                            }
                        ]
                    }
                }
            }
        },
    )
    old_uid = sets[second].metadata.uid
    apps.delete_namespaced_daemon_set(second, AGENTS_NS)
    wait_for(
        lambda: (
            apps.read_namespaced_daemon_set(first, AGENTS_NS).spec.template.spec.containers[0].image
            == image
        ),
        30,
        "image restored",
    )
    wait_for(
        lambda: apps.read_namespaced_daemon_set(second, AGENTS_NS).metadata.uid != old_uid,
        30,
        "deleted DaemonSet recreated",
    )
    _wait_converged(k8s, 90, "Ready again")


PASSES_DONE = "ambient_operator_reconcile_duration_seconds_count"


def _going_away(k8s: client.ApiClient) -> list[str]:
    """Namespaces and pods that are being deleted, by name."""
    core = client.CoreV1Api(k8s)
    names = [
        f"namespace {ns.metadata.name}"
        for ns in core.list_namespace().items
        if ns.metadata.deletion_timestamp
    ]
    names += [
        f"pod {pod.metadata.namespace}/{pod.metadata.name}"
        for pod in core.list_pod_for_all_namespaces().items
        if pod.metadata.deletion_timestamp
    ]
    return names


def _restart_after_convergence(
    k8s: client.ApiClient, operator: RunningOperator, audit: AuditLog
) -> int:
    """Restart the operator once converged; the audit mark of the new process's start.

    Returns once the new process finished its first data-plane pass (the full
    one after start-up) and another after it (the 2 s resync, at the latest),
    and a waypoint pass.
    """
    _wait_converged(k8s, 90, "converged")
    # The cluster is shared with the earlier test modules, whose namespaces
    # may still be going away: their pods leaving would change the
    # enrollment counts, and a status write for that is no restart's doing.
    wait_for(lambda: not _going_away(k8s), 180, "no namespace or pod being deleted")
    settled = operator.metric(PASSES_DONE, controller="dataplane")
    wait_for(
        lambda: operator.metric(PASSES_DONE, controller="dataplane") >= settled + 2,
        60,
        "two data-plane passes on the settled cluster",
    )
    operator.stop()
    mark = audit.mark()
    operator.start()

    def passes_done() -> bool:
        dataplane = operator.metric(PASSES_DONE, controller="dataplane")
        return dataplane >= 2 and operator.metric(PASSES_DONE, controller="waypoints") >= 1

    wait_for(passes_done, 60, "two finished data-plane passes and a waypoint pass")
    return mark


def test_restart_and_resync_make_no_writes(
    k8s: client.ApiClient, operator: RunningOperator, audit: AuditLog
) -> None:
    mark = _restart_after_convergence(k8s, operator, audit)
    assert audit.events(mark), "the audit log shows no request of the operator at all"
    assert audit.writes(mark) == []


def _event_reasons(k8s: client.ApiClient, kind: str, name: str) -> set[str]:
    events = (
        client.CoreV1Api(k8s)
        .list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
        )
        .items
    )
    return {e.reason for e in events if e.type == "Warning"}


def _pod(name: str, windows: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "docker.io/library/nginx:1"}]}
    if windows:
        spec["nodeSelector"] = {
            "kubernetes.io/os": "windows",
            "node.kubernetes.io/windows-build": "10.0.26100",
        }
        spec["tolerations"] = [{"key": "os", "operator": "Exists"}]
    return {"metadata": {"name": name}, "spec": spec}


def test_namespace_labels_and_enrollment(k8s: client.ApiClient, operator: RunningOperator) -> None:
    core = client.CoreV1Api(k8s)
    bad, both, wp, good = (unique_name(p) for p in ("bad", "both", "wp", "enrolled"))
    labels = {
        bad: {"istio.io/dataplane-mode": "on"},
        both: {"istio.io/dataplane-mode": "ambient", "istio-injection": "enabled"},
        wp: {"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "nope"},
        good: {"istio.io/dataplane-mode": "ambient"},
    }
    # Totals are cluster-wide deltas: start after earlier modules' namespaces
    # are gone and a pass begun after that has counted what is left.
    namespaces_settled(k8s)
    full_passes_finished(k8s, operator, 1, 60)
    base = get_mesh(k8s)["status"]["enrollment"]
    for name, lab in labels.items():
        core.create_namespace({"metadata": {"name": name, "labels": lab}})
    try:
        wait_for(
            lambda: "InvalidDataplaneMode" in _event_reasons(k8s, "Namespace", bad),
            30,
            "invalid value warned",
        )
        wait_for(
            lambda: "SidecarAndAmbient" in _event_reasons(k8s, "Namespace", both),
            30,
            "sidecar conflict warned",
        )
        wait_for(
            lambda: "WaypointNotFound" in _event_reasons(k8s, "Namespace", wp),
            30,
            "missing waypoint warned",
        )

        wait_for(lambda: core.read_namespaced_service_account("default", good), 30, "SA")
        for i in range(3):
            core.create_namespaced_pod(good, _pod(f"linux-{i}"))
        core.create_namespaced_pod(good, _pod("win-0", windows=True))
        core.patch_namespaced_pod(
            "linux-0",
            good,
            {"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}},
        )

        def counts() -> dict[str, Any]:
            return dict(get_mesh(k8s)["status"]["enrollment"])

        def deltas() -> tuple[int, int, int]:
            now = counts()
            return tuple(  # type: ignore[return-value]
                int(now[os_key][state]) - int(base[os_key][state])
                for os_key, state in (
                    ("linuxPods", "enabled"),
                    ("linuxPods", "missing"),
                    ("windowsPods", "missing"),
                )
            )

        wait_for(lambda: deltas() == (1, 2, 1), 30, "enrollment totals match the pods")
        assert counts()["namespaces"] - base["namespaces"] == 3  # both, wp, good
        # Relabelling the namespace updates the totals.
        core.patch_namespace(good, {"metadata": {"labels": {"istio.io/dataplane-mode": "none"}}})
        wait_for(lambda: deltas() == (0, 0, 0), 30, "totals drop after relabel")
    finally:
        for name in labels:
            with contextlib.suppress(ApiException):
                core.delete_namespace(name)


def _written(audit: AuditLog, since: int, resource: str) -> set[str]:
    """Names of `resource` objects the operator created, changed or deleted since `since`."""
    out = set()
    for event in audit.events(since):
        ref = event.get("objectRef") or {}
        code = (event.get("responseStatus") or {}).get("code", 0)
        if (
            event.get("verb") in ("create", "update", "patch", "delete")
            and ref.get("resource") == resource
            and not ref.get("subresource")
            and 200 <= code < 300
        ):
            out.add(str(ref.get("name")))
    return out


def _warnings(k8s: client.ApiClient, kind: str, name: str) -> dict[str, str]:
    """Warning Events about an object: reason -> message."""
    events = (
        client.CoreV1Api(k8s)
        .list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
        )
        .items
    )
    return {e.reason: e.message for e in events if e.type == "Warning"}


def test_a_talks_labels_are_told_apart(k8s: client.ApiClient, operator: RunningOperator) -> None:
    # A new user labels namespaces as a talk shows: `data-plane-mode: ambient`
    # and `use-waypoint: true`, once with Istio's prefix on the second key.
    core = client.CoreV1Api(k8s)
    prefixed, bare, alone = (unique_name(p) for p in ("talk", "talk-bare", "wp-alone"))
    labels = {
        prefixed: {"data-plane-mode": "ambient", "istio.io/use-waypoint": "true"},
        bare: {"data-plane-mode": "ambient", "use-waypoint": "true"},
        alone: {"istio.io/use-waypoint": "waypoint"},
    }
    want = {
        prefixed: {"MisspelledDataplaneMode", "WaypointNameExpected"},
        bare: {"MisspelledDataplaneMode", "MisspelledUseWaypoint"},
        alone: {"WaypointWithoutAmbient", "WaypointNotFound"},
    }
    for name, lab in labels.items():
        core.create_namespace({"metadata": {"name": name, "labels": lab}})
    try:
        for name, reasons in want.items():
            wait_for(
                lambda n=name, r=reasons: set(_warnings(k8s, "Namespace", n)) >= r,
                30,
                f"{sorted(reasons)} on {name}",
            )
        # A pass posts all of a namespace's Events in its check, before its
        # data-plane reconcile ends: once one more has ended, all were posted.
        done = operator.metric(PASSES_DONE, controller="dataplane")
        wait_for(
            lambda: operator.metric(PASSES_DONE, controller="dataplane") > done,
            30,
            "a pass after the Events",
        )
        told = {name: _warnings(k8s, "Namespace", name) for name in want}
        assert {name: set(events) for name, events in told.items()} == want
        # Not enrolled, the right key named; "true" is not a waypoint's name.
        assert told[prefixed]["MisspelledDataplaneMode"] == (
            "data-plane-mode=ambient is not a label Istio reads; the key is "
            "istio.io/dataplane-mode. This namespace is not enrolled in ambient and ztunnel "
            f"does not redirect its pods: kubectl label namespace {prefixed} "
            "istio.io/dataplane-mode=ambient"
        )
        assert told[prefixed]["WaypointNameExpected"] == (
            "istio.io/use-waypoint takes the name of a waypoint Gateway, not true: no Gateway "
            f"{prefixed}/true exists, so traffic skips any waypoint; {prefixed} has no waypoint "
            f"yet (ambient-operator waypoint apply -n {prefixed} makes one named waypoint)"
        )
        assert told[bare]["MisspelledUseWaypoint"] == (
            "use-waypoint=true is not a label Istio reads; the key is istio.io/use-waypoint, "
            "and it takes a waypoint Gateway's name, not true. No waypoint is used: set "
            "istio.io/use-waypoint=<name of a waypoint Gateway>"
        )
        assert told[alone]["WaypointWithoutAmbient"].startswith(
            "istio.io/use-waypoint=waypoint has no effect on this namespace's pods: the "
            "namespace is not enrolled in ambient (no istio.io/dataplane-mode=ambient)"
        )
    finally:
        for name in labels:
            with contextlib.suppress(ApiException):
                core.delete_namespace(name)


def test_a_missing_istiod_is_named_before_unsupported_nodes(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    # The sample nodes keep win2019-1, which no agent can serve (UnsupportedNodes);
    # an istiod that is not there is the worse news and names the reason.
    _wait_converged(k8s, 90, "converged")
    spec = copy.deepcopy(get_mesh(k8s)["spec"])
    missing = unique_name("istiod-gone")
    gone = copy.deepcopy(spec)
    gone.setdefault("istiod", {})["serviceName"] = missing

    def degraded(reason: str, generation: int) -> dict[str, Any] | None:
        cond = condition(get_mesh(k8s), "Degraded")
        ok = cond.get("observedGeneration") == generation and cond.get("reason") == reason
        return cond if ok else None

    generation = int(set_mesh_spec(k8s, gone)["metadata"]["generation"])
    try:
        cond = wait_for(lambda: degraded("IstiodNotFound", generation), 60, "IstiodNotFound")
        message = str(cond["message"])
        # Each cause once: the missing Service, then the unsupported node; not the
        # render's fallback for the Windows agents, which is the same missing Service.
        assert message.startswith(
            f"Service {AGENTS_NS}/{missing} not found; agents cannot reach istiod; "
        ), message
        assert message.count(missing) == 1, message
        assert "win2019-1 (WindowsBuildUnsupported" in message, message
    finally:
        generation = int(set_mesh_spec(k8s, spec)["metadata"]["generation"])
    wait_for(lambda: degraded("UnsupportedNodes", generation), 60, "UnsupportedNodes again")
    _wait_converged(k8s, 90, "Ready again")


def test_metrics_tell_the_same_story(
    k8s: client.ApiClient, operator: RunningOperator, audit: AuditLog
) -> None:
    # A process of its own, so the counters count only what this test saw.
    mark = _restart_after_convergence(k8s, operator, audit)
    assert operator.metric("ambient_operator_objects_applied_total") == 0
    assert operator.metric("ambient_operator_events_total") == len(_written(audit, mark, "events"))
    # Drift on one DaemonSet: exactly that object is applied again, and counted.
    apps = client.AppsV1Api(k8s)
    first = sorted(_daemonsets(k8s))[0]
    container = _daemonsets(k8s)[first].spec.template.spec.containers[0]
    drift = {"containers": [{"name": container.name, "image": "docker.io/evil/image:1"}]}
    apps.patch_namespaced_daemon_set(first, AGENTS_NS, {"spec": {"template": {"spec": drift}}})

    def image() -> str:
        live = apps.read_namespaced_daemon_set(first, AGENTS_NS).spec.template.spec
        return str(live.containers[0].image)

    wait_for(lambda: image() == container.image, 30, "the drift undone")
    wait_for(
        lambda: operator.metric("ambient_operator_objects_applied_total", kind="DaemonSet") >= 1,
        30,
        "the apply counted",
    )
    assert operator.metric("ambient_operator_objects_applied_total") == 1
    assert _written(audit, mark, "daemonsets") == {first}
    assert operator.metric("ambient_operator_events_total") == len(_written(audit, mark, "events"))

    status = get_mesh(k8s)["status"]
    assert operator.metric("ambient_operator_reconcile_total", controller="dataplane") >= 1
    assert (
        operator.metric(
            "ambient_operator_nodes", os="windows", build="10.0.17763", supported="false"
        )
        == 1
    )
    nodes = status["nodes"]
    assert operator.metric("ambient_operator_nodes") == nodes["total"]
    assert operator.metric("ambient_operator_nodes", supported="false") == nodes["unsupported"]
    assert (
        operator.metric("ambient_operator_enrolled_namespaces")
        == status["enrollment"]["namespaces"]
    )
    linux = status["enrollment"]["linuxPods"]
    assert (
        operator.metric("ambient_operator_enrolled_pods", os="linux", redirection="missing")
        == (linux["missing"])
    )
    metrics = operator.metrics()
    assert any(k.startswith("ambient_operator_reconcile_duration_seconds_bucket") for k in metrics)


def test_deleting_the_mesh_removes_only_what_it_created(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    core, apps, rbac = (
        client.CoreV1Api(k8s),
        client.AppsV1Api(k8s),
        client.RbacAuthorizationV1Api(k8s),
    )
    core.create_namespaced_config_map(AGENTS_NS, {"metadata": {"name": unique_name("user-cm")}})
    user_cms = {cm.metadata.name for cm in core.list_namespaced_config_map(AGENTS_NS).items}
    client.CustomObjectsApi(k8s).delete_cluster_custom_object(GROUP, VERSION, PLURAL, "default")

    def ours() -> int:
        return sum(
            len(items)
            for items in (
                apps.list_namespaced_daemon_set(AGENTS_NS, label_selector=SELECTOR).items,
                core.list_namespaced_service_account(AGENTS_NS, label_selector=SELECTOR).items,
                core.list_namespaced_config_map(AGENTS_NS, label_selector=SELECTOR).items,
                rbac.list_cluster_role(label_selector=SELECTOR).items,
                rbac.list_cluster_role_binding(label_selector=SELECTOR).items,
            )
        )

    wait_for(lambda: ours() == 0, 60, "garbage collection of the mesh's objects")
    left = {cm.metadata.name for cm in core.list_namespaced_config_map(AGENTS_NS).items}
    mine = {
        cm.metadata.name
        for cm in core.list_namespaced_config_map(AGENTS_NS).items
        if (cm.metadata.labels or {}).get("ambientoperator.io/controller") == "dataplane"
    }
    assert not mine
    assert {n for n in user_cms if "user-cm" in n} <= left
    assert core.read_namespaced_service("istiod", AGENTS_NS)
    assert apps.read_namespaced_deployment("istiod", AGENTS_NS)
    assert operator.alive()
