"""A new user's path through the docs, on a fresh cluster of its own (issue 43, 1, 3 and 4).

Every command comes from the pages, run as a user would paste it: each
fenced ```sh block of a section by `bash -euo pipefail`, with the real
`helm` and `kubectl` (.cache/bin) and the installed `ambient-operator` on
PATH, from the repository's root (the pages say `charts/ambient-operator`).
The one placeholder replaced is `istio/istiod`, the istiod chart of Istio's
Helm repository, by the same chart from the pinned module.

- installation.md: istiod's trust of both ztunnel accounts, the chart's
  install, and the quick-start AmbientMesh, which must become Ready on the
  mixed sample cluster (Linux and Windows nodes); the operator runs as the
  chart's ServiceAccount, as its Deployment would.
- uninstall.md, "Removing everything": afterwards nothing of the operator's
  is left, checked kind by kind against literal lists (what there was before,
  and nothing after), and istiod trusts `ztunnel` alone.
- uninstall.md, "When the AmbientMesh waits for ever": with
  `deletionPolicy: Orphan` and no operator the deletion waits; the operator
  started again lets go of the agents and ends it, and the documented patch
  ends it with the agents deleted, as the page says.
- migration.md, every command block of it: Istio's charts taken over
  (refused until `adoption.enabled`), forgotten, the value off again, and the
  way back with uninstall.md's commands for its leftovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, apply_dirs
from ambient_devcluster.harness import condition, read_mesh
from ambient_devcluster.istio import charts_dir
from ambient_operator.api import constants as c
from chart_helpers import _helm_home, helm
from conftest import BIN_DIR, REPO_ROOT, ignoring, own_cluster, wait_for
from operator_harness import RunningOperator, free_port, webhook_args
from test_chart_rbac import SCOPE_FLAGS
from test_docs_commands import INSTALLATION, documented, kubectl, section, sh_blocks

UNINSTALL = REPO_ROOT / "docs" / "uninstall.md"
RELEASE_NAMESPACE = "ambient-operator"
ISTIOD_CHART = "istio/istiod"
# The charts of Istio's Helm repository the pages name, and the same charts of the pin.
ISTIO_CHARTS = {
    ISTIOD_CHART: "istio-discovery",
    "istio/ztunnel": "ztunnel",
    "istio/cni": "istio-cni",
}
MIGRATION = REPO_ROOT / "docs" / "migration.md"
GROUP, VERSION, PLURAL = c.API_GROUP, c.API_VERSION, c.PLURAL
TIMEOUT = 180.0


@pytest.fixture(scope="module")
def path_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path_factory, "docs-path", "kubectl", "helm") as local:
        yield local


@pytest.fixture(scope="module")
def api(path_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    with path_cluster.api_client() as api:
        yield api


def run_block(
    cluster: LocalCluster, block: str, cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    """One fenced sh block of a page, as a user would paste it into bash."""
    home = _helm_home()
    path = os.pathsep.join([str(BIN_DIR), str(Path(sys.executable).parent), os.environ["PATH"]])
    script = block
    for placeholder, chart in ISTIO_CHARTS.items():
        script = script.replace(f"{placeholder} ", f"{charts_dir() / chart} ")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={
            **os.environ,
            "PATH": path,
            "KUBECONFIG": str(cluster.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        },
        timeout=300,
        check=False,
    )


def run_ok(cluster: LocalCluster, block: str, cwd: Path = REPO_ROOT) -> str:
    done = run_block(cluster, block, cwd)
    assert done.returncode == 0, f"{block}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


def istiod_trust(api: client.ApiClient) -> str:
    """CA_TRUSTED_NODE_ACCOUNTS of istiod's Deployment."""
    deployment = client.AppsV1Api(api).read_namespaced_deployment("istiod", "istio-system")
    (container,) = [x for x in deployment.spec.template.spec.containers if x.name == "discovery"]
    (value,) = [e.value for e in container.env or [] if e.name == "CA_TRUSTED_NODE_ACCOUNTS"]
    return str(value)


def the_operator(
    cluster: LocalCluster, api: client.ApiClient, workdir: Path, *extra: str
) -> RunningOperator:
    """The operator as the chart's Deployment runs it: its ServiceAccount, its scope flags.

    The webhook is served on loopback (a kwok pod serves nothing), which the
    API server reaches by URL; its TLS Secret goes where the chart's is.
    """
    deployment = client.AppsV1Api(api).read_namespaced_deployment(
        "ambient-operator", RELEASE_NAMESPACE
    )
    pod = deployment.spec.template.spec
    args = [a for a in pod.containers[0].args if a.startswith(SCOPE_FLAGS)]
    workdir.mkdir(parents=True, exist_ok=True)
    return RunningOperator(
        cluster,
        workdir,
        extra_args=[*args, *webhook_args(free_port(), RELEASE_NAMESPACE), *extra],
        kubeconfig=cluster.serviceaccount_kubeconfig(RELEASE_NAMESPACE, pod.service_account_name),
    )


# -- what is ours -------------------------------------------------------------------------------


def _labelled(labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return (
        labels.get("app.kubernetes.io/managed-by") == c.MANAGED_BY
        or labels.get("app.kubernetes.io/instance") == "ambient-operator"
    )


def _names(items: list[Any], kind: str, every: bool = False) -> set[str]:
    out = set()
    for item in items:
        meta = item.metadata if hasattr(item, "metadata") else None
        labels = meta.labels if meta is not None else (item["metadata"].get("labels"))
        name = meta.name if meta is not None else item["metadata"]["name"]
        namespace = meta.namespace if meta is not None else item["metadata"].get("namespace")
        if every or _labelled(labels):
            out.add(f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}")
    return out


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def ours(api: client.ApiClient) -> set[str]:
    """Every object of the operator's or its chart's in the cluster, as "Kind ns/name".

    Each kind the operator or the chart writes (uninstall.md's table), found
    by the labels both put on everything (managed-by ambient-operator; the
    chart's instance), and the objects they make under fixed names.
    """
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac, custom = client.RbacAuthorizationV1Api(api), client.CustomObjectsApi(api)
    admission = client.AdmissionregistrationV1Api(api)
    out: set[str] = set()
    for kind, items in (
        ("DaemonSet", apps.list_daemon_set_for_all_namespaces().items),
        ("Deployment", apps.list_deployment_for_all_namespaces().items),
        ("ConfigMap", core.list_config_map_for_all_namespaces().items),
        ("ServiceAccount", core.list_service_account_for_all_namespaces().items),
        ("Service", core.list_service_for_all_namespaces().items),
        ("ResourceQuota", core.list_resource_quota_for_all_namespaces().items),
        (
            "NetworkPolicy",
            client.NetworkingV1Api(api).list_network_policy_for_all_namespaces().items,
        ),
        (
            "HorizontalPodAutoscaler",
            client.AutoscalingV2Api(api).list_horizontal_pod_autoscaler_for_all_namespaces().items,
        ),
        (
            "PodDisruptionBudget",
            client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces().items,
        ),
        ("ClusterRole", rbac.list_cluster_role().items),
        ("ClusterRoleBinding", rbac.list_cluster_role_binding().items),
        ("Role", rbac.list_role_for_all_namespaces().items),
        ("RoleBinding", rbac.list_role_binding_for_all_namespaces().items),
        ("ValidatingAdmissionPolicy", admission.list_validating_admission_policy().items),
        (
            "ValidatingAdmissionPolicyBinding",
            admission.list_validating_admission_policy_binding().items,
        ),
    ):
        out |= _names(items, kind)
    classes = custom.list_cluster_custom_object("gateway.networking.k8s.io", "v1", "gatewayclasses")
    out |= _names(
        [g for g in classes["items"] if g["metadata"]["name"] == "ambient-waypoint"],
        "GatewayClass",
        every=True,
    )
    hooks = admission.list_mutating_webhook_configuration().items
    out |= _names([h for h in hooks if h.metadata.name == "ambient-operator"], "Webhook", True)
    spaces = core.list_namespace().items
    out |= _names([n for n in spaces if n.metadata.name == RELEASE_NAMESPACE], "Namespace", True)
    crd = f"{PLURAL}.{GROUP}"
    extensions = client.ApiextensionsV1Api(api)
    if _exists(lambda: extensions.read_custom_resource_definition(crd)):
        out.add(f"CustomResourceDefinition {crd}")
        meshes = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        out |= _names(meshes, "AmbientMesh", every=True)
    # The webhook's TLS Secret (by its name) and Helm's release records (by Helm's labels).
    out |= _names(
        [
            s
            for s in core.list_secret_for_all_namespaces().items
            if s.metadata.name == "ambient-operator-webhook-tls"
            or (s.metadata.labels or {}).get("name") == "ambient-operator"
        ],
        "Secret",
        every=True,
    )
    return out


# What the quick start leaves on the sample cluster (uninstall.md's table, row by row),
# with the waypoint `waypoint` of namespace my-app.
INSTALLED = {
    # The agents, in spec.namespace.
    "DaemonSet istio-system/ztunnel",
    "DaemonSet istio-system/istio-cni-node",
    "DaemonSet istio-system/ztunnel-windows-ltsc2022",
    "DaemonSet istio-system/istio-cni-node-windows-ltsc2022",
    "DaemonSet istio-system/ztunnel-windows-ltsc2025",
    "DaemonSet istio-system/istio-cni-node-windows-ltsc2025",
    "ConfigMap istio-system/istio-cni-config",
    "ConfigMap istio-system/istio-cni-config-windows-ltsc2022",
    "ConfigMap istio-system/istio-cni-config-windows-ltsc2025",
    "ServiceAccount istio-system/ztunnel",
    "ServiceAccount istio-system/ztunnel-windows",
    "ServiceAccount istio-system/istio-cni",
    # The GatewayClass (istiod's class defaults wait for istiod's own class, which
    # only a running istiod makes).
    "GatewayClass ambient-waypoint",
    # The waypoint, owned by its Gateway.
    "Deployment my-app/waypoint",
    "Service my-app/waypoint",
    "ServiceAccount my-app/waypoint",
    # Made by the operator, owned by nobody.
    "Webhook ambient-operator",
    "Secret ambient-operator/ambient-operator-webhook-tls",
    "Secret ambient-operator/sh.helm.release.v1.ambient-operator.v1",
    # The chart's.
    "Deployment ambient-operator/ambient-operator",
    "Service ambient-operator/ambient-operator",
    "ServiceAccount ambient-operator/ambient-operator",
    "ClusterRole ambient-operator",
    "ClusterRole ambient-operator-istio-cni",
    "ClusterRoleBinding ambient-operator",
    "ClusterRoleBinding ambient-operator-istio-cni",
    "Role ambient-operator/ambient-operator",
    "RoleBinding ambient-operator/ambient-operator",
    "Role istio-system/ambient-operator-agents",
    "RoleBinding istio-system/ambient-operator-agents",
    "ValidatingAdmissionPolicy ambient-operator-keep-taken-agents",
    "ValidatingAdmissionPolicyBinding ambient-operator-keep-taken-agents",
    "ValidatingAdmissionPolicyBinding ambient-operator-keep-taken-agents-warn",
    "Namespace ambient-operator",
    "CustomResourceDefinition ambientmeshes.ambientoperator.io",
    "AmbientMesh default",
}


def _waypoint(api: client.ApiClient) -> None:
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "my-app"},
        "spec": {
            "gatewayClassName": "ambient-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", "my-app", "gateways", gateway
    )
    apps = client.AppsV1Api(api)
    wait_for(
        lambda: _exists(lambda: apps.read_namespaced_deployment("waypoint", "my-app")),
        TIMEOUT,
        "the waypoint's Deployment",
    )


def test_install_as_the_page_says_then_uninstall_leaves_nothing(
    path_cluster: LocalCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    cluster = path_cluster
    core = client.CoreV1Api(api)
    # Before you start: istiod in istio-system, as Istio's charts install it, then
    # the trust of both ztunnel accounts with the page's command.
    core.create_namespace({"metadata": {"name": "istio-system"}})
    done = helm(
        "install", "istiod", str(charts_dir() / "istio-discovery"), "-n", "istio-system",
        "--set", "profile=ambient", kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert istiod_trust(api) == "istio-system/ztunnel"
    trust = " ".join(documented(INSTALLATION, f"helm upgrade istiod {ISTIOD_CHART}"))
    assert "'" not in trust
    (before_you_start,) = [
        b for b in sh_blocks(section(INSTALLATION, "Before you start")) if "istiod" in b
    ]
    run_ok(cluster, before_you_start)
    assert istiod_trust(api) == "istio-system/ztunnel,istio-system/ztunnel-windows"

    # With Helm: the chart, then the quick start with the operator running.
    install, quick_start = sh_blocks(section(INSTALLATION, "With Helm"))[:2]
    assert install.startswith("helm install ambient-operator charts/ambient-operator")
    run_ok(cluster, install)
    core.create_namespace({"metadata": {"name": "my-app"}})
    operator = the_operator(cluster, api, tmp_path / "operator")
    operator.start()
    try:
        run_ok(cluster, quick_start)
        mesh = read_mesh(api)
        assert mesh is not None
        assert condition(mesh, "Ready")["status"] == "True", mesh["status"]
        # The Windows agents run the images the quick start names.
        apps = client.AppsV1Api(api)
        ztunnel = apps.read_namespaced_daemon_set("ztunnel-windows-ltsc2025", "istio-system")
        image = ztunnel.spec.template.spec.containers[0].image
        assert image == "registry.example.com/ambient/ztunnel-windows:1.30-exp.e245938e.c4094652"
        labels = core.read_namespace("my-app").metadata.labels
        assert labels["istio.io/dataplane-mode"] == "ambient"
        _waypoint(api)
        assert ours(api) == INSTALLED

        # uninstall.md, in order; the operator goes with its release.
        blocks = sh_blocks(section(UNINSTALL, "Removing everything"))
        assert len(blocks) == 4, blocks
        waypoints_and_mesh, uninstall, leftovers, istiod = blocks
        run_ok(cluster, waypoints_and_mesh)
        assert read_mesh(api) is None
        run_ok(cluster, uninstall)
    finally:
        operator.stop()
    run_ok(cluster, leftovers)
    run_ok(cluster, istiod)
    wait_for(lambda: ours(api) == set(), TIMEOUT, f"nothing of ours left: {ours(api)}")
    assert istiod_trust(api) == "istio-system/ztunnel"
    assert "Traceback" not in operator.log_text(), operator.log_tail(60)


def _pending_orphan_mesh(api: client.ApiClient, operator: RunningOperator) -> None:
    """An Orphan AmbientMesh with its agents, deleted after its operator stopped."""
    custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
    spec = {"namespace": "istio-system", "deletionPolicy": "Orphan"}
    with operator.running():
        custom.create_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": c.KIND, "metadata": {"name": "default"},
             "spec": spec},
        )  # fmt: skip
        wait_for(
            lambda: (
                "ambientoperator.io/orphan-agents"
                in ((read_mesh(api) or {}).get("metadata", {}).get("finalizers") or [])
            ),
            TIMEOUT,
            "the Orphan finalizer",
        )
        wait_for(
            lambda: _exists(lambda: apps.read_namespaced_daemon_set("ztunnel", "istio-system")),
            TIMEOUT,
            "the agents",
        )
    # The operator is gone; the deletion stays pending on its finalizer.
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "default")
    pending = read_mesh(api)
    assert pending is not None and pending["metadata"].get("deletionTimestamp"), pending
    assert pending["metadata"]["finalizers"] == ["ambientoperator.io/orphan-agents"]


def test_an_orphan_mesh_without_its_operator_ends_as_uninstall_md_says(
    path_cluster: LocalCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    cluster = path_cluster
    apply_dirs(api, [REPO_ROOT / "crds"], timeout=60)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    with ignoring(409):
        core.create_namespace({"metadata": {"name": "istio-system"}})
    operator = RunningOperator(cluster, tmp_path / "operator")
    (tmp_path / "operator").mkdir()
    crd = {f"CustomResourceDefinition {PLURAL}.{GROUP}"}

    # "To keep the agents running, install the operator again": it lets go, the deletion ends.
    _pending_orphan_mesh(api, operator)
    with operator.running():
        wait_for(lambda: read_mesh(api) is None, TIMEOUT, "the AmbientMesh gone")
    ztunnel = apps.read_namespaced_daemon_set("ztunnel", "istio-system")
    assert not ztunnel.metadata.owner_references
    # Nothing of ours any more: the agents are orphaned, no longer the operator's.
    # What the mesh owned and did not orphan (the GatewayClass, when the
    # waypoints' pass made it before the operator stopped) goes with the
    # garbage collector, after the mesh.
    wait_for(lambda: ours(api) == crd, TIMEOUT, "nothing of ours but the CRD")
    platform = "ambientoperator.io/platform"
    for delete in (
        apps.delete_collection_namespaced_daemon_set,
        core.delete_collection_namespaced_config_map,
        core.delete_collection_namespaced_service_account,
    ):
        delete("istio-system", label_selector=platform)
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.delete_collection_cluster_role(label_selector=platform)
    rbac.delete_collection_cluster_role_binding(label_selector=platform)
    wait_for(
        lambda: not apps.list_namespaced_daemon_set("istio-system").items,
        TIMEOUT,
        "the orphaned agents deleted",
    )

    # "To remove the agents too", the documented patch.
    _pending_orphan_mesh(api, operator)
    (patch,) = [
        b
        for b in sh_blocks(section(UNINSTALL, "When the AmbientMesh waits for ever"))
        if b.startswith("kubectl patch ambientmesh default")
    ]
    run_ok(cluster, patch)
    wait_for(lambda: read_mesh(api) is None, TIMEOUT, "the AmbientMesh gone")
    # "the garbage collector then deletes every agent it still owns": all but the CRD.
    wait_for(lambda: ours(api) == crd, TIMEOUT, "everything the mesh owned deleted")
    assert "Traceback" not in operator.log_text(), operator.log_tail(60)


# -- migration.md, as written ---------------------------------------------------------------------


RAN: list[str] = []


def _block(page: Path, heading: str, start: str) -> str:
    """The one sh block of a section that starts so (noted as run, for the count)."""
    (found,) = [b for b in sh_blocks(section(page, heading)) if b.startswith(start)]
    RAN.append(found)
    return found


def _reconciled(api: client.ApiClient, reason: str) -> dict[str, Any] | None:
    mesh = read_mesh(api)
    if mesh is None:
        return None
    cond = condition(mesh, "Reconciled")
    current = cond.get("observedGeneration") == mesh["metadata"]["generation"]
    return cond if current and cond.get("reason") == reason else None


def _helm_pods(api: client.ApiClient) -> dict[str, str]:
    """The Linux agents' pods of the DaemonSets Istio's charts made, name to UID."""
    out = {}
    for pod in client.CoreV1Api(api).list_namespaced_pod("istio-system").items:
        refs = pod.metadata.owner_references or []
        if any(r.name in ("ztunnel", "istio-cni-node") for r in refs):
            out[pod.metadata.name] = pod.metadata.uid
    return out


def _windows_objects(api: client.ApiClient) -> set[str]:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    found = _names(apps.list_namespaced_daemon_set("istio-system").items, "DaemonSet", True)
    found |= _names(core.list_namespaced_config_map("istio-system").items, "ConfigMap", True)
    found |= _names(
        core.list_namespaced_service_account("istio-system").items, "ServiceAccount", True
    )
    return {name for name in found if "windows" in name}


def _releases(cluster: LocalCluster) -> dict[str, str]:
    done = helm("list", "-A", "-a", "-o", "json", kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    return {r["name"]: r["status"] for r in json.loads(done.stdout)}


def test_the_take_over_and_the_way_back_as_migration_md_says(
    path_cluster: LocalCluster, api: client.ApiClient, tmp_path: Path
) -> None:
    cluster = path_cluster
    work = tmp_path / "work"
    work.mkdir()
    (work / "charts").symlink_to(REPO_ROOT / "charts")  # the pages' charts/ambient-operator
    with ignoring(409):
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "istio-system"}})
    # What the user runs today: Istio's ztunnel and istio-cni charts.
    for release, chart in (("ztunnel", "ztunnel"), ("istio-cni", "istio-cni")):
        done = helm(
            "install", release, str(charts_dir() / chart), "-n", "istio-system",
            "--set", "profile=ambient", kubeconfig=cluster.kubeconfig,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    wait_for(lambda: len(_helm_pods(api)) == 6, TIMEOUT, "Helm's agents on the 3 Linux nodes")
    pods = _helm_pods(api)
    # installation.md's install, then the operator as its Deployment runs it.
    run_ok(cluster, sh_blocks(section(INSTALLATION, "With Helm"))[0], work)
    operator = the_operator(cluster, api, tmp_path / "operator", "--resync-seconds", "5")
    operator.start()
    try:
        for start in ("helm get values", "ambient-operator import-values", "kubectl apply"):
            run_ok(cluster, _block(MIGRATION, "Moving over", start), work)
        # Without adoption.enabled: refused, by the value's name, and nothing taken.
        refused = wait_for(
            lambda: _reconciled(api, "AdoptionRefused"), TIMEOUT, "Reconciled AdoptionRefused"
        )
        assert "adoption.enabled=true" in refused["message"], refused["message"]
        assert _helm_pods(api) == pods
        ztunnel = client.AppsV1Api(api).read_namespaced_daemon_set("ztunnel", "istio-system")
        assert not ztunnel.metadata.owner_references
        # The page's "Before you start": the value on, and the take-over happens.
        run_ok(
            cluster, _block(MIGRATION, "Before you start", "helm upgrade ambient-operator"), work
        )
        wait_for(lambda: _reconciled(api, "AdoptedAsIs"), TIMEOUT, "Reconciled AdoptedAsIs")
        wait_for(lambda: _windows_objects(api), TIMEOUT, "the Windows agents")
        assert _helm_pods(api) == pods
        # Step 4: Helm forgets the releases, then the value goes off again.
        run_ok(cluster, _block(MIGRATION, "Moving over", "kubectl delete secret"), work)
        # The ClusterRoles left with Helm, with the page's command; the agents keep theirs
        # (the operator's chart grants istio-cni the same).
        argv = documented(MIGRATION, "kubectl delete clusterrole,clusterrolebinding -l")
        done = kubectl(cluster, argv)
        assert done.returncode == 0, done.stderr
        assert "istio-cni" in done.stdout, done.stdout
        run_ok(cluster, _block(MIGRATION, "Moving over", "helm upgrade ambient-operator"), work)
        assert "ztunnel" not in _releases(cluster) and "istio-cni" not in _releases(cluster)
        role = client.RbacAuthorizationV1Api(api).read_namespaced_role(
            "ambient-operator-agents", "istio-system"
        )
        assert not [r for r in role.rules if "secrets" in r.resources]
        operator.stop()
        operator.start()
        wait_for(lambda: _reconciled(api, "AdoptedAsIs"), TIMEOUT, "AdoptedAsIs after a restart")
        assert _helm_pods(api) == pods
        # Going back: Orphan, the mesh deleted, Istio's charts take the agents back.
        windows = _windows_objects(api)
        assert "ServiceAccount istio-system/ztunnel-windows" in windows
        run_ok(cluster, _block(MIGRATION, "Going back to Istio's charts", "kubectl patch"), work)
        run_ok(cluster, _block(MIGRATION, "Going back to Istio's charts", "kubectl delete"), work)
        wait_for(lambda: read_mesh(api) is None, TIMEOUT, "the AmbientMesh deleted")
    finally:
        operator.stop()
    run_ok(cluster, _block(MIGRATION, "Going back to Istio's charts", "helm install"), work)
    assert {k: v for k, v in _releases(cluster).items() if k in ("ztunnel", "istio-cni")} == {
        "ztunnel": "deployed",
        "istio-cni": "deployed",
    }
    assert _helm_pods(api) == pods
    assert _windows_objects(api) == windows
    run_ok(cluster, _block(UNINSTALL, "After the way back", "kubectl delete"), work)
    wait_for(lambda: not _windows_objects(api), TIMEOUT, "the way back's leftovers deleted")
    assert _helm_pods(api) == pods
    assert "Traceback" not in operator.log_text(), operator.log_tail(60)
    # Every command block of migration.md ran, once.
    assert sorted(b for b in RAN if b in sh_blocks(MIGRATION.read_text())) == sorted(
        sh_blocks(MIGRATION.read_text())
    )
