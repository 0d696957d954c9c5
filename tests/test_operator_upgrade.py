"""An operator upgrade restarts no agent until the user approves, then rolls in order (issue 32).

The cluster converges under the operator; it is stopped, and every agent
DaemonSet is rewritten as an older operator version would have left it: the
same objects under the operator's field manager, with a pod template that
has one more variable (ROLLED_BY_AN_OLDER_OPERATOR) and without the
annotations this version writes. kube-controller-manager rolls that template
out (kwok runs the pods). The operator of this version then starts on that
converged cluster: its render differs from what runs only by what the older
version rendered. No agent pod may change UID until the approval; after it,
Linux's DaemonSets roll first, then WS2022's, then WS2025's, each Ready
before the next, as one watch of the DaemonSets records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import LocalCluster, apply_objects
from ambient_devcluster.harness import condition, get_mesh
from ambient_operator.api import constants as c
from ambient_operator.apply.held import APPROVE, AS_IS, Held, approval
from conftest import own_cluster, wait_for
from operator_harness import RunningOperator, full_passes_finished
from test_versions_cluster import (
    LINUX,
    NS,
    SAMPLE,
    WS2022,
    WS2025,
    Recorder,
    _first,
    _list_daemonsets,
    _mesh_spec,
    _timeline,
    settled,
)

TIMEOUT = 180.0
OLD_VAR = "ROLLED_BY_AN_OLDER_OPERATOR"
# What this version writes and an older one did not.
NEW_ANNOTATIONS = ("ambientoperator.io/template-by", "ambientoperator.io/inputs")


@pytest.fixture(scope="module")
def upgrade_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of our own (conftest's own_cluster), with the agents' namespace."""
    with own_cluster(tmp_path_factory, "upgrade-cluster") as local:
        with local.api_client() as api:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
            apply_objects(api, [namespace])
        yield local


@pytest.fixture(scope="module")
def api(upgrade_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin client of the module's cluster."""
    with upgrade_cluster.api_client() as admin:
        yield admin


def _daemonsets(api: client.ApiClient) -> list[dict[str, Any]]:
    return list(_list_daemonsets(api)()["items"])


def _env_names(ds: dict[str, Any]) -> set[str]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    return {str(e["name"]) for ctr in containers for e in ctr.get("env") or []}


def _all_settled(api: client.ApiClient, old: bool) -> bool:
    items = _daemonsets(api)
    return len(items) == 6 and all(
        settled(ds) and (OLD_VAR in _env_names(ds)) == old for ds in items
    )


def _wait_settled(api: client.ApiClient, old: bool, what: str, timeout: float = TIMEOUT) -> None:
    try:
        wait_for(lambda: _all_settled(api, old), timeout, what)
    except TimeoutError as exc:
        shown = [
            (ds["metadata"]["name"], ds["metadata"]["generation"], ds.get("status"))
            for ds in _daemonsets(api)
        ]
        raise AssertionError(f"{exc}; the DaemonSets: {shown}") from exc


def _agent_pods(api: client.ApiClient) -> dict[str, str]:
    """name -> UID of every pod of the agents' DaemonSets."""
    names = {ds["metadata"]["name"] for ds in _daemonsets(api)}
    return {
        pod.metadata.name: pod.metadata.uid
        for pod in client.CoreV1Api(api).list_namespaced_pod(NS).items
        if any(
            r.kind == "DaemonSet" and r.name in names for r in pod.metadata.owner_references or []
        )
    }


def _as_an_older_operator_left_it(ds: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet as an older operator version would have applied it."""
    meta = ds["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()}
    for key in NEW_ANNOTATIONS:
        annotations.pop(key, None)
    template = json.loads(json.dumps(ds["spec"]["template"]))
    template["metadata"].pop("creationTimestamp", None)
    first = template["spec"]["containers"][0]
    first["env"] = [*(first.get("env") or []), {"name": OLD_VAR, "value": "1"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": meta.get("labels") or {},
            "annotations": annotations,
            "ownerReferences": meta["ownerReferences"],
        },
        "spec": {
            "selector": ds["spec"]["selector"],
            "updateStrategy": ds["spec"].get("updateStrategy") or {},
            "template": template,
        },
    }


def _patch_mesh(api: client.ApiClient, patch: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME, patch
    )


def _reconciled(api: client.ApiClient, reason: str) -> dict[str, Any] | None:
    cond = condition(get_mesh(api), "Reconciled")
    return cond if cond.get("reason") == reason else None


def _a_wrong_or_stale_value_approves_nothing(
    api: client.ApiClient,
    op: RunningOperator,
    pods: dict[str, str],
    generations: dict[str, int],
    status: dict[str, Any],
) -> None:
    """docs/upgrades.md: a value other than status.held.approval approves nothing, and
    status.held.staleApproval says so: a made-up value, and the value status.held gave
    when only Linux's two were held (one read earlier, before the rest was held)."""
    linux = [
        Held(ds["metadata"]["name"], "linux", ds["metadata"]["annotations"][AS_IS], "", False)
        for ds in _daemonsets(api)
        if ds["metadata"]["name"] in LINUX
    ]
    assert len(linux) == 2, linux
    for value in ("0123456789ab", approval(linux)):
        assert value != status["approval"]
        _patch_mesh(api, {"metadata": {"annotations": {APPROVE: value}}})
        full_passes_finished(api, op, 2, TIMEOUT)
        now = get_mesh(api)["status"].get("held")
        assert now is not None, f"{APPROVE}={value} approved the roll"
        assert now["staleApproval"] == value, now
        assert now["approval"] == status["approval"], now
        assert [d["approved"] for d in now["daemonSets"]] == [False] * 6, now
        message = condition(get_mesh(api), "Reconciled")["message"]
        assert f"{APPROVE}={value} approves what was held before, not this" in message, message
        assert _agent_pods(api) == pods
        assert {
            ds["metadata"]["name"]: ds["metadata"]["generation"] for ds in _daemonsets(api)
        } == generations


def test_an_operator_upgrade_restarts_no_agent_until_approved(
    upgrade_cluster: LocalCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    op = RunningOperator(upgrade_cluster, tmp_path)
    with op.running():
        body = yaml.safe_load(SAMPLE.read_text())
        body["spec"] = _mesh_spec("1.31.0")
        apply_objects(api, [body])
        _wait_settled(api, False, "the agents Ready")
        wait_for(lambda: _reconciled(api, "Reconciled"), TIMEOUT, "Reconciled")
    # What an older operator version left: its template, rolled out everywhere.
    older = [_as_an_older_operator_left_it(ds) for ds in _daemonsets(api)]
    apply_objects(api, older, field_manager=c.FIELD_MANAGER)
    _wait_settled(api, True, "the older template rolled out")
    pods = _agent_pods(api)
    generations = {ds["metadata"]["name"]: ds["metadata"]["generation"] for ds in _daemonsets(api)}
    # The sample nodes: three Linux, one WS2022, one WS2025 (and a WS2019 without agents).
    assert len(pods) == 3 * 2 + 1 * 2 + 1 * 2, pods

    with op.running():
        held = wait_for(lambda: _reconciled(api, "TemplatesHeld"), TIMEOUT, "TemplatesHeld")
        full_passes_finished(api, op, 2, TIMEOUT)
        assert _agent_pods(api) == pods
        assert {
            ds["metadata"]["name"]: ds["metadata"]["generation"] for ds in _daemonsets(api)
        } == generations
        status = get_mesh(api)["status"]["held"]
        shown = {
            d["name"]: (d["platform"], d["pods"], d["reason"], d["approved"])
            for d in status["daemonSets"]
        }
        upgrade = "OperatorUpgrade"
        assert shown == {
            "istio-cni-node": ("linux", 3, upgrade, False),
            "ztunnel": ("linux", 3, upgrade, False),
            "istio-cni-node-windows-ltsc2022": ("10.0.20348", 1, upgrade, False),
            "ztunnel-windows-ltsc2022": ("10.0.20348", 1, upgrade, False),
            "istio-cni-node-windows-ltsc2025": ("10.0.26100", 1, upgrade, False),
            "ztunnel-windows-ltsc2025": ("10.0.26100", 1, upgrade, False),
        }, shown
        for d in status["daemonSets"]:
            assert any(OLD_VAR in field for field in d["differences"]), d
        assert f"{APPROVE}={status['approval']}" in held["message"], held["message"]
        _a_wrong_or_stale_value_approves_nothing(api, op, pods, generations, status)

        with Recorder(_list_daemonsets(api)) as recorder:
            _patch_mesh(api, {"metadata": {"annotations": {APPROVE: status["approval"]}}})
            _wait_settled(api, False, "the approved roll", TIMEOUT * 2)
            wait_for(lambda: _reconciled(api, "Reconciled"), TIMEOUT, "Reconciled after the roll")
        assert "held" not in get_mesh(api)["status"]
        replaced = _agent_pods(api)
        assert not set(replaced.values()) & set(pods.values()), (pods, replaced)

    timeline = _timeline(recorder.initial, recorder.events)

    def rolled(names: tuple[str, ...]) -> Any:
        return lambda state: all(
            n in state and OLD_VAR not in _env_names(state[n]) and settled(state[n]) for n in names
        )

    def changed(names: tuple[str, ...]) -> Any:
        return lambda state: any(n in state and OLD_VAR not in _env_names(state[n]) for n in names)

    seen = [
        (e["object"]["metadata"]["name"], e["object"]["metadata"]["generation"])
        for e in recorder.events
    ]
    linux_changed, linux_rolled = _first(timeline, changed(LINUX)), _first(timeline, rolled(LINUX))
    ws2022_changed, ws2022_rolled = (
        _first(timeline, changed(WS2022)),
        _first(timeline, rolled(WS2022)),
    )
    ws2025_changed = _first(timeline, changed(WS2025))
    assert 0 < linux_changed < linux_rolled < ws2022_changed < ws2022_rolled < ws2025_changed, seen
