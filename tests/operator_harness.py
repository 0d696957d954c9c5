"""Run the real operator process against the session's control plane.

The operator authenticates as its own user, so the API server's audit log
tells exactly which requests it made: that is how tests count writes. The
process runner and the audit-log reader are the dev cluster's
(``ambient_devcluster.harness``), shared with the benchmarks and the demo;
this module keeps the names the tests import.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from kubernetes import client

from ambient_devcluster import LocalCluster, default_bin_dir, install_istiod_objects
from ambient_devcluster.harness import (
    OPERATOR_USER,
    WRITE_VERBS,
    AuditLog,
    OperatorProcess,
    condition,
    free_port,
    get_mesh,
    wait_for,
    webhook_args,
)
from ambient_operator.api import constants as c

__all__ = [
    "OPERATOR_USER",
    "SAMPLE_MESH",
    "WRITE_VERBS",
    "AuditLog",
    "RunningOperator",
    "apply_sample_mesh",
    "free_port",
    "full_passes",
    "full_passes_finished",
    "sample_mesh_operator",
    "webhook_args",
]

# `ambient-operator run` as a subprocess logging to `workdir`/operator.log.
RunningOperator = OperatorProcess

SAMPLE_MESH = (
    Path(__file__).resolve().parents[1] / "operator/ambient_operator/samples/ambientmesh.yaml"
)


def apply_sample_mesh(cluster: LocalCluster) -> None:
    """`kubectl apply --server-side` of the sample AmbientMesh, as a user would."""
    kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    done = subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(SAMPLE_MESH)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


FULL_PASSES = "ambient_operator_dataplane_passes_total"


def full_passes(op: OperatorProcess) -> float | None:
    """Full data-plane passes begun so far; None while the metrics are not up (a start).

    Only a full pass can write to the cluster: a status-only pass writes the
    AmbientMesh's status alone (controllers/dataplane.py), so a "no writes"
    barrier counts these.
    """
    try:
        return op.metric(FULL_PASSES, kind="full")
    except OSError:
        return None


def full_passes_finished(
    api: client.ApiClient, op: OperatorProcess, n: int = 2, timeout: float = 180.0
) -> None:
    """Barrier: `n` full data-plane passes, each begun after this call, have finished.

    Each pass is started by a touch of the AmbientMesh's annotations (no spec
    change, full-pass news). Passes never overlap: the next one beginning
    proves the one before it finished, so it takes n + 1 touches.
    """
    for touch in range(n + 1):
        # A list, so that a count of 0 is an answer too.
        (start,) = wait_for(
            lambda: [v] if (v := full_passes(op)) is not None else None,
            timeout,
            "the operator's metrics",
        )
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            c.API_GROUP,
            c.API_VERSION,
            c.PLURAL,
            c.MESH_NAME,
            {"metadata": {"annotations": {"test/nudge": uuid.uuid4().hex}}},
        )
        wait_for(
            lambda s=start: (full_passes(op) or 0) > s,
            timeout,
            f"a full data-plane pass after touch {touch + 1} of {n + 1}",
        )


@contextlib.contextmanager
def sample_mesh_operator(
    cluster: LocalCluster, api: client.ApiClient, workdir: Path, timeout: float = 60.0
) -> Iterator[RunningOperator]:
    """The operator, with istiod's chart objects and the sample mesh Reconciled (the
    resync left at its 300 s); on the way out, its log holds no traceback."""
    install_istiod_objects(api, default_bin_dir(), "istio-system")
    apply_sample_mesh(cluster)
    op = RunningOperator(cluster, workdir)
    with op.running():
        wait_for(
            lambda: condition(get_mesh(api), "Reconciled").get("status") == "True",
            timeout,
            "the sample mesh Reconciled",
        )
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]
