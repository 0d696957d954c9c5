"""`ambient-operator status` (and `kubectl ambient status`) on a fixed state (issue 34, item 3).

The module has a control plane of its own: the sample nodes (Linux, WS2022,
WS2025 and an unsupported WS2019), the operator running with the sample
AmbientMesh and no istiod (so Degraded names it), an enrolled namespace
with a pod on each OS in a known redirection state, and waypoints of both
classes. The output is compared with literal text and JSON. It runs as a
user bound to a ClusterRole of get and list only, and the API server's audit
log shows that user only read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import LocalCluster, apply_objects
from ambient_devcluster.harness import get_mesh
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshStatus
from ambient_operator.cli.status import agent_versions, platform_table, platforms
from conftest import REPO_ROOT, grant, own_cluster, run_kubectl, wait_for
from operator_harness import AuditLog, RunningOperator

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
APP_NS = "shop"
READER = "status-reader"
TIMEOUT = 90.0
# Everything the command reads, and only get and list.
READ_ONLY_RULES = [
    {"apiGroups": [c.API_GROUP], "resources": ["ambientmeshes"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["nodes", "namespaces", "pods"], "verbs": ["get", "list"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
    {"apiGroups": [GW_GROUP], "resources": ["gateways"], "verbs": ["get", "list"]},
    {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list"]},
]


@pytest.fixture(scope="module")
def status_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path_factory, "status-cluster") as local:
        with local.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": "istio-system"}})
        yield local


@pytest.fixture(scope="module")
def api(status_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    with status_cluster.api_client() as admin:
        yield admin


def _pod(name: str, node: str, windows: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "app", "image": "registry.example/app:1"}],
    }
    if windows:
        spec["os"] = {"name": "windows"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": spec,
    }


def _gateway(name: str, klass: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {
            "gatewayClassName": klass,
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


@pytest.fixture(scope="module")
def fixed_state(
    status_cluster: LocalCluster, api: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The operator, the sample mesh, an app namespace with three pods, two waypoints."""
    op = RunningOperator(status_cluster, tmp_path_factory.mktemp("status-operator"))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    with op.running():
        sample = REPO_ROOT / "operator" / "ambient_operator" / "samples" / "ambientmesh.yaml"
        apply_objects(api, [yaml.safe_load(sample.read_text())])
        core.create_namespace(
            {"metadata": {"name": APP_NS, "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}}
        )
        wait_for(lambda: core.read_namespaced_service_account("default", APP_NS), 30, "SA")
        # Linux: redirected (what istio-cni writes; no CNI runs under kwok). WS2025: pending.
        # WS2022: nothing, and no webhook ran, so it lacks the redirection-wait init container.
        for name, node, windows, redirection in (
            ("web", "linux-amd64-1", False, "enabled"),
            ("win-new", "win2025-1", True, "pending"),
            ("win-old", "win2022-1", True, None),
        ):
            core.create_namespaced_pod(APP_NS, _pod(name, node, windows))
            if redirection:
                core.patch_namespaced_pod_status(
                    name,
                    APP_NS,
                    {"metadata": {"annotations": {c.ANNOTATION_REDIRECTION: redirection}}},
                )
        for name, klass in (("wp", "ambient-waypoint"), ("istio-wp", "istio-waypoint")):
            custom.create_namespaced_custom_object(
                GW_GROUP, GW_VERSION, APP_NS, "gateways", _gateway(name, klass)
            )

        def settled() -> bool:
            status = get_mesh(api).get("status") or {}
            enrollment = status.get("enrollment") or {}
            wp = custom.get_namespaced_custom_object(GW_GROUP, GW_VERSION, APP_NS, "gateways", "wp")
            programmed = any(
                cond["type"] == "Programmed" and cond["status"] == "True"
                for cond in (wp.get("status") or {}).get("conditions") or []
            )
            return (
                programmed
                and status.get("readyComponents") == "6/6"
                and enrollment.get("linuxPods") == {"enabled": 1, "pending": 0, "missing": 0}
                and enrollment.get("windowsPods") == {"enabled": 0, "pending": 1, "missing": 1}
                and enrollment.get("workaroundMisses") == 1
            )

        wait_for(settled, TIMEOUT, "the mesh's status to count the fixed state")
        yield
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def status(kubeconfig: Path, *args: str, kubectl: bool = False) -> subprocess.CompletedProcess[str]:
    """The command; with `kubectl`, as `kubectl ambient status` through the real kubectl,
    which finds the plugin on PATH."""
    here = Path(sys.executable).parent
    argv = ["status", "--kubeconfig", str(kubeconfig), *args]
    if kubectl:
        return run_kubectl(["ambient", *argv], here)
    return subprocess.run(
        [str(here / "ambient-operator"), *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _root_cause(api: client.ApiClient) -> dict[str, str]:
    """The Degraded condition as the API server holds it: the command shows its words."""
    (degraded,) = [
        cond for cond in get_mesh(api)["status"]["conditions"] if cond["type"] == "Degraded"
    ]
    # No istiod is installed: the most severe problem, so the root cause.
    assert degraded["status"] == "True" and degraded["reason"] == "IstiodNotFound"
    assert degraded["message"].startswith("Service istio-system/istiod not found")
    return {k: degraded[k] for k in ("status", "reason", "message")}


def expected_text(root_cause: dict[str, str]) -> str:
    return (
        "AmbientMesh default: Reconciled=True Ready=True Degraded=True\n"
        f"  Root cause: IstiodNotFound: {root_cause['message']}\n"
        "Versions: agents 1.31.0 (from spec), istiod unknown\n"
        "\n"
        "PLATFORM                             NODES             ZTUNNEL     "
        "ISTIO-CNI     RUNNING     ROLLOUT\n"
        "Linux                                3                 3/3         "
        "3/3           1.31.0      -\n"
        "Windows Server 2019 (10.0.17763)     1 unsupported     -           "
        "-             -           -\n"
        "Windows Server 2022 (10.0.20348)     1                 1/1         "
        "1/1           1.31.0      -\n"
        "Windows Server 2025 (10.0.26100)     1                 1/1         "
        "1/1           1.31.0      -\n"
        "\n"
        "Enrolled namespaces: 1; pods redirected (enabled/pending/missing): "
        "Linux 1/0/0, Windows 0/1/1\n"
        "NAMESPACE     LINUX     WINDOWS\n"
        "shop          1/0/0     0/1/1\n"
        "\n"
        "Waypoints:\n"
        "NAMESPACE     NAME         REVISION     TRAFFIC TYPE     PROGRAMMED     "
        "WHOSE                OS\n"
        "shop          istio-wp     default      none             Unknown        "
        "istiod               -\n"
        "shop          wp           default      none             True           "
        "ambient-operator     linux\n"
        "\n"
        "Webhook misses: 1 Windows pod(s) admitted without the redirection-wait init container\n"
        "  shop/win-old: ScheduledOnPreWS2025Node: bound to node win2022-1 (build 10.0.20348)\n"
    )  # fmt: skip


def test_status_shows_the_fixed_state(
    status_cluster: LocalCluster, api: client.ApiClient, fixed_state: None
) -> None:
    done = status(status_cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_text(_root_cause(api))


def _agents(n: int) -> dict[str, int]:
    return {"ready": n, "desired": n, "updated": n}


def test_status_json_is_the_same_state(
    status_cluster: LocalCluster, api: client.ApiClient, fixed_state: None
) -> None:
    done = status(status_cluster.kubeconfig, "-o", "json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    conditions = body.pop("conditions")
    assert sorted(conditions) == ["Degraded", "Ready", "Reconciled"]
    assert conditions["Degraded"] == body["rootCause"] == _root_cause(api)
    assert conditions["Ready"]["status"] == conditions["Reconciled"]["status"] == "True"
    waypoint_row = {"namespace": APP_NS, "revision": "default", "trafficType": "none"}
    assert body == {
        "mesh": "default",
        "found": True,
        "generation": 1,
        "observedGeneration": 1,
        "rootCause": body["rootCause"],
        "versions": {
            "istiod": None,
            "agents": "1.31.0",
            "source": "spec",
            "rolling": None,
            "waiting": [],
        },
        "platforms": [
            {
                "platform": "linux",
                "name": "Linux",
                "nodes": 3,
                "supported": True,
                "ztunnel": _agents(3),
                "istioCni": _agents(3),
                "running": {"1.31.0": 6},
                "rollout": None,
            },
            {
                "platform": "10.0.17763",
                "name": "Windows Server 2019 (10.0.17763)",
                "nodes": 1,
                "supported": False,
                "ztunnel": None,
                "istioCni": None,
                "running": {},
                "rollout": None,
            },
            *(
                {
                    "platform": build,
                    "name": f"Windows Server {release} ({build})",
                    "nodes": 1,
                    "supported": True,
                    "ztunnel": _agents(1),
                    "istioCni": _agents(1),
                    "running": {"1.31.0": 2},
                    "rollout": None,
                }
                for build, release in (("10.0.20348", "2022"), ("10.0.26100", "2025"))
            ),
        ],
        "enrollment": {
            "namespaces": 1,
            "linuxPods": {"enabled": 1, "pending": 0, "missing": 0},
            "windowsPods": {"enabled": 0, "pending": 1, "missing": 1},
            "byNamespace": [
                {
                    "namespace": APP_NS,
                    "linux": {"enabled": 1, "pending": 0, "missing": 0},
                    "windows": {"enabled": 0, "pending": 1, "missing": 1},
                }
            ],
        },
        "waypoints": [
            {
                **waypoint_row,
                "name": "istio-wp",
                "programmed": "Unknown",
                "whose": "istiod",
                "os": "-",
            },
            {
                **waypoint_row,
                "name": "wp",
                "programmed": "True",
                "whose": "ambient-operator",
                "os": "linux",
            },
        ],
        "webhook": {
            "misses": 1,
            "imageUnavailable": 0,
            "pods": [
                "shop/win-old: ScheduledOnPreWS2025Node: bound to node win2022-1 (build 10.0.20348)"
            ],
        },
        "unreadable": [],
    }


def test_a_user_with_get_and_list_only_sees_the_same_and_writes_nothing(
    status_cluster: LocalCluster, api: client.ApiClient, fixed_state: None
) -> None:
    grant(api, READER, READ_ONLY_RULES)
    kubeconfig = status_cluster.user_kubeconfig(READER)
    audit = AuditLog(status_cluster.audit_log)
    since = audit.mark()
    # RBAC may take a moment to reach the authorizer's cache.
    done = wait_for(
        lambda: (d := status(kubeconfig)).returncode == 0 and "Not readable" not in d.stdout and d,
        30,
        "the reader's role in effect",
    )
    assert done.stdout == expected_text(_root_cause(api))
    events = audit.events(since, user=READER)
    assert events
    assert sorted({e["verb"] for e in events}) == ["get", "list"]


def test_a_user_without_rights_is_told_what_it_could_not_read(
    status_cluster: LocalCluster, fixed_state: None
) -> None:
    done = status(status_cluster.user_kubeconfig("nobody-in-particular"))
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("AmbientMesh default: not readable\n"), done.stdout
    assert done.stdout.endswith(
        "Not readable with these credentials (left out above):\n"
        "  ambientmeshes: Forbidden\n"
        "  nodes: Forbidden\n"
        "  pods: Forbidden\n"
        "  namespaces: Forbidden\n"
        "  runtimeclasses: Forbidden\n"
        "  gateways: Forbidden\n"
        "  deployments: Forbidden\n"
    ), done.stdout


def test_kubectl_ambient_status_is_the_same_command(
    status_cluster: LocalCluster, api: client.ApiClient, fixed_state: None
) -> None:
    done = status(status_cluster.kubeconfig, kubectl=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_text(_root_cause(api))


def _component(
    name: str, component: str, platform: str, desired: int, updated: int, ready: int
) -> dict[str, Any]:
    return {
        "name": name,
        "component": component,
        "platform": platform,
        "desired": desired,
        "current": desired,
        "updated": updated,
        "ready": ready,
        "available": ready,
    }


def _agent_pod(name: str, daemonset: str, image: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "istio-system",
            "ownerReferences": [{"kind": "DaemonSet", "name": daemonset}],
        },
        "spec": {"containers": [{"name": "agent", "image": image}]},
    }


def test_a_rollout_shows_the_platform_rolling_and_those_waiting() -> None:
    """Offline: a status in the middle of 1.31.0 to 1.31.1, WS2022 rolling, WS2025 waiting."""
    ws2022, ws2025 = "10.0.20348", "10.0.26100"
    mesh_status = AmbientMeshStatus.model_validate(
        {
            "components": [
                _component("ztunnel", "ztunnel", "linux", 3, 3, 3),
                _component("istio-cni-node", "istio-cni", "linux", 3, 3, 3),
                _component("ztunnel-ws2022", "ztunnel", ws2022, 2, 1, 1),
                _component("istio-cni-ws2022", "istio-cni", ws2022, 2, 2, 2),
                _component("ztunnel-ws2025", "ztunnel", ws2025, 1, 1, 1),
                _component("istio-cni-ws2025", "istio-cni", ws2025, 1, 1, 1),
            ],
            "nodes": {
                "total": 6,
                "linux": 3,
                "windows": 3,
                "windowsBuilds": [
                    {
                        "build": ws2022,
                        "release": "Windows Server 2022",
                        "nodes": 2,
                        "supported": True,
                    },
                    {
                        "build": ws2025,
                        "release": "Windows Server 2025",
                        "nodes": 1,
                        "supported": True,
                    },
                ],
            },
            "versions": {
                "controlPlane": "1.31.1",
                "dataPlane": "1.31.1",
                "rolling": ws2022,
                "waiting": [ws2025],
            },
        }
    )
    pods = [
        *(_agent_pod(f"z{i}", "ztunnel", "docker.io/istio/ztunnel:1.31.1") for i in range(3)),
        *(
            _agent_pod(f"c{i}", "istio-cni-node", "docker.io/istio/install-cni:1.31.1")
            for i in range(3)
        ),
        _agent_pod("zw0", "ztunnel-ws2022", "registry.example.com/ztunnel-windows:1.31.1"),
        _agent_pod("zw1", "ztunnel-ws2022", "registry.example.com/ztunnel-windows:1.31.0"),
        _agent_pod("cw0", "istio-cni-ws2022", "registry.example.com/install-cni-windows:1.31.0"),
        _agent_pod("cw1", "istio-cni-ws2022", "registry.example.com/install-cni-windows:1.31.0"),
        _agent_pod("zn0", "ztunnel-ws2025", "registry.example.com/ztunnel-windows:1.31.0"),
        _agent_pod("cn0", "istio-cni-ws2025", "registry.example.com/install-cni-windows:1.31.0"),
        # Not an agent: another namespace, or no DaemonSet of the mesh owns it.
        {
            **_agent_pod("x", "ztunnel", "docker.io/istio/ztunnel:9.9.9"),
            "metadata": {"namespace": "app"},
        },
        _agent_pod("y", "someone-elses", "example.com/agent:9.9.9"),
    ]
    running = agent_versions(pods, "istio-system", list(mesh_status.components))
    assert platform_table(platforms(mesh_status, running)) == (
        "PLATFORM                             NODES     ZTUNNEL     ISTIO-CNI     "
        "RUNNING                    ROLLOUT\n"
        "Linux                                3         3/3         3/3           "
        "1.31.1                     -\n"
        "Windows Server 2022 (10.0.20348)     2         1/2         2/2           "
        "1.31.0 (3), 1.31.1 (1)     to 1.31.1 (3/4 pods updated)\n"
        "Windows Server 2025 (10.0.26100)     1         1/1         1/1           "
        "1.31.0                     waits for Windows Server 2022 (10.0.20348)"
    )  # fmt: skip
