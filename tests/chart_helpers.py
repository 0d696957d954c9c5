"""The chart through the real `helm` binary: render, lint, install.

Helm keeps caches and repository settings under its home folders; each
session gets its own, so tests never read or write the user's.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import BIN_DIR

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "ambient-operator"
HELM = BIN_DIR / "helm"
# helm template has no cluster to ask; this stands in for one within kubeVersion.
TEMPLATE_KUBE_VERSION = "1.33.0"


@cache
def _helm_home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="ambient-helm-home-"))
    atexit.register(shutil.rmtree, home, True)
    return home


def helm(
    *args: str, kubeconfig: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run helm; the caller checks returncode (bad values are expected to fail)."""
    if not HELM.exists():
        pytest.fail(f"{HELM} missing; run hack/build-binaries.sh")
    home = _helm_home()
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def set_args(values: Mapping[str, Any]) -> list[str]:
    """--set-json flags for dotted keys (JSON keeps booleans and numbers typed)."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def template(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "ambient-operator",
    namespace: str = "ambient-operator",
    include_crds: bool = False,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The chart rendered by `helm template`, as objects."""
    args = [
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        TEMPLATE_KUBE_VERSION,
        *set_args(values or {}),
        *extra,
    ]
    if include_crds:
        args.append("--include-crds")
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def template_error(values: Mapping[str, Any]) -> str:
    """stderr of a `helm template` that must fail."""
    done = helm(
        "template",
        "x",
        str(CHART),
        "--kube-version",
        TEMPLATE_KUBE_VERSION,
        *set_args(values),
    )
    assert done.returncode != 0, f"values {dict(values)} were accepted"
    return done.stderr


def by_kind(objects: Sequence[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [dict(obj) for obj in objects if obj.get("kind") == kind]


def one(objects: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    """The one rendered object of a kind."""
    found = by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects rendered"
    return found[0]
