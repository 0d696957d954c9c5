"""Chaos (issue 18): etcd compacted under churn, so that every watch must list again (410).

The operator is frozen (SIGSTOP) and kube-apiserver restarted, which ends
its watch connections (a connection left open would buffer the events in
the frozen process's socket and deliver them after all). Then the cluster
changes under it: pods, Nodes and Gateways are deleted and others created.
etcd is compacted at its current revision through its own API, and
kube-apiserver restarted again, so its watch cache, which would otherwise
still serve the old revisions from memory, starts at the compacted one:
every watch the operator resumes from a version it saw before is answered
410 Gone, and each kind must be listed again. What was deleted in the gap
is reported by no event; the informers' lists (kube/informer.py) find it
gone, and each list forgets what a cache holds that it does not
(app/watches.py). After the operator resumes, and more changes are made, everything it reports and
writes must match the cluster as it is:

- enrollment lists the pods that exist, not the ones deleted in the gap;
- the node inventory counts the Nodes that exist, and names the unsupported
  one created in the gap, not the one deleted in it;
- Gateways made in the gap and after it are Programmed, and nothing is made
  again for the Gateway deleted in the gap;
- the agents' DaemonSets are what tests/oracle.py says of the live Nodes.

The audit log shows that the pod watch resumed from a version older than
the compaction and that pods were listed again after it.
"""

from __future__ import annotations

import base64
import json
import signal
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

from ambient_devcluster import LocalCluster, create_nodes, delete_nodes
from ambient_devcluster.harness import get_mesh, windows_node
from conftest import ignoring, unique_name, wait_for
from operator_harness import OPERATOR_USER, AuditLog, RunningOperator
from test_chaos import audit, istio_env, kube, mesh, wait_converged
from test_chaos_waypoints import GW_GROUP, GW_VERSION, _gateway, _programmed, operator

# Reused, not copied: the module fixtures of test_chaos, and the operator of
# test_chaos_waypoints (a fresh process with the default 300 s resync, so no
# periodic pass hides a ghost).
__all__ = ["audit", "istio_env", "kube", "mesh", "operator"]

TIMEOUT = 120.0
LISTS = "ambient_operator_watch_lists_total"
GHOSTS = "ambient_operator_cache_ghosts_total"
# Windows Server 2019: a build the agents do not support, so it is named in status.
WS2019 = "10.0.17763"


def _etcd(cluster: LocalCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A call to etcd's JSON gateway (its v3 API over HTTP)."""
    request = urllib.request.Request(
        cluster.etcd_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def compact_etcd(cluster: LocalCluster) -> int:
    """Compact etcd at its current revision; that revision."""
    probe = _etcd(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/registry").decode()})
    revision = int(probe["header"]["revision"])
    _etcd(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "docker.io/library/nginx:1"}]},
    }


def _ambient_namespace(core: client.CoreV1Api, name: str, pods: list[str]) -> None:
    core.create_namespace(
        {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}
    )
    wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "its SA")
    for pod in pods:
        core.create_namespaced_pod(name, _pod(pod))


def _status(k8s: client.ApiClient) -> dict[str, Any]:
    status: dict[str, Any] = get_mesh(k8s).get("status") or {}
    return status


def _examples(k8s: client.ApiClient) -> list[str]:
    examples: list[str] = (_status(k8s).get("enrollment") or {}).get("examplePendingPods") or []
    return examples


def _unsupported(k8s: client.ApiClient) -> set[str]:
    nodes = _status(k8s).get("nodes") or {}
    return {n["name"] for n in nodes.get("unsupportedNodes") or []}


def _query(event: dict[str, Any]) -> dict[str, list[str]]:
    return parse_qs(urlparse(str(event.get("requestURI"))).query)


def test_compaction_under_churn_loses_nothing_and_leaves_nothing_stale(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    kube: Any,
    operator: RunningOperator,
    audit: AuditLog,
) -> None:
    core, custom = client.CoreV1Api(k8s), client.CustomObjectsApi(k8s)
    wait_converged(k8s, kube, "converged before the churn", operator)
    # Names that sort first, so they lead the status's bounded example lists.
    tag = unique_name("0-compact")
    first, second, gateways = f"{tag}-a", f"{tag}-b", f"{tag}-gw"
    old_node, new_node = f"{tag}-old", f"{tag}-new"
    namespaces = [first, second, gateways]
    try:
        _ambient_namespace(core, first, [f"p-{i}" for i in range(4)])
        core.create_namespace({"metadata": {"name": gateways}})
        custom.create_namespaced_custom_object(
            GW_GROUP, GW_VERSION, gateways, "gateways", _gateway("before")
        )
        create_nodes(k8s, [windows_node(old_node, WS2019)], timeout=60)
        wait_for(
            lambda: _examples(k8s)[:4] == [f"{first}/p-{i}" for i in range(4)],
            TIMEOUT,
            "the first namespace's pods listed",
        )
        wait_for(lambda: old_node in _unsupported(k8s), TIMEOUT, "the WS2019 node named")
        wait_for(lambda: _programmed(custom, gateways) == ["before"], TIMEOUT, "Gateway before")
        lists = operator.metric(LISTS, kind="Node")
        assert lists >= 1  # the first list, at start-up
        ghosts = {kind: operator.metric(GHOSTS, kind=kind) for kind in ("Node", "Gateway")}
        assert operator.proc is not None
        operator.proc.send_signal(signal.SIGSTOP)
        # Its connections go with this restart: events of a watch still open
        # would wait in its socket's buffer and reach it after all.
        cluster.restart("kube-apiserver")

        # The gap: nothing of this reaches the frozen operator.
        for i in range(3):
            core.delete_namespaced_pod(f"p-{i}", first, grace_period_seconds=0)
        _ambient_namespace(core, second, ["q-0", "q-1"])
        delete_nodes(k8s, [old_node])
        create_nodes(k8s, [windows_node(new_node, WS2019)], timeout=60)
        custom.delete_namespaced_custom_object(GW_GROUP, GW_VERSION, gateways, "gateways", "before")
        custom.create_namespaced_custom_object(
            GW_GROUP, GW_VERSION, gateways, "gateways", _gateway("during")
        )
        wait_for(
            lambda: not core.list_namespaced_pod(first, field_selector="metadata.name=p-0").items,
            30,
            "the deleted pods gone",
        )
        compacted = compact_etcd(cluster)
        cluster.restart("kube-apiserver")
        custom.create_namespaced_custom_object(
            GW_GROUP, GW_VERSION, gateways, "gateways", _gateway("after")
        )
        mark = audit.mark()
        operator.proc.send_signal(signal.SIGCONT)

        want = [f"{first}/p-3", f"{second}/q-0", f"{second}/q-1"]
        wait_for(lambda: _examples(k8s)[:3] == want, TIMEOUT, f"enrollment examples {want}")
        wait_for(
            lambda: new_node in _unsupported(k8s) and old_node not in _unsupported(k8s),
            TIMEOUT,
            "the node inventory of the live Nodes",
        )
        wait_for(
            lambda: _programmed(custom, gateways) == ["after", "during"],
            TIMEOUT,
            "the Gateways made in and after the gap Programmed",
        )
        wait_converged(k8s, kube, "the DaemonSets of the live Nodes", operator)
        nodes = _status(k8s)["nodes"]
        assert nodes["total"] == len(core.list_node().items), nodes
        assert operator.alive()
        # Found by the list after the 410: there is no other.
        assert operator.metric(LISTS, kind="Node") >= lists + 1
        for kind, before in ghosts.items():
            assert operator.metric(GHOSTS, kind=kind) >= before + 1, kind

        events = audit.events(mark, user=OPERATOR_USER)
        remade = [
            e["requestURI"]
            for e in events
            if e["verb"] == "create" and (e.get("objectRef") or {}).get("name") == "before"
        ]
        assert remade == [], "objects made again for the Gateway deleted in the gap"
        pods = [e for e in events if (e.get("objectRef") or {}).get("resource") == "pods"]
        resumed = [
            e
            for e in pods
            if e["verb"] == "watch"
            and int((_query(e).get("resourceVersion") or ["0"])[0] or 0) in range(1, compacted)
        ]
        assert resumed, "the pod watch never resumed from before the compaction"
        assert any(e["verb"] == "list" for e in pods), "pods were not listed again"
    finally:
        if operator.proc is not None:
            operator.proc.send_signal(signal.SIGCONT)
        for name in namespaces:
            with ignoring(404):
                core.delete_namespace(name)
        delete_nodes(k8s, [old_node, new_node], wait=False)
