"""`helm upgrade` from a chart whose CRD is older: never a field dropped in silence (issue 32).

With the real helm, on the session's control plane:

- the AmbientMesh CRD is removed, and the chart is installed from a copy
  whose `crds/` lacks `spec.adopt` and `status.adoption` (an older release);
- `helm upgrade` to this chart leaves that CRD as it is (Helm never updates
  `crds/`), and the Python client, which asks for no strict validation,
  has `spec.adopt` dropped without a word;
- the operator says so: `Degraded`, reason `CrdOutdated`, naming the fields
  and the command, written although the old schema lacks some of the
  status fields the operator writes;
- the command docs/upgrades.md gives, run by the real kubectl, brings the
  CRD up to date; the operator sees the change and `spec.adopt` is kept.

The module puts this release's CRD back with the same command.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import condition, create_mesh, delete_mesh, read_mesh
from ambient_operator.api import constants as c
from chart_helpers import CHART, helm
from conftest import REPO_ROOT, unique_name, wait_for
from operator_harness import RunningOperator
from test_docs_commands import documented, kubectl

UPGRADES = REPO_ROOT / "docs" / "upgrades.md"
TIMEOUT = 120.0


def _crd(k8s: client.ApiClient) -> dict[str, Any] | None:
    try:
        found = client.ApiextensionsV1Api(k8s).read_custom_resource_definition(c.CRD_NAME)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    out: dict[str, Any] = k8s.sanitize_for_serialization(found)
    return out


def _spec_properties(crd: dict[str, Any] | None) -> set[str]:
    schema = (crd or {})["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["spec"]["properties"])


def _older_chart(tmp: Path) -> Path:
    """This chart, its CRD without spec.adopt and status.adoption (as an older release's)."""
    chart = tmp / "ambient-operator"
    shutil.copytree(CHART, chart)
    path = chart / "crds" / "ambientoperator.io_ambientmeshes.yaml"
    crd = yaml.safe_load(path.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    del schema["spec"]["properties"]["adopt"]
    del schema["status"]["properties"]["adoption"]
    path.write_text(yaml.safe_dump(crd))
    return chart


def _wait_gone(k8s: client.ApiClient) -> None:
    wait_for(lambda: _crd(k8s) is None, TIMEOUT, "the AmbientMesh CRD deleted")


@pytest.fixture(scope="module")
def old_crd(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The chart installed from its older copy, then `helm upgrade`d to this one."""
    original = read_mesh(k8s)
    delete_mesh(k8s)
    client.ApiextensionsV1Api(k8s).delete_custom_resource_definition(c.CRD_NAME)
    _wait_gone(k8s)
    ns, release = unique_name("crd-upgrade"), unique_name("op")
    client.CoreV1Api(k8s).create_namespace({"metadata": {"name": ns}})
    with contextlib.suppress(ApiException):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": "istio-system"}})
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", ns]
    old = _older_chart(tmp_path_factory.mktemp("older-chart"))
    try:
        done = helm("install", release, str(old), *kube)
        assert done.returncode == 0, done.stderr
        assert "adopt" not in _spec_properties(_crd(k8s))
        done = helm("upgrade", release, str(CHART), *kube)
        assert done.returncode == 0, done.stderr
        yield ns
    finally:
        helm("uninstall", release, *kube)
        with contextlib.suppress(ApiException):
            client.CoreV1Api(k8s).delete_namespace(ns)
        # This release's CRD back, by the command the docs give.
        argv = documented(UPGRADES, "kubectl apply --server-side")
        done = kubectl(cluster, argv, cwd=REPO_ROOT)
        assert done.returncode == 0, done.stderr
        delete_mesh(k8s)
        if original is not None:
            create_mesh(k8s, original.get("spec") or {})


def _degraded(k8s: client.ApiClient) -> dict[str, Any]:
    mesh = read_mesh(k8s) or {}
    return condition(mesh, "Degraded")


def test_helm_upgrade_leaves_the_old_crd_and_the_operator_says_so(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    old_crd: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Helm never updates crds/: the upgrade left the old schema.
    assert "adopt" not in _spec_properties(_crd(k8s))
    # The Python client asks for no strict validation: the field goes in silence.
    stored = create_mesh(k8s, {"adopt": {"helmReleases": ["ztunnel"]}, "logLevel": "debug"})
    assert stored["spec"] == {"logLevel": "debug"}
    op = RunningOperator(cluster, tmp_path_factory.mktemp("crd-operator"))
    with op.running():
        cond = wait_for(
            lambda: (d := _degraded(k8s)).get("reason") == "CrdOutdated" and d,
            TIMEOUT,
            "Degraded CrdOutdated",
        )
        assert "it lacks spec.adopt, status.adoption." in cond["message"], cond["message"]
        assert "kubectl apply --server-side --force-conflicts -f crds/" in cond["message"]
        # The pass posts its transitions' Events after the status write, Degraded's last.
        wait_for(
            lambda: any(
                e.reason == "CrdOutdated" and e.involved_object.name == c.MESH_NAME
                for e in client.CoreV1Api(k8s).list_namespaced_event("default").items
            ),
            TIMEOUT,
            "the CrdOutdated Event",
        )
        # The fix the docs give, with the real kubectl; the operator sees the new CRD.
        done = kubectl(cluster, documented(UPGRADES, "kubectl apply --server-side"), cwd=REPO_ROOT)
        assert done.returncode == 0, done.stderr
        wait_for(
            lambda: _degraded(k8s).get("reason") not in (None, "CrdOutdated"),
            TIMEOUT,
            "Degraded no longer CrdOutdated",
        )
        body = {"spec": {"adopt": {"helmReleases": ["ztunnel"]}}}

        def kept() -> bool:
            # The API server takes a new CRD schema into its handler asynchronously:
            # a write right after the CRD's change can still be pruned by the old one.
            client.CustomObjectsApi(k8s).patch_cluster_custom_object(
                c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME, body
            )
            return bool((read_mesh(k8s) or {})["spec"].get("adopt") == body["spec"]["adopt"])

        wait_for(kept, TIMEOUT, "spec.adopt kept by the new schema")
    assert "Traceback" not in op.log_text(), op.log_tail(60)
