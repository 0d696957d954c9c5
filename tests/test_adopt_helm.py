"""Taking over Istio's own Helm install without a restart, and the way back (issue 29).

On the session's control plane, as a platform team would do it:

- Istio's `ztunnel` and `istio-cni` charts (from the pinned module) are
  installed with the real `helm` and a values file with multi-cluster
  identity, a pull secret and pod annotations; kwok runs their pods on the
  Linux nodes.
- The operator runs as its chart's ServiceAccount, under the chart's RBAC.
- `import-values --adopt` of the same files gives the AmbientMesh.
- A user's ConfigMap that carries the istio-cni release's metadata without
  being in its record refuses the take-over by name; nothing is written.
- Once it is gone, the releases' objects are taken as they run: every
  ztunnel and istio-cni pod keeps its UID and controller-revision-hash
  through two passes and an operator restart, the Windows agents appear, and
  the audit log shows writes only to the releases' objects and the
  operator's own.
- `helm uninstall` of a release taken over, typed out of habit, is refused
  for every object taken by the chart's ValidatingAdmissionPolicy, whose
  warning names docs/migration.md's command; every agent stays.
- Helm is made to forget the releases with the command docs/migration.md
  gives, run by the real kubectl; `helm uninstall` then deletes nothing. With
  `adoption.enabled` off again, a restarted operator keeps what it took.
- The way back: `deletionPolicy: Orphan`, the AmbientMesh deleted, every pod
  keeps its UID, the objects carry nothing of ours, the real `helm
  install --take-ownership` of Istio's charts takes them without a restart,
  and docs/uninstall.md's commands delete the Windows objects left behind.

Every expected value is literal, read from the cluster before the change, or
what the real helm prints.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, api_client_for
from ambient_devcluster.harness import condition, create_mesh, delete_mesh, read_mesh
from ambient_devcluster.istio import charts_dir
from ambient_devcluster.istio import helm as run_helm
from ambient_operator.api import constants as c
from ambient_operator.cluster.helm_releases import ReleaseObject, read_releases
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from chart_helpers import template
from conftest import BIN_DIR, REPO_ROOT, ignoring, unique_name, wait_for
from operator_harness import WRITE_VERBS, AuditLog, RunningOperator, full_passes_finished
from test_chart_rbac import Identity, chart_identity
from test_docs_commands import documented, kubectl, section, sh_blocks

AGENTS = unique_name("helm-agents")
VALUES = REPO_ROOT / "tests" / "data" / "helm-values" / "round-trip"
VALUES_FILE = VALUES / "multi-cluster-private-registry.yaml"
MIGRATION = REPO_ROOT / "docs" / "migration.md"
UNINSTALL = REPO_ROOT / "docs" / "uninstall.md"
GUARD_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# Istio's charts by release name (docs/migration.md uses these names).
RELEASES = {"ztunnel": "ztunnel", "istio-cni": "istio-cni"}
AGENT_DAEMONSETS = ("ztunnel", "istio-cni-node")
TIMEOUT = 180.0
GROUP, VERSION, PLURAL = c.API_GROUP, c.API_VERSION, c.PLURAL


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed `ambient-operator` command."""
    binary = Path(sys.executable).parent / "ambient-operator"
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, check=False, timeout=120
    )


def helm(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return run_helm(BIN_DIR, *args, kubeconfig=kubeconfig)


def values_files(tmp: Path) -> dict[str, Path]:
    """The round-trip values file split per chart, as `helm install -f` takes them."""
    both = yaml.safe_load(VALUES_FILE.read_text())
    out = {}
    for release in RELEASES:
        path = tmp / f"{release}.yaml"
        path.write_text(yaml.safe_dump(both[release]))
        out[release] = path
    return out


def helm_install(cluster: LocalCluster, files: Mapping[str, Path], *extra: str) -> None:
    for release, chart in RELEASES.items():
        done = helm(
            "install",
            release,
            str(charts_dir() / chart),
            "--namespace",
            AGENTS,
            "--set",
            "profile=ambient",
            "-f",
            str(files[release]),
            *extra,
            kubeconfig=cluster.kubeconfig,
        )
        assert done.returncode == 0, done.stderr


@dataclass(frozen=True)
class Pod:
    uid: str
    revision: str
    node: str


def agent_pods(k8s: client.ApiClient) -> dict[str, Pod]:
    """The Linux agents' pods of the two DaemonSets Helm made, by name."""
    out = {}
    for pod in client.CoreV1Api(k8s).list_namespaced_pod(AGENTS).items:
        refs = pod.metadata.owner_references or []
        if any(r.kind == "DaemonSet" and r.name in AGENT_DAEMONSETS for r in refs):
            out[pod.metadata.name] = Pod(
                pod.metadata.uid,
                (pod.metadata.labels or {}).get("controller-revision-hash", ""),
                pod.spec.node_name or "",
            )
    return out


def revisions(k8s: client.ApiClient) -> dict[str, list[str]]:
    """The ControllerRevisions of the two DaemonSets Helm made, once each has seen its spec.

    A pod template change makes a new ControllerRevision before any pod is
    replaced, so the same list here means the controller has nothing to roll.
    """
    apps = client.AppsV1Api(k8s)

    def observed() -> bool:
        for name in AGENT_DAEMONSETS:
            ds = apps.read_namespaced_daemon_set(name, AGENTS)
            if (ds.status.observed_generation or 0) < ds.metadata.generation:
                return False
        return True

    wait_for(observed, TIMEOUT, "the DaemonSet controller has seen both DaemonSets' specs")
    out: dict[str, list[str]] = {name: [] for name in AGENT_DAEMONSETS}
    for rev in apps.list_namespaced_controller_revision(AGENTS).items:
        for ref in rev.metadata.owner_references or []:
            if ref.kind == "DaemonSet" and ref.name in out:
                out[ref.name].append(rev.metadata.name)
    return {name: sorted(names) for name, names in out.items()}


def running(k8s: client.ApiClient, names: Mapping[str, Pod]) -> bool:
    core = client.CoreV1Api(k8s)
    return all(core.read_namespaced_pod(n, AGENTS).status.phase == "Running" for n in names)


def uids(k8s: client.ApiClient) -> dict[tuple[str, str], str]:
    """UIDs of the DaemonSets, ConfigMaps and ServiceAccounts of the agents' namespace."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    out = {}
    for kind, items in (
        ("DaemonSet", apps.list_namespaced_daemon_set(AGENTS).items),
        ("ConfigMap", core.list_namespaced_config_map(AGENTS).items),
        ("ServiceAccount", core.list_namespaced_service_account(AGENTS).items),
    ):
        for obj in items:
            # Not the agents': the namespace's own, and istiod's waypoint class defaults.
            if obj.metadata.name not in ("default", "kube-root-ca.crt", CLASS_DEFAULTS):
                out[(kind, obj.metadata.name)] = obj.metadata.uid
    return out


def the_mesh(k8s: client.ApiClient) -> dict[str, Any]:
    found = read_mesh(k8s)
    assert found is not None
    return found


def reconciled(k8s: client.ApiClient) -> dict[str, Any]:
    mesh = the_mesh(k8s)
    cond = condition(mesh, "Reconciled")
    if cond.get("observedGeneration") != mesh["metadata"]["generation"]:
        return {}
    return cond


def wait_reconciled(k8s: client.ApiClient, op: RunningOperator, reason: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        cond = reconciled(k8s)
        return cond if cond.get("reason") == reason else None

    try:
        return wait_for(seen, TIMEOUT, f"Reconciled {reason}")
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}; Reconciled is {reconciled(k8s)}; operator log:\n{op.log_tail(60)}"
        ) from exc


def two_more_passes(k8s: client.ApiClient, op: RunningOperator) -> None:
    """Barrier for "no writes": two full data-plane passes (the only kind that writes
    to the cluster) begun after this call have finished."""
    full_passes_finished(k8s, op, 2, TIMEOUT)


@dataclass
class Install:
    cluster: LocalCluster
    identity: Identity
    operator: RunningOperator
    audit: AuditLog
    files: dict[str, Path]
    mesh_spec: dict[str, Any]
    pods: dict[str, Pod]
    objects: dict[tuple[str, str], str]
    revisions: dict[str, list[str]]


@pytest.fixture(scope="module")
def install(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    """Istio's charts installed by helm and Running; the operator started, no mesh yet."""
    original = read_mesh(k8s)
    # The shared mesh's agents (and the istio-cni ClusterRole a standalone
    # operator keeps under upstream's name) go with it.
    delete_mesh(k8s)
    core = client.CoreV1Api(k8s)
    core.create_namespace({"metadata": {"name": AGENTS}})
    tmp = tmp_path_factory.mktemp("adopt-helm")
    files = values_files(tmp)
    helm_install(cluster, files)
    wait_for(
        lambda: len(p := agent_pods(k8s)) == 2 * 3 and running(k8s, p),
        TIMEOUT,
        "Helm's ztunnel and istio-cni pods Running on the three Linux nodes",
    )
    pods = agent_pods(k8s)
    assert sorted({pod.node for pod in pods.values()}) == [
        "linux-amd64-1",
        "linux-amd64-2",
        "linux-arm64-1",
    ]
    imported = cli(
        "import-values",
        "--ztunnel",
        str(files["ztunnel"]),
        "--istio-cni",
        str(files["istio-cni"]),
        "--namespace",
        AGENTS,
        "--adopt",
        "ztunnel",
        "--adopt",
        "istio-cni",
        "-o",
        "json",
    )
    assert imported.returncode == 0, imported.stderr
    spec = json.loads(imported.stdout)["spec"]
    spec.setdefault("platforms", {}).setdefault("windows", {})["enabled"] = True
    values = {"agents": {"namespaces": [AGENTS]}, "adoption": {"enabled": True}}
    with chart_identity(cluster, k8s, values) as identity, adoption_guard(k8s, identity):
        audit = AuditLog(cluster.audit_log)
        op = RunningOperator(
            cluster,
            tmp / "operator",
            extra_args=["--resync-seconds", "5", *identity.operator_args],
            kubeconfig=identity.kubeconfig,
        )
        (tmp / "operator").mkdir()
        op.start()
        try:
            yield Install(
                cluster, identity, op, audit, files, spec, pods, uids(k8s), revisions(k8s)
            )
        finally:
            op.stop()
            with contextlib.suppress(ApiException, AssertionError):
                delete_mesh(k8s)
            for release in RELEASES:
                helm("uninstall", release, "--namespace", AGENTS, kubeconfig=cluster.kubeconfig)
            with contextlib.suppress(ApiException):
                core.delete_namespace(AGENTS)
            if original is not None:
                create_mesh(k8s, original.get("spec") or {})
    assert "Traceback" not in op.log_text(), op.log_tail(80)


@contextlib.contextmanager
def adoption_guard(k8s: client.ApiClient, identity: Identity) -> Iterator[None]:
    """The chart's guard of taken-over objects, for the identity's ServiceAccount, in force.

    In force once a dry-run delete of a taken-over ConfigMap by the admin is
    refused (the API server loads policies a moment after they are created);
    the operator's own delete of it then goes through.
    """
    values = {"serviceAccount": {"name": identity.service_account}}
    guard = [
        o
        for o in template(values, release=unique_name("guard"), namespace=identity.namespace)
        if o["kind"] in GUARD_KINDS
    ]
    policy, *bindings = guard
    assert [o["kind"] for o in guard] == [GUARD_KINDS[0], GUARD_KINDS[1], GUARD_KINDS[1]]
    assert [b["spec"]["validationActions"] for b in bindings] == [["Deny"], ["Warn"]]
    admission = client.AdmissionregistrationV1Api(k8s)
    core = client.CoreV1Api(k8s)
    admission.create_validating_admission_policy(policy)
    for binding in bindings:
        admission.create_validating_admission_policy_binding(binding)
    probe = {
        "metadata": {
            "name": unique_name("guard-probe"),
            "labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY},
            "annotations": {c.ADOPTED_FROM: "probe"},
        }
    }
    name = probe["metadata"]["name"]
    core.create_namespaced_config_map(AGENTS, probe)

    def refused() -> bool:
        try:
            core.delete_namespaced_config_map(name, AGENTS, dry_run="All")
        except ApiException as exc:
            return exc.status == 403
        return False

    try:
        wait_for(refused, TIMEOUT, "the guard refusing a taken-over object's deletion")
        with api_client_for(identity.kubeconfig) as operator:
            client.CoreV1Api(operator).delete_namespaced_config_map(name, AGENTS)
        yield
    finally:
        for binding in bindings:
            with ignoring(404):
                admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        with ignoring(404):
            admission.delete_validating_admission_policy(policy["metadata"]["name"])


def _release_objects(cluster: LocalCluster, release: str) -> set[ReleaseObject]:
    """What `helm get manifest` prints of a release, as objects (namespace filled in)."""
    done = helm("get", "manifest", release, "--namespace", AGENTS, kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    out = set()
    for doc in yaml.safe_load_all(done.stdout):
        if doc:
            meta = doc["metadata"]
            cluster_wide = doc["kind"] in ("ClusterRole", "ClusterRoleBinding")
            namespace = None if cluster_wide else meta.get("namespace", AGENTS)
            out.add(ReleaseObject(doc["apiVersion"], doc["kind"], namespace, meta["name"]))
    return out


def test_the_release_records_read_as_helm_reads_them(install: Install) -> None:
    kube = Kube(load_credentials(str(install.cluster.kubeconfig)))
    try:
        releases = read_releases(kube, AGENTS)
    finally:
        kube.close()
    assert sorted(releases) == ["istio-cni", "ztunnel"]
    for name, release in releases.items():
        assert set(release.objects) == _release_objects(install.cluster, name)
        assert len(release.objects) == len(set(release.objects))
        done = helm(
            "get", "values", name, "-n", AGENTS, "-o", "json", kubeconfig=install.cluster.kubeconfig
        )
        assert release.values == json.loads(done.stdout)
    assert (releases["ztunnel"].chart, releases["istio-cni"].chart) == ("ztunnel", "cni")
    assert releases["ztunnel"].status == "deployed"


def test_a_release_holding_a_users_object_is_refused_and_nothing_is_written(
    install: Install, k8s: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s)
    stray = {
        "metadata": {
            "name": "team-settings",
            "labels": {c.LABEL_MANAGED_BY: "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": "istio-cni",
                "meta.helm.sh/release-namespace": AGENTS,
            },
        },
        "data": {"owner": "team"},
    }
    stray_uid = core.create_namespaced_config_map(AGENTS, stray).metadata.uid
    try:
        _refused_by(install, k8s, stray_uid)
    finally:
        core.delete_namespaced_config_map("team-settings", AGENTS)


# What the data plane writes; the waypoints' controller writes its GatewayClass and
# istiod's class defaults (a ConfigMap in the agents' namespace) on its own.
DATA_PLANE = {"daemonsets", "configmaps", "serviceaccounts", "clusterroles", "clusterrolebindings"}
CLASS_DEFAULTS = "ambient-operator-istio-waypoint-defaults"


def data_plane_writes(install: Install, since: int) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of the operator's writes to the data plane since `since`."""
    out = []
    for event in install.audit.events(since, user=install.identity.user):
        ref = event.get("objectRef") or {}
        resource, name = ref.get("resource", ""), ref.get("name", "")
        if event["verb"] not in WRITE_VERBS or ref.get("subresource"):
            continue
        if resource == "configmaps" and (name == CLASS_DEFAULTS or ref.get("namespace") != AGENTS):
            continue
        if resource in DATA_PLANE or resource == PLURAL:
            # The operator creates with an apply (apply/writer.py): a patch answered 201.
            created = (event.get("responseStatus") or {}).get("code") == 201
            out.append(("create" if created else event["verb"], resource, name))
    return out


def _refused_by(install: Install, k8s: client.ApiClient, stray_uid: str) -> None:
    since = install.audit.mark()
    create_mesh(k8s, install.mesh_spec)
    cond = wait_reconciled(k8s, install.operator, "AdoptionRefused")
    assert f"ConfigMap {AGENTS}/team-settings" in cond["message"], cond["message"]
    assert "not in its record" in cond["message"]
    status = the_mesh(k8s)["status"]["adoption"]
    assert status["taken"] == []
    assert [r for r in status["refused"] if "team-settings" in r] == status["refused"]
    two_more_passes(k8s, install.operator)
    user = install.identity.user
    writes = install.audit.writes(since, user=user)
    # Of the data plane, the AmbientMesh's status and nothing else: not an agent, not
    # a new DaemonSet (the waypoints' controller may write its GatewayClass meanwhile).
    paths = {w.split("?")[0] for w in writes}
    assert f"patch /apis/{GROUP}/{VERSION}/{PLURAL}/{c.MESH_NAME}/status" in paths, writes
    assert data_plane_writes(install, since) == [], writes
    assert uids(k8s) == {**install.objects, ("ConfigMap", "team-settings"): stray_uid}
    assert agent_pods(k8s) == install.pods
    # precheck says the same, and what the ztunnel release alone would give.
    done = cli("precheck", "--kubeconfig", str(install.cluster.kubeconfig), "-o", "json")
    assert done.returncode in (0, 1), done.stderr
    rows = [f for f in json.loads(done.stdout)["findings"] if f["check"] == "helm-releases"]
    assert [(f["level"], f["message"].split(":")[0]) for f in rows] == [
        ("warning", f"Helm release {AGENTS}/istio-cni (cni 1.0.0)"),
        ("info", f"Helm release {AGENTS}/ztunnel (ztunnel 1.0.0)"),
    ]
    assert [i for i in rows[0]["items"] if "team-settings" in i] == rows[0]["items"]
    assert (
        "spec.adopt names it: it takes 2 object(s) as they run, and no pod restarts"
        in (rows[1]["message"])
    )
    assert "replaces ztunnel: 3 pod(s) on linux, " in rows[1]["message"], rows[1]["message"]
    assert rows[1]["items"] == [f"DaemonSet {AGENTS}/ztunnel", f"ServiceAccount {AGENTS}/ztunnel"]


def _ds(k8s: client.ApiClient, name: str) -> Any:
    return client.AppsV1Api(k8s).read_namespaced_daemon_set(name, AGENTS)


def take_over(install: Install, k8s: client.ApiClient) -> dict[str, Any]:
    """The AmbientMesh of the imported spec, taken over; its Reconciled condition.

    After the refusal test the mesh is there, refused: the ConfigMap's deletion
    changes nothing the operator watches, so a spec-less touch of the mesh (an
    annotation) starts a pass. Run alone, a test creates it.
    """
    if read_mesh(k8s) is None:
        create_mesh(k8s, install.mesh_spec)
    else:
        client.CustomObjectsApi(k8s).patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            c.MESH_NAME,
            {"metadata": {"annotations": {"test/take": uuid.uuid4().hex}}},
        )
    return wait_reconciled(k8s, install.operator, "AdoptedAsIs")


def forget_releases(install: Install) -> None:
    """Helm made to forget both releases, by the command docs/migration.md gives (its
    namespace swapped for the test's); once done, again is a no-op."""
    for release in RELEASES:
        argv = documented(
            MIGRATION, f"kubectl delete secret -n istio-system -l owner=helm,name={release}"
        )
        argv = [AGENTS if a == "istio-system" else a for a in argv]
        done = kubectl(install.cluster, argv)
        assert done.returncode == 0, done.stderr


# The objects of the operator's own beside the taken ones: the Windows agents of
# the sample's WS2022 and WS2025 nodes (WS2019 is unsupported), their istio-cni
# ConfigMaps, and the Windows ztunnel's account.
WINDOWS_DAEMONSETS = [
    "istio-cni-node-windows-ltsc2022",
    "istio-cni-node-windows-ltsc2025",
    "ztunnel-windows-ltsc2022",
    "ztunnel-windows-ltsc2025",
]
HELM_AND_OURS = {
    "metadata.labels.ambientoperator.io/platform",
    "metadata.labels.app.kubernetes.io/instance",
    "metadata.labels.app.kubernetes.io/managed-by",
    "metadata.labels.helm.sh/chart",
    "spec.os",
}
CREATED = {
    *(("daemonsets", name) for name in WINDOWS_DAEMONSETS),
    ("configmaps", "istio-cni-config-windows-ltsc2022"),
    ("configmaps", "istio-cni-config-windows-ltsc2025"),
    ("serviceaccounts", "ztunnel-windows"),
}


def test_the_take_over_restarts_no_agent(install: Install, k8s: client.ApiClient) -> None:
    op = install.operator
    since = install.audit.mark()
    cond = take_over(install, k8s)
    assert "nothing restarts" in cond["message"], cond["message"]
    adoption = the_mesh(k8s)["status"]["adoption"]
    assert adoption["refused"] == []
    assert adoption["taken"] == [
        f"ConfigMap {AGENTS}/istio-cni-config",
        f"DaemonSet {AGENTS}/istio-cni-node",
        f"DaemonSet {AGENTS}/ztunnel",
        f"ServiceAccount {AGENTS}/istio-cni",
        f"ServiceAccount {AGENTS}/ztunnel",
    ]
    # The chart's RBAC is left with Helm: the operator's chart grants the same.
    assert adoption["leftWithHelm"] == [
        "ClusterRole istio-cni",
        "ClusterRole istio-cni-ambient",
        "ClusterRole istio-cni-repair-role",
        "ClusterRoleBinding istio-cni",
        "ClusterRoleBinding istio-cni-ambient",
        "ClusterRoleBinding istio-cni-repair-rolebinding",
    ]
    as_is = {d["name"]: d for d in adoption["asIs"]}
    assert [(d["name"], d["platform"], d["pods"], d["approved"]) for d in adoption["asIs"]] == [
        ("istio-cni-node", "linux", 3, False),
        ("ztunnel", "linux", 3, False),
    ]
    # The fields that differ include, for both, what only Helm's template has (its
    # metadata labels, shared DESIGN §1) and what only ours has (the platform label,
    # the OS pin): a list without them would not say what the next change applies.
    for name, own in (("istio-cni-node", "install-cni"), ("ztunnel", "istio-proxy")):
        fields = as_is[name]["differences"]
        assert [f for f in fields if f in HELM_AND_OURS] == sorted(HELM_AND_OURS), fields
        assert all(f.startswith(("metadata.", "spec.")) for f in fields), fields
        assert f"spec.containers[{own}].image" not in fields, fields  # the same tag 1.31.0

    # The Windows agents appear beside the ones taken over, written in the pass
    # whose status says AdoptedAsIs (a pass writes its objects, then its status).
    windows = sorted(
        d.metadata.name
        for d in client.AppsV1Api(k8s).list_namespaced_daemon_set(AGENTS).items
        if d.metadata.name not in AGENT_DAEMONSETS
    )
    assert windows == WINDOWS_DAEMONSETS
    # Nothing restarted: same pods, same revision, same template generation.
    assert agent_pods(k8s) == install.pods
    for name in AGENT_DAEMONSETS:
        ds = _ds(k8s, name)
        assert any(r.uid == the_mesh(k8s)["metadata"]["uid"] for r in ds.metadata.owner_references)
    two_more_passes(k8s, op)
    op.stop()
    op.start()
    two_more_passes(k8s, op)
    assert wait_reconciled(k8s, op, "AdoptedAsIs")
    assert revisions(k8s) == install.revisions
    assert agent_pods(k8s) == install.pods
    assert {k: v for k, v in uids(k8s).items() if k in install.objects} == install.objects
    # Writes only to the releases' objects taken, to new objects of the
    # operator's own (each created by one request), and to the mesh's status.
    taken = {
        ("configmaps", "istio-cni-config"),
        ("daemonsets", "istio-cni-node"),
        ("daemonsets", "ztunnel"),
        ("serviceaccounts", "istio-cni"),
        ("serviceaccounts", "ztunnel"),
    }
    writes = data_plane_writes(install, since)
    assert {(resource, name) for verb, resource, name in writes if verb == "create"} == CREATED
    strays = [w for w in writes if (w[1], w[2]) not in taken | CREATED]
    assert strays == [], writes
    assert not [w for w in install.audit.writes(since, user=install.identity.user) if "rbac" in w]


def test_helm_uninstall_out_of_habit_is_refused_and_every_agent_stays(
    install: Install, k8s: client.ApiClient
) -> None:
    """`helm uninstall` of a release taken over: the chart's guard refuses its objects."""
    take_over(install, k8s)
    before = uids(k8s)
    taken = {k: v for k, v in before.items() if k[1] in ("istio-cni-node", "istio-cni-config")}
    assert sorted(taken) == [("ConfigMap", "istio-cni-config"), ("DaemonSet", "istio-cni-node")]
    done = helm(
        "uninstall", "istio-cni", "--namespace", AGENTS, kubeconfig=install.cluster.kubeconfig
    )
    assert done.returncode != 0, done.stdout
    for name in (
        "DaemonSet " + AGENTS + "/istio-cni-node",
        "ConfigMap " + AGENTS + "/istio-cni-config",
    ):
        # Helm says only that the deletion failed; the guard's warning says why and what to do.
        assert (
            f"{name} was taken over from the Helm release istio-cni by ambient-operator"
            in done.stderr
        ), done.stderr
    assert "Error: failed to delete release: istio-cni" in done.stderr
    # The command the message names is the one docs/migration.md gives, in this namespace.
    page = documented(
        MIGRATION, "kubectl delete secret -n istio-system -l owner=helm,name=istio-cni"
    )
    forget = " ".join(AGENTS if a == "istio-system" else a for a in page)
    assert f"make Helm forget the release instead: {forget} " in done.stderr, done.stderr
    # Every agent object and pod is as it was.
    assert uids(k8s) == before
    assert agent_pods(k8s) == install.pods
    assert running(k8s, install.pods)
    assert revisions(k8s) == install.revisions


def test_helm_forgets_the_releases_and_uninstall_deletes_nothing(
    install: Install, k8s: client.ApiClient
) -> None:
    take_over(install, k8s)
    before = uids(k8s)
    forget_releases(install)
    for release in RELEASES:
        gone = helm(
            "uninstall", release, "--namespace", AGENTS, kubeconfig=install.cluster.kubeconfig
        )
        assert gone.returncode != 0
        assert "not found" in gone.stderr, gone.stderr
    listed = helm(
        "list", "--namespace", AGENTS, "-o", "json", kubeconfig=install.cluster.kubeconfig
    )
    assert json.loads(listed.stdout) == []
    two_more_passes(k8s, install.operator)
    assert uids(k8s) == before
    assert revisions(k8s) == install.revisions
    assert agent_pods(k8s) == install.pods
    # adoption.enabled off again (docs/migration.md): the agents' Role lists no Secret,
    # and a restarted operator needs no record for what it took.
    rbac = client.RbacAuthorizationV1Api(k8s)
    role = rbac.read_namespaced_role(f"{install.identity.service_account}-agents", AGENTS)
    kept = [r for r in role.rules if "secrets" not in r.resources]
    assert len(kept) == len(role.rules) - 1
    role.rules = kept
    rbac.replace_namespaced_role(role.metadata.name, AGENTS, role)
    install.operator.stop()
    install.operator.start()
    two_more_passes(k8s, install.operator)
    assert wait_reconciled(k8s, install.operator, "AdoptedAsIs")
    assert uids(k8s) == before
    assert agent_pods(k8s) == install.pods


def test_the_way_back_orphans_every_agent_for_helm_to_take(
    install: Install, k8s: client.ApiClient
) -> None:
    take_over(install, k8s)
    forget_releases(install)
    custom = client.CustomObjectsApi(k8s)
    custom.patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, c.MESH_NAME, {"spec": {"deletionPolicy": "Orphan"}}
    )
    wait_for(
        lambda: (
            "ambientoperator.io/orphan-agents"
            in (the_mesh(k8s)["metadata"].get("finalizers") or [])
        ),
        TIMEOUT,
        "the Orphan finalizer on the AmbientMesh",
    )
    mesh = the_mesh(k8s)
    mesh_uid = mesh["metadata"]["uid"]
    # A canary the garbage collector must delete with the mesh: once it is
    # gone, the collector has dealt with everything the mesh still owned.
    core = client.CoreV1Api(k8s)
    canary = {
        "metadata": {
            "name": "gc-canary",
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": c.KIND,
                    "name": c.MESH_NAME,
                    "uid": mesh_uid,
                }
            ],
        }
    }
    core.create_namespaced_config_map(AGENTS, canary)
    before = uids(k8s)
    del before[("ConfigMap", "gc-canary")]
    # As `kubectl delete ambientmesh default` does: background propagation.
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, c.MESH_NAME)
    wait_for(lambda: read_mesh(k8s) is None, TIMEOUT, "the AmbientMesh deleted")
    wait_for(
        lambda: ("ConfigMap", "gc-canary") not in uids(k8s),
        TIMEOUT,
        "the garbage collector deleting what the mesh still owned",
    )
    assert uids(k8s) == before
    assert revisions(k8s) == install.revisions
    assert agent_pods(k8s) == install.pods
    apps = client.AppsV1Api(k8s)
    for ds in apps.list_namespaced_daemon_set(AGENTS).items:
        refs = [r for r in ds.metadata.owner_references or [] if r.uid == mesh_uid]
        assert refs == [], ds.metadata.name
        labels = ds.metadata.labels or {}
        assert labels.get(c.LABEL_MANAGED_BY) != c.MANAGED_BY, ds.metadata.name
    # Istio's charts take them back as they run.
    helm_install(install.cluster, install.files, "--take-ownership")
    listed = helm(
        "list", "--namespace", AGENTS, "-o", "json", kubeconfig=install.cluster.kubeconfig
    )
    assert sorted(r["name"] for r in json.loads(listed.stdout)) == ["istio-cni", "ztunnel"]
    assert all(r["status"] == "deployed" for r in json.loads(listed.stdout))
    for name in AGENT_DAEMONSETS:
        ds = _ds(k8s, name)
        assert (ds.metadata.annotations or {}).get("meta.helm.sh/release-namespace") == AGENTS
    assert revisions(k8s) == install.revisions
    assert agent_pods(k8s) == install.pods
    # What the way back leaves, deleted with uninstall.md's commands (the namespace is
    # the page's istio-system).
    windows = {k for k in uids(k8s) if "windows" in k[1]}
    assert ("ServiceAccount", "ztunnel-windows") in windows
    assert {k[0] for k in windows} == {"DaemonSet", "ConfigMap", "ServiceAccount"}
    (block,) = sh_blocks(section(UNINSTALL, "After the way back"))
    for line in block.splitlines():
        argv = [AGENTS if a == "istio-system" else a for a in shlex.split(line)]
        done = kubectl(install.cluster, argv)
        assert done.returncode == 0, done.stderr
    wait_for(
        lambda: not {k for k in uids(k8s) if "windows" in k[1]},
        TIMEOUT,
        "no Windows agent object left",
    )
    assert uids(k8s) == {k: v for k, v in before.items() if k not in windows}
    assert revisions(k8s) == install.revisions
    assert agent_pods(k8s) == install.pods
