"""Pod churn on a live control plane: status.enrollment follows it through status-only
passes (controllers/dataplane.py); tests/test_status_pass.py counts them exactly.

The operator process counts its passes by kind
(ambient_operator_dataplane_passes_total{kind=full|status}); the expected
enrollment counts are literal.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import get_mesh
from conftest import unique_name, wait_for
from operator_harness import RunningOperator, sample_mesh_operator

PASSES = "ambient_operator_dataplane_passes_total"
REDIRECTION = "ambient.istio.io/redirection"


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator, with the sample mesh Reconciled (the resync is left at its 300 s)."""
    with sample_mesh_operator(cluster, k8s, tmp_path_factory.mktemp("operator"), 60) as op:
        yield op


def _pod(name: str, redirection: str | None = None) -> dict[str, Any]:
    annotations = {REDIRECTION: redirection} if redirection else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "docker.io/library/nginx:1"}]},
    }


def test_pod_churn_moves_status_enrollment_through_status_only_passes(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    core = client.CoreV1Api(k8s)
    name = unique_name("churn")
    base = get_mesh(k8s)["status"]["enrollment"]

    def deltas() -> tuple[int, ...]:
        now = get_mesh(k8s)["status"]["enrollment"]
        return (
            now["namespaces"] - base["namespaces"],
            *(
                int(now["linuxPods"][state]) - int(base["linuxPods"][state])
                for state in ("enabled", "pending", "missing")
            ),
        )

    core.create_namespace(
        {"metadata": {"name": name, "labels": {"istio.io/dataplane-mode": "ambient"}}}
    )
    try:
        # A namespace's label is a full pass's news.
        wait_for(lambda: deltas() == (1, 0, 0, 0), 30, "the namespace counted")
        wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "SA")
        # The pass counts after each step: creates, annotations, a delete.
        counts = [operator.metric(PASSES, kind="status")]
        fulls = [operator.metric(PASSES, kind="full")]

        def step(counted: tuple[int, ...], what: str) -> None:
            wait_for(lambda: deltas() == counted, 30, what)
            counts.append(operator.metric(PASSES, kind="status"))
            fulls.append(operator.metric(PASSES, kind="full"))

        # Pods come, change and go (none is scheduled: no node runs a kubelet).
        for i in range(4):
            core.create_namespaced_pod(name, _pod(f"app-{i}"))
        step((1, 0, 0, 4), "four pods missing redirection")
        core.patch_namespaced_pod(
            "app-0", name, {"metadata": {"annotations": {REDIRECTION: "enabled"}}}
        )
        core.patch_namespaced_pod(
            "app-1", name, {"metadata": {"annotations": {REDIRECTION: "pending"}}}
        )
        step((1, 1, 1, 2), "one redirected, one pending")
        core.delete_namespaced_pod("app-3", name, grace_period_seconds=0)
        step((1, 1, 1, 1), "the deleted pod uncounted")
        # Its examples, in name order.
        examples = get_mesh(k8s)["status"]["enrollment"]["examplePendingPods"]
        assert f"{name}/app-1" in examples and f"{name}/app-2" in examples

        # Pods alone are answered by status-only passes. A full pass that some
        # other news started (the namespace's own ServiceAccount and root-CA
        # ConfigMap, istiod's Deployment status, which the agents' tag reads) may
        # run in a step and take the pods' news with it; such a step is answered
        # by one kind or the other. For the delete that is not enough: a full
        # pass in its step is retried with a pod of its own, up to three times,
        # so a delete that always runs a full pass still fails here.
        answered = [after - before for before, after in itertools.pairwise(counts)]
        full = [after - before for before, after in itertools.pairwise(fulls)]
        assert len(answered) == 3, answered
        assert all(a + f >= 1 for a, f in zip(answered, full, strict=True)), (answered, full)
        deletes = [(answered[2], full[2])]
        for attempt in range(3):
            if deletes[-1][0] >= 1:
                break
            extra = f"extra-{attempt}"
            core.create_namespaced_pod(name, _pod(extra))
            step((1, 1, 1, 2), f"{extra} counted")
            core.delete_namespaced_pod(extra, name, grace_period_seconds=0)
            step((1, 1, 1, 1), f"{extra} uncounted")
            deletes.append((counts[-1] - counts[-2], fulls[-1] - fulls[-2]))
        assert deletes[-1][0] >= 1, (deletes, operator.log_tail())
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
