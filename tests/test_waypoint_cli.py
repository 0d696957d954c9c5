"""`ambient-operator waypoint list` and `delete` on the session's control plane (issue 34).

A fixed set of Gateways: two of the operator's class, one of istiod's
(`istio-waypoint`), one of another class; statuses and the waypoints'
Deployments written here as the controllers would. The output is literal,
with istioctl's columns (NAME, REVISION, TRAFFIC TYPE, PROGRAMMED) and ours
(WHOSE, OS). `delete --all` takes both waypoint classes and nothing else;
what a deleted Gateway owns goes by the garbage collector, the rest stays.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster
from conftest import BIN_DIR, unique_name, wait_for

NS, OTHER_NS = unique_name("wp-cli"), unique_name("wp-cli-b")
GROUP, VERSION = "gateway.networking.k8s.io", "v1"


def _gateway(namespace: str, name: str, klass: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "gatewayClassName": klass,
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


def _deployment(gw: dict[str, Any], pinned: bool) -> dict[str, Any]:
    """A waypoint Deployment as its controller makes it: owned by the Gateway."""
    meta = gw["metadata"]
    pod: dict[str, Any] = {"containers": [{"name": "istio-proxy", "image": "x/proxyv2:1"}]}
    if pinned:
        pod["nodeSelector"] = {"kubernetes.io/os": "linux"}
    return {
        "metadata": {
            "name": meta["name"],
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Gateway",
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"gw": meta["name"]}},
            "template": {"metadata": {"labels": {"gw": meta["name"]}}, "spec": pod},
        },
    }


@pytest.fixture(scope="module")
def waypoints(
    k8s: client.ApiClient, gateway_api_crds: None, crds_installed: None
) -> Iterator[dict[str, str]]:
    """The Gateways, statuses and Deployments; their UIDs by name."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    for ns in (NS, OTHER_NS):
        core.create_namespace({"metadata": {"name": ns}})
    made = {}
    for namespace, name, klass, labels in (
        (NS, "alpha", "ambient-waypoint", {"istio.io/waypoint-for": "all"}),
        (NS, "beta", "istio-waypoint", {"istio.io/rev": "canary"}),
        (NS, "ingress", "other-class", {}),
        (OTHER_NS, "gamma", "ambient-waypoint", {}),
    ):
        body = _gateway(namespace, name, klass, labels)
        made[name] = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "gateways", body
        )
    now = "2026-12-06T00:00:00Z"
    programmed = {
        "type": "Programmed",
        "status": "True",
        "reason": "Programmed",
        "message": "ready",
        "lastTransitionTime": now,
        "observedGeneration": 1,
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "gateways", "alpha", {"status": {"conditions": [programmed]}}
    )
    apps.create_namespaced_deployment(NS, _deployment(made["alpha"], pinned=True))
    apps.create_namespaced_deployment(NS, _deployment(made["beta"], pinned=False))
    keeper = core.create_namespaced_config_map(NS, {"metadata": {"name": "keeper"}})
    uids = {name: str(gw["metadata"]["uid"]) for name, gw in made.items()}
    uids["keeper"] = str(keeper.metadata.uid)
    yield uids
    for ns in (NS, OTHER_NS):
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "ambient-operator"
    return subprocess.run(
        [str(binary), "waypoint", *args, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_list_shows_both_classes_with_whose_and_os(
    cluster: LocalCluster, waypoints: dict[str, str]
) -> None:
    done = cli(cluster, "list", "-n", NS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "NAME      REVISION     TRAFFIC TYPE     PROGRAMMED     WHOSE                OS\n"
        "alpha     default      all              True           ambient-operator     linux\n"
        "beta      canary       none             Unknown        istiod               any\n"
    )


def test_list_all_namespaces_adds_the_namespace(
    cluster: LocalCluster, waypoints: dict[str, str]
) -> None:
    done = cli(cluster, "list", "-A")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "REVISION", "TRAFFIC", "TYPE", "PROGRAMMED", "WHOSE", "OS"
    ]  # fmt: skip
    ours = [line.split() for line in lines[1:] if line.startswith((NS, OTHER_NS))]
    # Gateway API's CRD starts Programmed at Unknown; only alpha's status was written.
    assert ours == sorted(
        [
            [NS, "alpha", "default", "all", "True", "ambient-operator", "linux"],
            [NS, "beta", "canary", "none", "Unknown", "istiod", "any"],
            [OTHER_NS, "gamma", "default", "none", "Unknown", "ambient-operator", "-"],
        ]
    )


def test_kubectl_ambient_is_the_same_command_with_kubectls_flags(
    cluster: LocalCluster, waypoints: dict[str, str], tmp_path: Path
) -> None:
    """The real kubectl finds the plugin on PATH and passes -n, --kubeconfig, --context."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    (local,) = config["contexts"]
    # Two contexts: the current one dials nothing; --context picks the cluster's.
    config["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}})
    config["contexts"].append(
        {"name": "nowhere", "context": {"cluster": "nowhere", "user": local["context"]["user"]}}
    )
    config["current-context"] = "nowhere"
    two = tmp_path / "two-contexts.yaml"
    two.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    kubectl = [str(BIN_DIR / "kubectl"), "ambient", "waypoint", "list", "-n", NS]
    done = subprocess.run(
        [*kubectl, "--kubeconfig", str(two), "--context", local["name"]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == cli(cluster, "list", "-n", NS).stdout
    assert done.stdout.startswith("NAME      REVISION     TRAFFIC TYPE")
    # Without --context, the current one: nothing answers there.
    done = subprocess.run(
        [*kubectl, "--kubeconfig", str(two)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode != 0
    assert "port=1" in done.stderr and "Connection refused" in done.stderr, done.stderr


def test_status_wait_prints_each_change_and_gives_up_with_the_gateways_message(
    cluster: LocalCluster, k8s: client.ApiClient, waypoints: dict[str, str]
) -> None:
    # Nothing programs gamma: the wait ends at its timeout, with the condition's own words
    # (Gateway API's CRD default until a controller writes one).
    done = cli(cluster, "status", "gamma", "-n", OTHER_NS, "--wait", "--timeout", "2")
    assert done.returncode == 1
    assert done.stdout == (
        "NAME  STATUS  TYPE  REASON  MESSAGE\n"
        "gamma  Unknown  Programmed  Pending  Waiting for controller\n"
    )
    assert done.stderr == (
        f"error: waypoint {OTHER_NS}/gamma not Programmed after 2s: "
        "Programmed=Unknown Pending: Waiting for controller\n"
    )
    binary = Path(sys.executable).parent / "ambient-operator"
    argv = [str(binary), "waypoint", "status", "gamma", "-n", OTHER_NS, "--wait"]
    proc = subprocess.Popen(
        [*argv, "--timeout", "60", "--kubeconfig", str(cluster.kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "NAME  STATUS  TYPE  REASON  MESSAGE\n"
        assert proc.stdout.readline().startswith("gamma  Unknown  ")
        # The waiting command has printed its first state: now the controller's word.
        condition = {
            "type": "Programmed",
            "status": "True",
            "reason": "Programmed",
            "message": "ready",
            "lastTransitionTime": "2026-12-06T00:00:00Z",
            "observedGeneration": 1,
        }
        client.CustomObjectsApi(k8s).patch_namespaced_custom_object_status(
            GROUP, VERSION, OTHER_NS, "gateways", "gamma", {"status": {"conditions": [condition]}}
        )
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == "gamma  True  Programmed  Programmed  ready\n"
    finally:
        proc.kill()


def test_generate_prints_the_gateway_apply_writes(cluster: LocalCluster) -> None:
    done = cli(cluster, "generate", "-n", "shop", "--name", "wp", "--for", "all")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "apiVersion: gateway.networking.k8s.io/v1\n"
        "kind: Gateway\n"
        "metadata:\n"
        "  name: wp\n"
        "  namespace: shop\n"
        "  labels:\n"
        "    istio.io/waypoint-for: all\n"
        "spec:\n"
        "  gatewayClassName: ambient-waypoint\n"
        "  listeners:\n"
        "  - name: mesh\n"
        "    port: 15008\n"
        "    protocol: HBONE\n"
    )


def test_delete_all_takes_waypoints_only_and_leaves_the_rest_to_the_collector(
    cluster: LocalCluster, k8s: client.ApiClient, waypoints: dict[str, str]
) -> None:
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)

    def gateway_uid(name: str) -> str | None:
        try:
            gw = custom.get_namespaced_custom_object(GROUP, VERSION, NS, "gateways", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return str(gw["metadata"]["uid"])

    done = cli(cluster, "delete", "--all", "-n", NS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"waypoint {NS}/alpha deleted\nwaypoint {NS}/beta deleted\n"
    # Another class stays, and so does what no Gateway owns.
    assert gateway_uid("ingress") == waypoints["ingress"]
    assert core.read_namespaced_config_map("keeper", NS).metadata.uid == waypoints["keeper"]
    # The deleted waypoints' own Deployments go by the garbage collector.
    wait_for(
        lambda: not apps.list_namespaced_deployment(NS).items,
        60,
        "the deleted waypoints' Deployments collected",
    )
    # Another class only by name; a name that is not there is said and fails.
    done = cli(cluster, "delete", "ingress", "missing", "-n", NS)
    assert done.returncode == 1
    assert done.stdout == f"waypoint {NS}/missing not found\nwaypoint {NS}/ingress deleted\n"
    assert gateway_uid("ingress") is None
    done = cli(cluster, "delete", "-n", NS)
    assert done.returncode == 1
    assert "name one or more waypoints, or give --all" in done.stderr
