"""Run the real operator process against the session's control plane.

The operator authenticates as its own user, so the API server's audit log
tells exactly which requests it made: that is how tests count writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ambient_devcluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
OPERATOR_USER = "ambient-operator"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RunningOperator:
    """`ambient-operator run` as a subprocess, with its metrics at hand."""

    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path,
        extra_args: Sequence[str] = (),
        user: str = OPERATOR_USER,
        groups: Sequence[str] = ("system:masters",),
        kubeconfig: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.kubeconfig = kubeconfig or cluster.user_kubeconfig(user, list(groups))
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "operator.log"
        self.starts = 0

    def start(self) -> None:
        """Start the process (again)."""
        self.starts += 1
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambient_operator.cli.main",
                "run",
                "--kubeconfig",
                str(self.kubeconfig),
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                str(self.health_port),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop it and wait until it is gone."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc is not None and self.proc.poll() is None

    def metrics(self) -> dict[str, float]:
        """The /metrics page as {'name{labels}': value}."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for key, value in self.metrics().items():
            base, _, rest = key.partition("{")
            if base != name:
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += value
        return total

    def log_text(self) -> str:
        """Everything the operator printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @contextlib.contextmanager
    def running(self) -> Iterator[RunningOperator]:
        """Start, yield, stop."""
        self.start()
        try:
            yield self
        finally:
            self.stop()


class AuditLog:
    """The API server's audit log, read from a byte offset on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """An offset: later reads see only requests logged after it."""
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, since: int = 0, user: str = OPERATOR_USER) -> list[dict[str, Any]]:
        """Completed requests of `user` logged after `since`."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(since)
            data = fh.read().decode(errors="replace")
        out = []
        for line in data.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written right now
            if event.get("stage") != "ResponseComplete":
                continue
            if (event.get("user") or {}).get("username") != user:
                continue
            out.append(event)
        return out

    def writes(self, since: int = 0, user: str = OPERATOR_USER) -> list[str]:
        """'verb uri' of each write request `user` made after `since`."""
        return [
            f"{e['verb']} {e.get('requestURI')}"
            for e in self.events(since, user)
            if e.get("verb") in WRITE_VERBS
        ]
