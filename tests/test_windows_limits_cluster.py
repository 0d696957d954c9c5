"""Enrolled pods on a Windows node against the reported HNS limit, on a live control plane
(issue 43, item 5; microsoft/hcsshim#2571).

kwok runs the sample's Windows Server 2022 node `win2022-1`. Pods are bound
to it by name in an enrolled namespace. With
spec.platforms.windows.enrolledPodsPerNodeLimit set two above what the node
already holds: two pods stay at the limit (no Warning, no count), a third
goes past it (a Warning Event on the AmbientMesh, status.windows counting
the node). "No Warning" is read only after a full data-plane pass begun
later has started: the pass that counted the pods posts its Events before it
ends, and passes never overlap. Expected messages and counts are literal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import get_mesh, set_mesh_spec
from conftest import namespaces_settled, unique_name, wait_for
from operator_harness import (
    RunningOperator,
    full_passes_finished,
    sample_mesh_operator,
)

NODE = "win2022-1"
REASON = "WindowsPodLimitExceeded"
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator, with the sample mesh Reconciled."""
    with sample_mesh_operator(cluster, k8s, tmp_path_factory.mktemp("operator"), TIMEOUT) as op:
        yield op


def _enrolled_on_node(k8s: client.ApiClient) -> int:
    """The oracle: pods bound to NODE in a namespace labelled ambient, not opted out, not on
    the host network, not finished (shared DESIGN §1)."""
    core = client.CoreV1Api(k8s)
    ambient = {
        ns.metadata.name
        for ns in core.list_namespace().items
        if (ns.metadata.labels or {}).get("istio.io/dataplane-mode") == "ambient"
    }
    return sum(
        1
        for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items
        if pod.metadata.namespace in ambient
        and (pod.metadata.labels or {}).get("istio.io/dataplane-mode") != "none"
        and not pod.spec.host_network
        and pod.status.phase not in ("Succeeded", "Failed")
    )


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "os": {"name": "windows"},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "app", "image": "mcr.microsoft.com/windows/nanoserver:ltsc2022"}
            ],
        },
    }


def _windows(k8s: client.ApiClient) -> dict[str, Any]:
    return dict((get_mesh(k8s).get("status") or {}).get("windows") or {})


def _warnings(k8s: client.ApiClient) -> list[str]:
    uid = get_mesh(k8s)["metadata"]["uid"]
    return [
        e.message
        for e in client.CoreV1Api(k8s).list_namespaced_event("default").items
        if e.reason == REASON and e.involved_object.uid == uid and e.type == "Warning"
    ]


def test_a_windows_node_past_the_pod_limit_is_warned_of(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    core = client.CoreV1Api(k8s)
    # The counts below are cluster-wide: pods of an earlier module's namespace,
    # still being deleted, would leave them mid-test.
    namespaces_settled(k8s)
    before = _enrolled_on_node(k8s)
    limit = before + 2
    spec = dict(get_mesh(k8s)["spec"])
    spec["platforms"]["windows"]["enrolledPodsPerNodeLimit"] = limit
    set_mesh_spec(k8s, spec)
    wait_for(lambda: _windows(k8s).get("podLimit") == limit, TIMEOUT, "the limit in status")
    status = _windows(k8s)
    assert status["nodesOverPodLimit"] == 0, status
    assert [line.split(":")[0] for line in status["limits"]] == [
        "enrollment on Windows is not fail-closed",
        "the HNS L4WFPPROXY policy was reported to fail beyond about 15 pods per node "
        "(microsoft/hcsshim#2571, on AKS Windows Server 2022)",
        "Windows redirection is TCP and IPv4 only",
        "Windows agents are amd64 only",
    ]
    name = unique_name("win-pods")
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}
    )
    try:
        wait_for(lambda: core.read_namespaced_service_account("default", name), TIMEOUT, "SA")
        base = get_mesh(k8s)["status"]["enrollment"]["windowsPods"]

        def windows_pods() -> int:
            now = get_mesh(k8s)["status"]["enrollment"]["windowsPods"]
            return sum(int(now[s]) - int(base[s]) for s in ("enabled", "pending", "missing"))

        # At the limit: counted, and no Warning once a later pass has begun.
        for i in range(2):
            core.create_namespaced_pod(name, _pod(f"app-{i}"))
        wait_for(lambda: windows_pods() == 2, TIMEOUT, "two Windows pods counted")
        assert _enrolled_on_node(k8s) == limit
        full_passes_finished(k8s, operator, 1, TIMEOUT)
        assert _windows(k8s)["nodesOverPodLimit"] == 0
        assert _warnings(k8s) == []

        # One past it: the node is counted and named in a Warning.
        core.create_namespaced_pod(name, _pod("app-2"))
        wait_for(lambda: windows_pods() == 3, TIMEOUT, "three Windows pods counted")
        full_passes_finished(k8s, operator, 1, TIMEOUT)
        status = _windows(k8s)
        assert (status["nodesOverPodLimit"], status["exampleNodesOverPodLimit"]) == (
            1,
            [f"{NODE}: {limit + 1} enrolled pods"],
        )
        (warned,) = _warnings(k8s)
        assert warned.startswith(
            f"1 Windows node(s) hold more than {limit} enrolled pods "
            f"({NODE}: {limit + 1} enrolled pods): the HNS L4WFPPROXY policy"
        ), warned
        assert "microsoft/hcsshim#2571" in warned
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
        spec["platforms"]["windows"].pop("enrolledPodsPerNodeLimit", None)
        set_mesh_spec(k8s, spec)
