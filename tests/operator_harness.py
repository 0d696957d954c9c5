"""Run the real operator process against the session's control plane.

The operator authenticates as its own user, so the API server's audit log
tells exactly which requests it made: that is how tests count writes. The
process runner and the audit-log reader are the dev cluster's
(``ambient_devcluster.harness``), shared with the benchmarks and the demo;
this module keeps the names the tests import.
"""

from __future__ import annotations

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
    "WRITE_VERBS",
    "AuditLog",
    "RunningOperator",
    "free_port",
    "webhook_args",
]

# `ambient-operator run` as a subprocess logging to `workdir`/operator.log.
RunningOperator = OperatorProcess
