"""Run the real operator process against the session's control plane.

The operator authenticates as its own user, so the API server's audit log
tells exactly which requests it made: that is how tests count writes. The
process runner and the audit-log reader are the dev cluster's
(``ambient_devcluster.harness``), shared with the benchmarks and the demo;
this module keeps the names the tests import.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import (
    OPERATOR_USER,
    WRITE_VERBS,
    AuditLog,
    OperatorProcess,
    free_port,
    webhook_args,
)

__all__ = [
    "OPERATOR_USER",
    "SAMPLE_MESH",
    "WRITE_VERBS",
    "AuditLog",
    "RunningOperator",
    "apply_sample_mesh",
    "free_port",
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
