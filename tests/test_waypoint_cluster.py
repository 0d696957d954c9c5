"""Waypoints on a live control plane, with Gateway API v1.4.1 and then v1.6.3.

This module runs its own local control plane: v1.6's safe-upgrades policy
refuses older Gateway API CRDs once installed, so the session cluster (which
other modules give v1.6) cannot host the v1.4 run. Every acceptance test
takes the `gateway_api` parameter; pytest runs all v1.4 cases first, then
applies v1.6 over v1.4 (an upgrade, with the operator running) for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, apply_dirs, create_nodes
from ambient_devcluster.harness import CRDS_DIR, create_mesh, gateway_api_dir
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.state import ClusterState
from ambient_operator.controllers.waypoints import WaypointController
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.render.waypoints.class_defaults import CLASS_DEFAULTS_NAME
from ambient_operator.render.waypoints.verdicts import render_waypoint
from ambient_operator.status.events import EventRecorder
from conftest import BIN_DIR, SAMPLE_NODES, binaries_present, unique_name, wait_for
from operator_harness import AuditLog, RunningOperator

ROOT = Path(__file__).resolve().parents[1]
GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
CLASS = "ambient-waypoint"
CONTROLLER = "ambientoperator.io/waypoint-controller"
MESH_LISTENER = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
HTTP_LISTENER = {"name": "http", "port": 80, "protocol": "HTTP"}
# An untainted Windows node: only the waypoint's own pinning keeps pods off it.
OPEN_WINDOWS_NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "win2022-untainted",
        "labels": {
            c.LABEL_OS: "windows",
            c.LABEL_ARCH: "amd64",
            c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022,
        },
    },
    "status": {"nodeInfo": {"kernelVersion": "10.0.20348.2762", "operatingSystem": "windows"}},
}
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def wp_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of our own with the sample nodes, an open Windows node and v1.4 CRDs."""
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}; run hack/build-binaries.sh")
    folder = gateway_api_dir("v1.4")
    if not folder.is_dir():
        pytest.fail(f"{folder} missing; run hack/build-binaries.sh")
    with LocalCluster(tmp_path_factory.mktemp("waypoint-cluster"), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [CRDS_DIR, folder], timeout=60)
            create_nodes(api, SAMPLE_NODES, timeout=60)
            create_nodes(api, [OPEN_WINDOWS_NODE], timeout=60)
            client.CoreV1Api(api).create_namespace({"metadata": {"name": "istio-system"}})
            create_mesh(api, {})
        yield local


@pytest.fixture(scope="module")
def api(wp_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin client of the module's cluster."""
    with wp_cluster.api_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def operator(
    wp_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningOperator]:
    """One operator process for the whole module, across the CRD upgrade."""
    op = RunningOperator(wp_cluster, tmp_path_factory.mktemp("waypoint-operator"))
    with op.running():
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


@pytest.fixture(scope="module", params=["v1.4", "v1.6"])
def gateway_api(
    request: pytest.FixtureRequest, api: client.ApiClient, operator: RunningOperator
) -> str:
    """The Gateway API CRDs of one release installed (v1.6 upgrades v1.4 in place)."""
    version: str = request.param
    folder = gateway_api_dir(version)
    if not folder.is_dir():
        pytest.fail(f"{folder} missing; run hack/build-binaries.sh")
    apply_dirs(api, [folder], timeout=60)
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(f"gateways.{GW_GROUP}")
    bundle = crd.metadata.annotations["gateway.networking.k8s.io/bundle-version"]
    assert bundle.startswith(version), bundle
    return version


@pytest.fixture
def ns(api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace."""
    core = client.CoreV1Api(api)
    name = unique_name(f"wp-{request.node.name}")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


# -- helpers ----------------------------------------------------------------------------


def create_gateway(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *listeners: dict[str, Any],
    class_name: str = CLASS,
    infrastructure: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "gatewayClassName": class_name,
        "listeners": list(listeners) or [MESH_LISTENER],
    }
    if infrastructure:
        spec["infrastructure"] = infrastructure
    body = {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", body
    )
    return created


def get_gateway(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", name
    )
    return obj


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in (obj.get("status") or {}).get("conditions") or []}


def condition_is(
    api: client.ApiClient,
    namespace: str,
    name: str,
    kind: str,
    status: str,
    reason: str | None = None,
) -> dict[str, Any] | None:
    """The Gateway when its `kind` condition has this status (and reason) for its generation."""
    gw = get_gateway(api, namespace, name)
    cond = conditions(gw).get(kind)
    if cond is None or cond["status"] != status:
        return None
    if reason is not None and cond["reason"] != reason:
        return None
    if cond.get("observedGeneration") != gw["metadata"]["generation"]:
        return None
    return gw


def params_map(api: client.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    body = {"metadata": {"name": name, "namespace": namespace}, "data": data}
    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_namespaced_config_map(name, namespace, {"data": data})


def waypoint_pods(api: client.ApiClient, namespace: str, name: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{c.LABEL_GATEWAY_NAME}={name}"
    )
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def node_os(api: client.ApiClient) -> dict[str, str]:
    return {
        n.metadata.name: n.metadata.labels.get(c.LABEL_OS, "")
        for n in client.CoreV1Api(api).list_node().items
    }


def events_for(api: client.ApiClient, namespace: str, name: str, reason: str) -> list[Any]:
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name},reason={reason}"
    )
    return list(events.items)


def owned_objects(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    selector = f"{c.LABEL_GATEWAY_NAME}={name}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    out: dict[str, Any] = {}
    for kind, items in (
        (
            "ServiceAccount",
            core.list_namespaced_service_account(namespace, label_selector=selector),
        ),
        ("Deployment", apps.list_namespaced_deployment(namespace, label_selector=selector)),
        ("Service", core.list_namespaced_service(namespace, label_selector=selector)),
    ):
        for item in items.items:
            out[kind] = item
    return out


# -- tests ------------------------------------------------------------------------------


def test_gateway_class_is_created_and_accepted(gateway_api: str, api: client.ApiClient) -> None:
    def accepted() -> dict[str, Any] | None:
        cls: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(
            GW_GROUP, GW_VERSION, "gatewayclasses", CLASS
        )
        cond = conditions(cls).get("Accepted")
        ok = cond and cond["status"] == "True"
        return cls if ok and cond["observedGeneration"] == cls["metadata"]["generation"] else None

    cls = wait_for(accepted, TIMEOUT, "GatewayClass Accepted")
    assert cls["spec"]["controllerName"] == CONTROLLER


def test_waypoint_runs_on_linux_only_and_is_programmed(
    gateway_api: str, api: client.ApiClient, ns: str
) -> None:
    params_map(api, ns, "wp-params", {"replicas": "6"})
    create_gateway(
        api,
        ns,
        "waypoint",
        infrastructure={
            "labels": {"team": "payments"},
            "parametersRef": {"group": "", "kind": "ConfigMap", "name": "wp-params"},
        },
    )
    gw = wait_for(
        lambda: condition_is(api, ns, "waypoint", "Programmed", "True"),
        TIMEOUT,
        "Programmed=True",
    )
    objs = owned_objects(api, ns, "waypoint")
    assert set(objs) == {"ServiceAccount", "Deployment", "Service"}
    for obj in objs.values():
        labels = obj.metadata.labels
        assert labels[c.LABEL_GATEWAY_NAME] == "waypoint"
        assert labels[c.LABEL_GATEWAY_CLASS_NAME] == CLASS
        assert labels["team"] == "payments"
        (ref,) = obj.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == (
            "Gateway",
            "waypoint",
            gw["metadata"]["uid"],
            True,
        )
    svc = objs["Service"]
    assert {(p.name, p.port) for p in svc.spec.ports} == {("status-port", 15021), ("mesh", 15008)}
    assert gw["status"]["addresses"] == [
        {"type": "IPAddress", "value": svc.spec.cluster_ip},
        {"type": "Hostname", "value": f"waypoint.{ns}.svc.cluster.local"},
    ]

    def all_running() -> list[client.V1Pod] | None:
        pods = waypoint_pods(api, ns, "waypoint")
        ok = len(pods) == 6 and all(p.status.phase == "Running" for p in pods)
        return pods if ok else None

    pods = wait_for(all_running, TIMEOUT, "6 waypoint pods running")
    systems = node_os(api)
    assert "windows" in systems.values()  # Windows nodes, tainted and not, were candidates
    assert {systems[p.spec.node_name] for p in pods} == {"linux"}
    assert all(p.spec.node_selector == {c.LABEL_OS: "linux"} for p in pods)

    # A spec change moves observedGeneration everywhere.
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GW_GROUP,
        GW_VERSION,
        ns,
        "gateways",
        "waypoint",
        {"spec": {"listeners": [MESH_LISTENER, HTTP_LISTENER]}},
    )
    gw = wait_for(
        lambda: condition_is(api, ns, "waypoint", "Accepted", "True"), TIMEOUT, "generation 2"
    )
    assert gw["metadata"]["generation"] == 2
    assert conditions(gw)["Programmed"]["observedGeneration"] == 2
    listeners = {item["name"]: item for item in gw["status"]["listeners"]}
    http = {cond["type"]: cond for cond in listeners["http"]["conditions"]}
    assert (http["Accepted"]["status"], http["Accepted"]["reason"]) == (
        "False",
        "UnsupportedProtocol",
    )
    assert "only protocol HBONE on port 15008" in http["Accepted"]["message"]
    assert all(cond["observedGeneration"] == 2 for cond in http.values())
    mesh = {cond["type"]: cond for cond in listeners["mesh"]["conditions"]}
    assert mesh["Accepted"]["status"] == mesh["Programmed"]["status"] == "True"
    assert listeners["mesh"]["supportedKinds"] == [] and listeners["mesh"]["attachedRoutes"] == 0


def test_scale_to_zero_keeps_addresses(gateway_api: str, api: client.ApiClient, ns: str) -> None:
    params_map(api, ns, "wp-params", {"replicas": "1"})
    ref = {"group": "", "kind": "ConfigMap", "name": "wp-params"}
    create_gateway(api, ns, "waypoint", infrastructure={"parametersRef": ref})
    gw = wait_for(
        lambda: condition_is(api, ns, "waypoint", "Programmed", "True"), TIMEOUT, "Programmed"
    )
    addresses = gw["status"]["addresses"]
    assert len(addresses) == 2

    params_map(api, ns, "wp-params", {"replicas": "0"})
    gw = wait_for(
        lambda: condition_is(api, ns, "waypoint", "Programmed", "False", "NoResources"),
        TIMEOUT,
        "Programmed=False/NoResources",
    )
    assert gw["status"]["addresses"] == addresses
    wait_for(lambda: not waypoint_pods(api, ns, "waypoint"), TIMEOUT, "no waypoint pods")
    assert get_gateway(api, ns, "waypoint")["status"]["addresses"] == addresses

    params_map(api, ns, "wp-params", {"replicas": "1"})
    gw = wait_for(
        lambda: condition_is(api, ns, "waypoint", "Programmed", "True"), TIMEOUT, "Programmed again"
    )
    assert gw["status"]["addresses"] == addresses


def test_only_invalid_listeners_is_not_accepted(
    gateway_api: str, api: client.ApiClient, ns: str
) -> None:
    create_gateway(api, ns, "web", HTTP_LISTENER)
    gw = wait_for(
        lambda: condition_is(api, ns, "web", "Accepted", "False", "ListenersNotValid"),
        TIMEOUT,
        "Accepted=False/ListenersNotValid",
    )
    assert conditions(gw)["Programmed"]["status"] == "False"
    (listener,) = gw["status"]["listeners"]
    accepted = next(cond for cond in listener["conditions"] if cond["type"] == "Accepted")
    assert accepted["reason"] == "UnsupportedProtocol"
    assert "HBONE" in accepted["message"] and "15008" in accepted["message"]
    assert not gw["status"].get("addresses")
    assert owned_objects(api, ns, "web") == {}


def test_gateways_of_other_classes_are_never_touched(
    gateway_api: str, api: client.ApiClient, ns: str, wp_cluster: LocalCluster
) -> None:
    custom = client.CustomObjectsApi(api)
    other = f"other-{gateway_api.replace('.', '-')}"
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(
            GW_GROUP,
            GW_VERSION,
            "gatewayclasses",
            {
                "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
                "kind": "GatewayClass",
                "metadata": {"name": other},
                "spec": {"controllerName": "example.com/someone-else"},
            },
        )
    audit = AuditLog(wp_cluster.audit_log)
    mark = audit.mark()
    create_gateway(api, ns, "foreign", class_name=other)
    create_gateway(api, ns, "istio", class_name=c.ISTIO_WAYPOINT_CLASS)
    # Ours, created last, is done only after the operator saw the others.
    create_gateway(api, ns, "ours")
    wait_for(lambda: condition_is(api, ns, "ours", "Programmed", "True"), TIMEOUT, "ours")
    for name in ("foreign", "istio"):
        gw = get_gateway(api, ns, name)
        assert {cond["reason"] for cond in conditions(gw).values()} == {"Pending"}, gw["status"]
        assert owned_objects(api, ns, name) == {}
    cls = custom.get_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses", other)
    assert not (cls.get("status") or {}).get("conditions") or {
        cond["reason"] for cond in cls["status"]["conditions"]
    } == {"Pending"}
    touched = [w for w in audit.writes(mark) if "/foreign" in w or "/istio" in w or other in w]
    assert touched == []


def test_deleting_the_gateway_removes_its_objects(
    gateway_api: str, api: client.ApiClient, ns: str
) -> None:
    create_gateway(api, ns, "waypoint")
    wait_for(lambda: condition_is(api, ns, "waypoint", "Programmed", "True"), TIMEOUT, "up")
    assert len(owned_objects(api, ns, "waypoint")) == 3
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GW_GROUP, GW_VERSION, ns, "gateways", "waypoint"
    )
    wait_for(lambda: owned_objects(api, ns, "waypoint") == {}, TIMEOUT, "garbage collection")
    wait_for(lambda: not waypoint_pods(api, ns, "waypoint"), TIMEOUT, "pods gone")


def test_no_op_pass_writes_nothing(
    gateway_api: str,
    api: client.ApiClient,
    ns: str,
    operator: RunningOperator,
    wp_cluster: LocalCluster,
) -> None:
    # Every kind of setting, so any field the server normalizes would show as a write.
    params_map(
        api,
        ns,
        "wp-params",
        {
            "replicas": "2",
            "resources": "{requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 512Mi}}",
            "nodeSelector": "{topology.kubernetes.io/zone: zone-a}",
            "tolerations": "[{key: dedicated, operator: Exists, effect: NoSchedule}]",
        },
    )
    create_gateway(
        api,
        ns,
        "waypoint",
        infrastructure={
            "labels": {"team": "a"},
            # One spec.waypoints.policy allows by default (podAnnotations).
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
            "parametersRef": {"group": "", "kind": "ConfigMap", "name": "wp-params"},
        },
    )
    # Settled: Programmed names how many pods are available, so the status is
    # last written when both replicas are (a write for the second pod after
    # the mark would be a real change, not the touch's).
    wait_for(
        lambda: (
            conditions(get_gateway(api, ns, "waypoint")).get("Programmed", {}).get("message", "")
        ).startswith("2/2 "),
        TIMEOUT,
        "both waypoint pods available",
    )
    audit = AuditLog(wp_cluster.audit_log)
    mark = audit.mark()
    # A change the waypoint does not depend on: the Gateway is re-judged, nothing is written.
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GW_GROUP, GW_VERSION, ns, "gateways", "waypoint", {"metadata": {"labels": {"touch": "1"}}}
    )
    # Any pass would not do: it may have started before the touch arrived. Two
    # barrier Gateways elsewhere, created after it on the same watch, one after
    # the other: the touched Gateway is judged no later than the first, and the
    # second's pass starts only when the first's is over (passes never overlap).
    barriers = unique_name("wp-barrier")
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": barriers}})
    try:
        for name in ("barrier-1", "barrier-2"):
            create_gateway(api, barriers, name)
            wait_for(
                lambda name=name: condition_is(api, barriers, name, "Accepted", "True"),
                TIMEOUT,
                f"{name} judged",
            )
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(barriers)
    assert [w for w in audit.writes(mark) if f"/namespaces/{ns}/" in w] == []


def test_istio_waypoint_class_defaults_pin_linux(gateway_api: str, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    selector = f"{c.LABEL_DEFAULTS_FOR_CLASS}={c.ISTIO_WAYPOINT_CLASS}"

    def pinned(name: str) -> dict[str, Any] | None:
        cm = core.read_namespaced_config_map(name, "istio-system")
        doc = yaml.safe_load((cm.data or {}).get("deployment") or "{}") or {}
        node_selector = (
            doc.get("spec", {}).get("template", {}).get("spec", {}).get("nodeSelector", {})
        )
        return doc if node_selector.get(c.LABEL_OS) == "linux" else None

    # With Windows nodes present the operator keeps istiod's defaults pinned.
    wait_for(lambda: pinned(CLASS_DEFAULTS_NAME), TIMEOUT, "class defaults ConfigMap")
    cm = core.read_namespaced_config_map(CLASS_DEFAULTS_NAME, "istio-system")
    assert cm.metadata.labels[c.LABEL_DEFAULTS_FOR_CLASS] == c.ISTIO_WAYPOINT_CLASS

    # A user's own keys survive, and a user's overlay is merged into, not replaced.
    key = f"note-{gateway_api.replace('.', '-')}"
    core.patch_namespaced_config_map(
        CLASS_DEFAULTS_NAME,
        "istio-system",
        {"data": {key: "mine", "deployment": "spec:\n  replicas: 3\n"}},
    )
    doc = wait_for(lambda: pinned(CLASS_DEFAULTS_NAME), TIMEOUT, "pin merged back")
    assert doc["spec"]["replicas"] == 3
    data = core.read_namespaced_config_map(CLASS_DEFAULTS_NAME, "istio-system").data
    assert data[key] == "mine"

    # A second defaults ConfigMap of the user's own is not the operator's to edit: it is
    # left as it is, and its lack of a pin is reported on it.
    users = f"user-defaults-{gateway_api.replace('.', '-')}"
    data = {"deployment": "metadata:\n  annotations:\n    team: mesh\n", "x": "y"}
    core.create_namespaced_config_map(
        "istio-system",
        {
            "metadata": {"name": users, "labels": {c.LABEL_DEFAULTS_FOR_CLASS: "istio-waypoint"}},
            "data": data,
        },
    )
    (event,) = wait_for(
        lambda: events_for(api, "istio-system", users, "ClassDefaultsNotPinned"),
        TIMEOUT,
        "ClassDefaultsNotPinned on the user's ConfigMap",
    )
    assert event.type == "Warning" and "kubernetes.io/os: linux" in event.message
    assert core.read_namespaced_config_map(users, "istio-system").data == data
    listed = core.list_namespaced_config_map("istio-system", label_selector=selector).items
    assert {cm.metadata.name for cm in listed} >= {CLASS_DEFAULTS_NAME, users}


def test_waypoint_pod_on_windows_is_reported(
    gateway_api: str, api: client.ApiClient, ns: str
) -> None:
    create_gateway(api, ns, "istio-wp", class_name=c.ISTIO_WAYPOINT_CLASS)
    # What istiod would run without a pin: a waypoint pod bound to a Windows node.
    client.CoreV1Api(api).create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "istio-wp-abc", "labels": {c.LABEL_GATEWAY_NAME: "istio-wp"}},
            "spec": {
                "nodeName": "win2025-1",
                "containers": [{"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.31.0"}],
            },
        },
    )
    (event,) = wait_for(
        lambda: events_for(api, ns, "istio-wp", "WaypointOnWindows"), TIMEOUT, "Warning Event"
    )
    assert event.type == "Warning"
    assert event.involved_object.kind == "Gateway"
    assert "win2025-1" in event.message


def test_use_waypoint_on_a_service_is_checked(
    gateway_api: str, api: client.ApiClient, ns: str
) -> None:
    core = client.CoreV1Api(api)
    create_gateway(api, ns, "waypoint")
    # Judged, so the operator knows the waypoint before it meets a Service naming it.
    wait_for(lambda: condition_is(api, ns, "waypoint", "Accepted", "True"), TIMEOUT, "Accepted")
    # "lost" is the barrier for "found": made after it, and checked after it in the
    # same pass (Services are checked in name order), so once lost's Event is there,
    # one about found would be too.
    for name, target in (("found", "waypoint"), ("lost", "nowhere")):
        core.create_namespaced_service(
            ns,
            {
                "metadata": {"name": name, "labels": {c.LABEL_USE_WAYPOINT: target}},
                "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
            },
        )
    (event,) = wait_for(
        lambda: events_for(api, ns, "lost", "WaypointNotFound"), TIMEOUT, "WaypointNotFound"
    )
    assert event.type == "Warning" and "nowhere" in event.message
    assert events_for(api, ns, "found", "WaypointNotFound") == []


def test_cli_waypoint_apply_enrolls_and_is_programmed(
    gateway_api: str, api: client.ApiClient, ns: str, wp_cluster: LocalCluster
) -> None:
    done = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ambient-operator"),
            "waypoint",
            "apply",
            "-n",
            ns,
            "--enroll-namespace",
            "--kubeconfig",
            str(wp_cluster.kubeconfig),
            "--wait",
            "--timeout",
            str(TIMEOUT),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT + 30,
    )
    assert done.returncode == 0, done.stderr
    assert "is Programmed" in done.stdout
    gw = get_gateway(api, ns, "waypoint")
    assert gw["spec"]["gatewayClassName"] == CLASS
    (listener,) = gw["spec"]["listeners"]
    assert {k: listener[k] for k in MESH_LISTENER} == MESH_LISTENER
    assert conditions(gw)["Programmed"]["status"] == "True"
    labels = client.CoreV1Api(api).read_namespace(ns).metadata.labels
    assert labels[c.LABEL_DATAPLANE_MODE] == "ambient"


def test_restart_writes_nothing(
    gateway_api: str,
    api: client.ApiClient,
    ns: str,
    operator: RunningOperator,
    wp_cluster: LocalCluster,
) -> None:
    create_gateway(api, ns, "waypoint")
    wait_for(lambda: condition_is(api, ns, "waypoint", "Programmed", "True"), TIMEOUT, "up")
    audit = AuditLog(wp_cluster.audit_log)
    operator.stop()
    mark = audit.mark()
    operator.start()
    # The first pass of the new process judges every Gateway, class and ConfigMap.
    wait_for(
        lambda: (
            operator.metric(
                "ambient_operator_reconcile_duration_seconds_count", controller="waypoints"
            )
            >= 1
        ),
        TIMEOUT,
        "the first waypoint pass after a restart",
    )
    # (Namespaces of earlier tests may still be terminating: their changes are real.)
    ours = (f"/namespaces/{ns}/", "/gatewayclasses", CLASS_DEFAULTS_NAME, "user-defaults")
    assert [w for w in audit.writes(mark) if any(part in w for part in ours)] == []


def test_status_write_is_conflict_safe(
    gateway_api: str, api: client.ApiClient, ns: str, wp_cluster: LocalCluster
) -> None:
    """A stale copy never overwrites newer status: the write is refused, re-read, merged."""
    custom = client.CustomObjectsApi(api)
    klass = f"conflict-{gateway_api.replace('.', '-')}"
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(
            GW_GROUP,
            GW_VERSION,
            "gatewayclasses",
            {
                "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
                "kind": "GatewayClass",
                "metadata": {"name": klass},
                "spec": {"controllerName": "example.com/conflict-test"},
            },
        )
    # A class the running operator ignores; a controller in this process writes instead.
    create_gateway(api, ns, "contested", class_name=klass)
    stale = get_gateway(api, ns, "contested")
    someone = {"type": "IPAddress", "value": "10.1.2.3"}
    custom.patch_namespaced_custom_object_status(
        GW_GROUP,
        GW_VERSION,
        ns,
        "gateways",
        "contested",
        {"status": {"addresses": [someone]}},
    )
    writer = "waypoint-conflict-test"
    own = Kube(load_credentials(str(wp_cluster.user_kubeconfig(writer, ["system:masters"]))))
    ctl = WaypointController(ClusterState(), own, EventRecorder(own))
    key = (ns, "contested")
    ctl.gateways[key] = stale
    # Only objects the Gateway controls count for its status.
    ours = [
        {
            "kind": "Gateway",
            "name": "contested",
            "uid": stale["metadata"]["uid"],
            "controller": True,
        }
    ]
    ctl.objects[key] = {
        ("apps/v1", "Deployment", ns, "contested"): {
            "metadata": {"ownerReferences": ours},
            "status": {"availableReplicas": 1},
        },
        ("v1", "Service", ns, "contested"): {
            "metadata": {"name": "contested", "namespace": ns, "ownerReferences": ours},
            "spec": {"clusterIP": "10.96.7.7", "clusterIPs": ["10.96.7.7"]},
        },
    }
    spec = AmbientMeshSpec()
    result = render_waypoint(spec, stale, {"spec": {"controllerName": "x"}}, {})
    audit = AuditLog(wp_cluster.audit_log)
    mark = audit.mark()
    try:
        assert asyncio.run(ctl._write_status(spec, key, result, None))
    finally:
        ctl.close()
        own.close()
    addresses = get_gateway(api, ns, "contested")["status"]["addresses"]
    assert addresses == [
        someone,
        {"type": "IPAddress", "value": "10.96.7.7"},
        {"type": "Hostname", "value": f"contested.{ns}.svc.cluster.local"},
    ]
    codes = [
        e["responseStatus"]["code"]
        for e in audit.events(mark, user=writer)
        if e["verb"] == "patch"
        and e.get("requestURI", "").startswith(
            f"/apis/{GW_GROUP}/{GW_VERSION}/namespaces/{ns}/gateways/contested/status"
        )
    ]
    assert codes == [409, 200], codes
