"""The data plane never touches what is not its own (issue 14, points 2, 3 and 6).

Each case runs against the real API server with the operator as the chart's
ServiceAccount under the chart's RBAC (test_chart_rbac's fixtures; the chart
is rendered with agents.namespaces naming the namespaces the agents move to
here):

- a typo in spec.namespace: NamespaceNotFound, told once, and not one write
  to the data plane: every DaemonSet, ConfigMap and ServiceAccount keeps its UID;
- a namespace the chart grants no Role in: NamespaceNotAllowed, told once,
  no write (the data-plane controller alone, in process, as the chart's
  ServiceAccount with the chart's arguments);
- objects made by hand with only our labels (istio-system, kube-system, a
  team's namespace) survive pass after pass, and a spec change that prunes;
- a move into a namespace holding Helm's ztunnel ServiceAccount and
  istio-cni-config ConfigMap: NameConflict, told once, Helm's objects
  unchanged, the old agents kept;
- a move to a clean namespace is make-before-break (a watch of both
  namespaces gives the order): no old DaemonSet goes before every new one
  has taken over: Ready beside the old one where an agent can run twice on a
  node (ztunnel on the pod network), placed on every node where it cannot
  (host-network agents: their pods wait for the old ones' ports and start
  once those leave, as in their own rollout without surge); then the old
  ones are pruned and every new one becomes Ready;
- spec.networkPolicy.enabled with somebody else's NetworkPolicy under istio-cni's
  policy's name: NameConflict, theirs untouched, ztunnel's written with upstream's
  rules; once the name is free ours takes it, and turning the flag off prunes both;
- and not one request of the operator answered Forbidden.

Without the chart (standalone, the operator keeps the istio-cni RBAC), the
same typo leaves the istio-cni ClusterRoleBinding untouched, and a move binds
both namespaces' istio-cni accounts until the old agents are pruned.

Every expected value is literal here or read from the cluster before the
change; "Ready" for a DaemonSet is this module's own reading of its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

import test_chart_rbac as chart_rbac
import test_ownership_waypoints as ownership_waypoints
from ambient_devcluster import LocalCluster, api_client_for
from ambient_devcluster.harness import condition, get_mesh
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.app.operator import Operator
from ambient_operator.app.options import Options
from ambient_operator.cli.main import build_parser
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.render import render_dataplane
from checks import every
from conftest import unique_name, wait_for
from operator_harness import AuditLog
from test_chart_rbac import Identity, Mesh, Running, _fail_with_log, chart_identity
from test_ownership_waypoints import Team

# Reused, not copied: the shared AmbientMesh, the audit log, and the operator
# running as the chart's ServiceAccount (with this module's `identity`).
audit = chart_rbac.audit
mesh = chart_rbac.mesh
operator = chart_rbac.operator
# The unprivileged team: a ServiceAccount allowed only Gateways and
# ConfigMaps in its own namespace.
team = ownership_waypoints.team

AGENTS = "istio-system"
CLEAN = unique_name("agents-clean")
HELMISH = unique_name("agents-helm")
SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY},ambientoperator.io/controller=dataplane"
OUR_LABELS = {c.LABEL_MANAGED_BY: c.MANAGED_BY, "ambientoperator.io/controller": "dataplane"}
PASSES = "ambient_operator_reconcile_duration_seconds_count"
TIMEOUT = 120.0
# The in-process operator without the chart, as its own user (system:masters).
STANDALONE_USER = "ambient-operator-standalone"
CNI = "istio-cni"
_NAME = "app.kubernetes.io/name"
GROUP, VERSION, PLURAL = c.API_GROUP, c.API_VERSION, c.PLURAL
DATAPLANE_PATHS = ("/daemonsets", "/configmaps", "/serviceaccounts", "/clusterrole")


@pytest.fixture(scope="module")
def identity(cluster: LocalCluster, k8s: client.ApiClient) -> Iterator[Identity]:
    """The chart's RBAC, granting the agents istio-system and the two namespaces moved to."""
    core = client.CoreV1Api(k8s)
    for namespace in (CLEAN, HELMISH):
        core.create_namespace({"metadata": {"name": namespace}})
    values = {"agents": {"namespaces": [AGENTS, CLEAN, HELMISH]}}
    with chart_identity(cluster, k8s, values) as ident:
        yield ident
    for namespace in (CLEAN, HELMISH):
        with contextlib.suppress(ApiException):
            core.delete_namespace(namespace)


# -- reading the cluster ---------------------------------------------------------------------


def patch_spec(k8s: client.ApiClient, spec: dict[str, Any]) -> None:
    """A merge patch of the spec (the client sends a dict body as one)."""
    client.CustomObjectsApi(k8s).patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, c.MESH_NAME, {"spec": spec}
    )


def set_namespace(k8s: client.ApiClient, namespace: str) -> None:
    patch_spec(k8s, {"namespace": namespace})


def owned_by(obj: Any, uid: str) -> bool:
    return any(ref.controller and ref.uid == uid for ref in obj.metadata.owner_references or [])


def ours(k8s: client.ApiClient, namespace: str, uid: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> UID of the mesh's DaemonSets, ConfigMaps and ServiceAccounts there."""
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    found: dict[tuple[str, str], str] = {}
    for kind, listed in (
        ("DaemonSet", apps.list_namespaced_daemon_set(namespace, label_selector=SELECTOR)),
        ("ConfigMap", core.list_namespaced_config_map(namespace, label_selector=SELECTOR)),
        (
            "ServiceAccount",
            core.list_namespaced_service_account(namespace, label_selector=SELECTOR),
        ),
    ):
        for obj in listed.items:
            if owned_by(obj, uid):
                found[(kind, obj.metadata.name)] = obj.metadata.uid
    return found


def events(k8s: client.ApiClient, uid: str, reason: str) -> list[str]:
    """Messages of the Events about the mesh with this reason."""
    listed = client.CoreV1Api(k8s).list_namespaced_event(
        "default", field_selector=f"involvedObject.kind={c.KIND},reason={reason}"
    )
    return [e.message for e in listed.items if e.involved_object.uid == uid]


def current(k8s: client.ApiClient, kind: str) -> dict[str, Any]:
    """The mesh's `kind` condition once written for its generation, else {}."""
    live = get_mesh(k8s)
    cond = condition(live, kind)
    return cond if cond.get("observedGeneration") == live["metadata"]["generation"] else {}


def wait_reconciled(op: Running, k8s: client.ApiClient, reason: str) -> dict[str, Any]:
    try:
        return wait_for(
            lambda: (cond := current(k8s, "Reconciled")).get("reason") == reason and cond,
            TIMEOUT,
            f"Reconciled reason {reason}",
        )
    except TimeoutError:
        _fail_with_log(op.op, f"not {reason}: {condition(get_mesh(k8s), 'Reconciled')}")


def wait_converged(op: Running, k8s: client.ApiClient) -> str:
    """Wait for Ready=True and Reconciled=True of the mesh's generation; its UID."""

    def converged() -> bool:
        return (
            current(k8s, "Ready").get("status") == "True"
            and current(k8s, "Reconciled").get("status") == "True"
        )

    try:
        wait_for(converged, TIMEOUT, "the mesh Ready and Reconciled")
    except TimeoutError:
        live = get_mesh(k8s)
        _fail_with_log(op.op, f"not converged: {(live.get('status') or {}).get('conditions')}")
    return str(get_mesh(k8s)["metadata"]["uid"])


def passes_later(op: Running, count: int = 3) -> None:
    """Wait until `count` more data-plane passes completed (resyncs come every 5 s)."""
    before = op.op.metric(PASSES, controller="dataplane")
    wait_for(
        lambda: op.op.metric(PASSES, controller="dataplane") >= before + count,
        TIMEOUT,
        f"{count} data-plane passes",
    )


def dataplane_writes(audit: AuditLog, since: int, user: str) -> list[str]:
    return [w for w in audit.writes(since, user=user) if any(p in w for p in DATAPLANE_PATHS)]


def ds_ready(obj: Mapping[str, Any]) -> bool:
    """A DaemonSet whose controller saw its spec and whose every scheduled pod is updated and
    ready (Kubernetes' DaemonSet status fields, read here independently of the operator)."""
    meta, st = obj.get("metadata") or {}, obj.get("status") or {}
    desired = int(st.get("desiredNumberScheduled") or 0)
    return (
        int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 1)
        and int(st.get("numberReady") or 0) == desired
        and int(st.get("updatedNumberScheduled") or 0) == desired
    )


def ds_placed(obj: Mapping[str, Any]) -> bool:
    """A DaemonSet whose controller saw its spec and made an updated pod for every node."""
    meta, st = obj.get("metadata") or {}, obj.get("status") or {}
    desired = int(st.get("desiredNumberScheduled") or 0)
    return (
        int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 1)
        and int(st.get("currentNumberScheduled") or 0) == desired
        and int(st.get("updatedNumberScheduled") or 0) == desired
    )


def took_over(obj: Mapping[str, Any]) -> bool:
    """Ready, or placed for an agent on the host network (which cannot run twice on a node)."""
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ds_placed(obj) if pod.get("hostNetwork") else ds_ready(obj)


def snapshot(obj: Any) -> dict[str, Any]:
    """Everything of somebody else's object that must stay as it was."""
    meta = obj.metadata
    return {
        "uid": meta.uid,
        "resourceVersion": meta.resource_version,
        "labels": meta.labels,
        "annotations": meta.annotations,
        "ownerReferences": meta.owner_references,
        "managers": sorted({m.manager for m in meta.managed_fields or []}),
        "data": getattr(obj, "data", None),
    }


# -- offline ---------------------------------------------------------------------------------


def test_a_move_binds_both_namespaces_istio_cni_accounts() -> None:
    linux = NodeFacts("l1", "linux", "amd64", None, False, {c.LABEL_OS: "linux"})
    spec = AmbientMeshSpec.model_validate({"namespace": "mesh-new"})
    moving = ClusterFacts(nodes=(linux,), moving_from=("istio-system",))
    (binding,) = [
        o for o in render_dataplane(spec, moving).objects if o["kind"] == "ClusterRoleBinding"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": CNI, "namespace": "mesh-new"},
        {"kind": "ServiceAccount", "name": CNI, "namespace": "istio-system"},
    ]
    alone = render_dataplane(spec, ClusterFacts(nodes=(linux,))).objects
    (binding,) = [o for o in alone if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CNI, "namespace": "mesh-new"}]
    # With the chart's RBAC nothing cluster-scoped is rendered at all.
    bare = render_dataplane(spec, moving, cni_rbac=False).objects
    every(bare, lambda o: o["metadata"].get("namespace") == "mesh-new", "rendered objects")


# -- in process: the data-plane controller alone -------------------------------------------
# No kopf: each pass lists what the watches would hold, then reconciles once.
# These run before the module's operator process starts (its fixture is
# first asked for further down), so nothing else writes meanwhile.


@dataclass
class InProcess:
    """Data-plane passes as `ambient-operator run <args>` would make them, as one identity."""

    kubeconfig: Path
    args: tuple[str, ...] = ()
    passes: int = 0

    def run_pass(self) -> None:
        options = Options(kubeconfig=str(self.kubeconfig))
        if self.args:
            flags = build_parser().parse_args(["run", *self.args])
            options = dataclasses.replace(
                options,
                agents_namespaces=tuple(flags.agents_namespace or ()),
                cni_rbac=flags.cni_rbac,
                istio_cni_may_delete_pods=flags.istio_cni_may_delete_pods,
                network_attachments=flags.network_attachments,
            )
        op = Operator(options)

        async def prime_and_pass() -> None:
            try:
                await op.prime()
                await op.dataplane.reconcile()
            finally:
                await op.stop_watching()

        asyncio.run(prime_and_pass())
        self.passes += 1

    def converged_in(self, k8s: client.ApiClient, namespace: str, away: tuple[str, ...]) -> bool:
        """One pass; then whether the mesh is Ready and Reconciled, with nothing in `away`."""
        self.run_pass()
        live = get_mesh(k8s)
        gen = live["metadata"]["generation"]
        done = all(
            (cond := condition(live, kind)).get("status") == "True"
            and cond.get("observedGeneration") == gen
            for kind in ("Ready", "Reconciled")
        )
        uid = live["metadata"]["uid"]
        return done and all(not ours(k8s, other, uid) for other in away if other != namespace)

    def converge(self, k8s: client.ApiClient, namespace: str, away: tuple[str, ...] = ()) -> str:
        wait_for(
            lambda: self.converged_in(k8s, namespace, away),
            TIMEOUT,
            f"convergence in {namespace} (in process)",
        )
        return str(get_mesh(k8s)["metadata"]["uid"])


def _binding(k8s: client.ApiClient) -> client.V1ClusterRoleBinding:
    return client.RbacAuthorizationV1Api(k8s).read_cluster_role_binding(CNI)


def _subjects(binding: client.V1ClusterRoleBinding) -> set[tuple[str, str]]:
    return {(s.name, s.namespace) for s in binding.subjects or []}


def _binding_names(run: InProcess, k8s: client.ApiClient, expected: set[tuple[str, str]]) -> None:
    """Passes until the istio-cni binding names exactly `expected`.

    The pass that prunes a namespace's agents rendered the binding before
    the prune; the pass their deletion starts names the namespaces left.
    """

    def named() -> bool:
        run.run_pass()
        return _subjects(_binding(k8s)) == expected

    wait_for(named, TIMEOUT, f"the istio-cni binding naming {sorted(expected)}")


def test_standalone_binding_follows_the_agents_not_the_spec(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    audit: AuditLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the chart: the operator keeps the istio-cni ClusterRole and binding.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # Operator() sets it; put back
    run = InProcess(cluster.user_kubeconfig(STANDALONE_USER, ["system:masters"]))
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    target = unique_name("agents-standalone")
    uid = run.converge(k8s, AGENTS)
    before, binding = ours(k8s, AGENTS, uid), _binding(k8s)
    assert _subjects(binding) == {(CNI, AGENTS)}

    try:
        # A typo: refused before anything is rendered, so the binding stays as it is.
        mark = audit.mark()
        set_namespace(k8s, unique_name("no-such-namespace"))
        for _ in range(3):
            run.run_pass()
        assert current(k8s, "Reconciled")["reason"] == "NamespaceNotFound"
        assert _binding(k8s).metadata.resource_version == binding.metadata.resource_version
        assert ours(k8s, AGENTS, uid) == before
        assert dataplane_writes(audit, mark, STANDALONE_USER) == []

        # A move: both accounts bound while both agents run, the old one dropped after.
        core.create_namespace({"metadata": {"name": target}})
        set_namespace(k8s, target)
        run.run_pass()
        assert _subjects(_binding(k8s)) == {(CNI, AGENTS), (CNI, target)}
        assert {k for k in ours(k8s, AGENTS, uid) if k[0] == "DaemonSet"} == {
            k for k in before if k[0] == "DaemonSet"
        }

        early: list[str] = []

        def old_gone() -> bool:
            had_old = any(k[0] == "DaemonSet" for k in ours(k8s, AGENTS, uid))
            run.run_pass()
            gone = not any(k[0] == "DaemonSet" for k in ours(k8s, AGENTS, uid))
            # Read after the pass, which read the cluster before this: taking
            # over only ever goes forward, so not yet now means not yet then.
            new = apps.list_namespaced_daemon_set(target, label_selector=SELECTOR).items
            took = bool(new) and all(took_over(k8s.sanitize_for_serialization(d)) for d in new)
            if had_old and gone and not took:
                early.append(f"pass {run.passes} pruned {AGENTS} before {target} took over")
            return gone

        try:
            wait_for(old_gone, TIMEOUT, f"the agents in {AGENTS} pruned after the move")
        except TimeoutError as exc:
            conditions = (get_mesh(k8s).get("status") or {}).get("conditions")
            raise AssertionError(f"old agents kept; conditions: {conditions}") from exc
        # The pass that pruned the old agents saw the new ones take over first.
        assert early == []
        run.converge(k8s, target, away=(AGENTS,))
        _binding_names(run, k8s, {(CNI, target)})

        set_namespace(k8s, AGENTS)
        run.converge(k8s, AGENTS, away=(target,))
        _binding_names(run, k8s, {(CNI, AGENTS)})
    finally:
        set_namespace(k8s, AGENTS)
        with contextlib.suppress(ApiException):
            core.delete_namespace(target)


def test_a_namespace_the_chart_does_not_grant_is_refused(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    identity: Identity,
    audit: AuditLog,
    team: Team,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the chart's ServiceAccount with the chart's arguments. In process,
    # because only the data plane's answer is at stake here: the waypoint
    # controller keeps istiod's class defaults in spec.namespace on its own.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    run = InProcess(identity.kubeconfig, identity.operator_args)
    uid = run.converge(k8s, AGENTS)
    before = ours(k8s, AGENTS, uid)
    mark = audit.mark()
    set_namespace(k8s, team.namespace)
    try:
        for _ in range(3):
            run.run_pass()
        cond = current(k8s, "Reconciled")
        assert cond["reason"] == "NamespaceNotAllowed", cond
        assert team.namespace in cond["message"] and "agents.namespaces" in cond["message"]
        assert ours(k8s, AGENTS, uid) == before
        assert ours(k8s, team.namespace, uid) == {}
        assert dataplane_writes(audit, mark, identity.user) == []
        assert chart_rbac.forbidden(audit, mark, identity) == []
        assert len([m for m in events(k8s, uid, "NamespaceNotAllowed") if team.namespace in m]) == 1
    finally:
        set_namespace(k8s, AGENTS)
    run.converge(k8s, AGENTS)
    assert ours(k8s, AGENTS, uid) == before


# istio-cni's Delete repair mode needs `delete` on every pod (upstream's chart
# grants it with repair.deletePods); the chart value istioCniRepair.deletePods
# grants it, and says so to the operator.
DELETE_MODE = {"istioCni": {"repairMode": "Delete"}}
DEFAULT_MODE = {"istioCni": {"repairMode": None}}


def _cni_settings(k8s: client.ApiClient) -> dict[str, str]:
    data = client.CoreV1Api(k8s).read_namespaced_config_map(f"{CNI}-config", AGENTS).data
    return {k: v for k, v in data.items() if k.startswith("REPAIR_") and k.endswith("_PODS")}


def _delete_mode_refused(run: InProcess, k8s: client.ApiClient, said: str) -> None:
    """Ask for the Delete repair mode: a few passes later it is refused, saying `said`."""
    patch_spec(k8s, DELETE_MODE)
    for _ in range(3):
        run.run_pass()
    cond = current(k8s, "Reconciled")
    assert (cond["status"], cond["reason"]) == ("False", "RepairModeNotGranted"), cond
    assert said in cond["message"], cond["message"]


def _agent_may_delete_pods(k8s: client.ApiClient, identity: Identity) -> bool:
    """What the API server's RBAC answers for istio-system's istio-cni ServiceAccount."""
    agent = Identity(AGENTS, CNI, identity.kubeconfig)
    return chart_rbac._can(k8s, agent, "delete", "pods", namespace="default")


def test_a_delete_repair_mode_the_chart_does_not_grant_changes_nothing(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    identity: Identity,
    audit: AuditLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the chart's ServiceAccount with the chart's default arguments (no
    # istioCniRepair.deletePods), in process: the data plane's answer alone.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    assert "--istio-cni-may-delete-pods" not in identity.operator_args
    run = InProcess(identity.kubeconfig, identity.operator_args)
    uid = run.converge(k8s, AGENTS)
    before, settings = ours(k8s, AGENTS, uid), _cni_settings(k8s)
    assert settings["REPAIR_DELETE_PODS"] == "false"
    mark = audit.mark()
    try:
        _delete_mode_refused(run, k8s, "--set istioCniRepair.deletePods=true")
        assert ours(k8s, AGENTS, uid) == before
        assert _cni_settings(k8s) == settings
        assert dataplane_writes(audit, mark, identity.user) == []
        assert chart_rbac.forbidden(audit, mark, identity) == []
        assert len(events(k8s, uid, "RepairModeNotGranted")) == 1
        assert not _agent_may_delete_pods(k8s, identity)
    finally:
        patch_spec(k8s, DEFAULT_MODE)
    run.converge(k8s, AGENTS)
    assert ours(k8s, AGENTS, uid) == before


def test_the_chart_value_grants_istio_cni_pod_delete_and_the_mode_is_applied(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    values = {
        "agents": {"namespaces": [AGENTS, CLEAN, HELMISH]},
        "istioCniRepair": {"deletePods": True},
    }
    with chart_identity(cluster, k8s, values) as granted:
        assert "--istio-cni-may-delete-pods" in granted.operator_args
        wait_for(lambda: _agent_may_delete_pods(k8s, granted), TIMEOUT, "istio-cni may delete pods")
        # The grant is istio-cni's: the operator's own account holds no Pod write.
        for verb in ("delete", "patch", "update", "create"):
            assert not chart_rbac._can(k8s, granted, verb, "pods", namespace="default"), verb
        run = InProcess(granted.kubeconfig, granted.operator_args)
        patch_spec(k8s, DELETE_MODE)
        try:
            run.converge(k8s, AGENTS)
            assert _cni_settings(k8s) == {
                "REPAIR_LABEL_PODS": "false",
                "REPAIR_DELETE_PODS": "true",
                "REPAIR_REPAIR_PODS": "false",
            }
        finally:
            patch_spec(k8s, DEFAULT_MODE)
        run.converge(k8s, AGENTS)
        assert _cni_settings(k8s)["REPAIR_REPAIR_PODS"] == "true"
    wait_for(
        lambda: not _agent_may_delete_pods(k8s, identity),
        TIMEOUT,
        "the grant gone with the chart's RBAC",
    )


def test_standalone_grants_istio_cni_pod_delete_only_for_the_delete_mode(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    identity: Identity,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the chart the operator keeps istio-cni's ClusterRole: holding pod
    # delete itself (system:masters), which it asks the API server, it grants it.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    run = InProcess(cluster.user_kubeconfig(STANDALONE_USER, ["system:masters"]))
    run.converge(k8s, AGENTS)
    assert not deletes(k8s)
    patch_spec(k8s, DELETE_MODE)
    try:
        run.converge(k8s, AGENTS)
        assert deletes(k8s)
        assert _cni_settings(k8s)["REPAIR_DELETE_PODS"] == "true"
        wait_for(
            lambda: _agent_may_delete_pods(k8s, identity), TIMEOUT, "istio-cni may delete pods"
        )
    finally:
        patch_spec(k8s, DEFAULT_MODE)
    run.converge(k8s, AGENTS)
    assert not deletes(k8s)
    assert _cni_settings(k8s)["REPAIR_DELETE_PODS"] == "false"


def _istio_cni_role(k8s: client.ApiClient) -> client.V1ClusterRole:
    return client.RbacAuthorizationV1Api(k8s).read_cluster_role(CNI)


def deletes(k8s: client.ApiClient) -> bool:
    """Whether the standalone operator's istio-cni ClusterRole grants delete on pods."""
    rules = _istio_cni_role(k8s).rules
    return any("pods" in r.resources and "delete" in r.verbs for r in rules)


# Standalone, an operator that may read everything, report on its AmbientMesh
# and nothing more: it holds no pod delete, and no escalate, to grant.
LIMITED_USER = "ambient-operator-limited"
LIMITED_RULES = [
    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@contextlib.contextmanager
def limited_operator(cluster: LocalCluster, k8s: client.ApiClient) -> Iterator[Path]:
    """A kubeconfig of LIMITED_USER, bound to LIMITED_RULES while in use."""
    rbac = client.RbacAuthorizationV1Api(k8s)
    name = unique_name("limited-operator")
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": LIMITED_RULES})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "User", "name": LIMITED_USER}],
        }
    )
    try:
        yield cluster.user_kubeconfig(LIMITED_USER, [])
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_standalone_refuses_the_delete_mode_when_it_cannot_grant_it(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: Mesh,
    audit: AuditLog,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    with limited_operator(cluster, k8s) as kubeconfig:
        run = InProcess(kubeconfig)
        uid = str(get_mesh(k8s)["metadata"]["uid"])
        before, role = ours(k8s, AGENTS, uid), _istio_cni_role(k8s)
        mark = audit.mark()
        try:
            _delete_mode_refused(run, k8s, "grant the operator delete on pods")
            assert dataplane_writes(audit, mark, LIMITED_USER) == []
            assert ours(k8s, AGENTS, uid) == before
            assert _istio_cni_role(k8s).metadata.resource_version == role.metadata.resource_version
            assert not deletes(k8s)
        finally:
            patch_spec(k8s, DEFAULT_MODE)


# -- under the chart's RBAC -----------------------------------------------------------------


def test_a_namespace_typo_changes_nothing(
    k8s: client.ApiClient, operator: Running, identity: Identity, audit: AuditLog
) -> None:
    uid = wait_converged(operator, k8s)
    before = ours(k8s, AGENTS, uid)
    assert {kind for kind, _ in before} == {"DaemonSet", "ConfigMap", "ServiceAccount"}
    typo = unique_name("does-not-exist")
    mark = audit.mark()
    set_namespace(k8s, typo)
    try:
        cond = wait_reconciled(operator, k8s, "NamespaceNotFound")
        assert cond["status"] == "False"
        assert typo in cond["message"] and AGENTS in cond["message"]
        passes_later(operator)
        assert ours(k8s, AGENTS, uid) == before
        assert len([m for m in events(k8s, uid, "NamespaceNotFound") if typo in m]) == 1
        assert dataplane_writes(audit, mark, identity.user) == []
    finally:
        set_namespace(k8s, AGENTS)
    wait_converged(operator, k8s)
    assert ours(k8s, AGENTS, uid) == before


def _hand_daemonset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "labels": {**OUR_LABELS, **labels}},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    # No node carries this: the DaemonSet exists, no pod runs.
                    "nodeSelector": {"example.com/never": "true"},
                    "containers": [{"name": "exporter", "image": "example.com/node-exporter:1"}],
                },
            },
        },
    }


def test_hand_labelled_objects_are_never_pruned(
    k8s: client.ApiClient, operator: Running, team: Team
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    uid = wait_converged(operator, k8s)
    name = unique_name("hand-made")
    made = {
        ("ConfigMap", AGENTS): core.create_namespaced_config_map(
            AGENTS, {"metadata": {"name": name, "labels": OUR_LABELS}, "data": {"k": "v"}}
        ),
        ("DaemonSet", "kube-system"): apps.create_namespaced_daemon_set(
            "kube-system", _hand_daemonset(unique_name("node-exporter"))
        ),
        # Made by the team itself, which may create ConfigMaps and nothing more.
        ("ConfigMap", team.namespace): client.CoreV1Api(team.api).create_namespaced_config_map(
            team.namespace,
            {"metadata": {"name": name, "labels": OUR_LABELS}, "data": {"k": "v"}},
        ),
        ("Service", team.namespace): core.create_namespaced_service(
            team.namespace,
            {
                "metadata": {"name": name, "labels": OUR_LABELS},
                "spec": {"selector": {"app": name}, "ports": [{"port": 9100}]},
            },
        ),
    }
    readers = {
        "ConfigMap": core.read_namespaced_config_map,
        "DaemonSet": apps.read_namespaced_daemon_set,
        "Service": core.read_namespaced_service,
    }

    def survivors() -> dict[tuple[str, str], str]:
        found = {}
        for key, obj in made.items():
            try:
                found[key] = readers[key[0]](obj.metadata.name, key[1]).metadata.uid
            except ApiException as exc:
                if exc.status != 404:
                    raise
                found[key] = "deleted"
        return found

    expected = {key: obj.metadata.uid for key, obj in made.items()}
    try:
        passes_later(operator)
        assert survivors() == expected
        # A spec change that prunes: the Windows agents go, the hand-made objects stay.
        windows = {k for k in ours(k8s, AGENTS, uid) if "windows" in k[1]}
        assert windows
        patch_spec(k8s, {"platforms": {"windows": {"enabled": False}}})
        try:
            wait_for(
                lambda: not windows & set(ours(k8s, AGENTS, uid)),
                TIMEOUT,
                "the Windows agents pruned",
            )
            passes_later(operator)
            assert survivors() == expected
        finally:
            patch_spec(k8s, {"platforms": {"windows": {"enabled": True}}})
        wait_converged(operator, k8s)
        passes_later(operator)
        assert survivors() == expected
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_config_map(name, AGENTS)
        with contextlib.suppress(ApiException):
            apps.delete_namespaced_daemon_set(
                made[("DaemonSet", "kube-system")].metadata.name, "kube-system"
            )


def test_a_move_into_helm_objects_is_a_name_conflict(
    k8s: client.ApiClient, operator: Running
) -> None:
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    uid = wait_converged(operator, k8s)
    helm_meta = {
        "labels": {c.LABEL_MANAGED_BY: "Helm"},
        "annotations": {
            "meta.helm.sh/release-name": "istio-cni",
            "meta.helm.sh/release-namespace": HELMISH,
        },
    }
    core.create_namespaced_service_account(
        HELMISH, {"metadata": {"name": "ztunnel", **helm_meta}}, field_manager="helm"
    )
    core.create_namespaced_config_map(
        HELMISH,
        {"metadata": {"name": "istio-cni-config", **helm_meta}, "data": {"LOG_LEVEL": "info"}},
        field_manager="helm",
    )

    def helm_objects() -> dict[str, dict[str, Any]]:
        return {
            "sa": snapshot(core.read_namespaced_service_account("ztunnel", HELMISH)),
            "cm": snapshot(core.read_namespaced_config_map("istio-cni-config", HELMISH)),
        }

    helm_before = helm_objects()
    assert helm_before["sa"]["managers"] == ["helm"]
    before = ours(k8s, AGENTS, uid)
    set_namespace(k8s, HELMISH)
    try:
        cond = wait_reconciled(operator, k8s, "NameConflict")
        for named in (f"ServiceAccount {HELMISH}/ztunnel", f"ConfigMap {HELMISH}/istio-cni-config"):
            assert named in cond["message"], cond["message"]
        assert "helm" in cond["message"]
        passes_later(operator)
        assert helm_objects() == helm_before
        assert ours(k8s, AGENTS, uid) == before  # nothing pruned in a refused pass
        assert len([m for m in events(k8s, uid, "NameConflict") if HELMISH in m]) == 1
        # The agents that would run with Helm's account or configuration are not written.
        written = {ds.metadata.name for ds in apps.list_namespaced_daemon_set(HELMISH).items}
        assert not written & {"ztunnel", "istio-cni-node"}, written
    finally:
        set_namespace(k8s, AGENTS)
    wait_converged(operator, k8s)
    wait_for(lambda: not ours(k8s, HELMISH, uid), TIMEOUT, f"our objects in {HELMISH} pruned")
    assert helm_objects() == helm_before
    assert ours(k8s, AGENTS, uid) == before


@dataclass
class Timeline:
    """DaemonSet watch events in the API server's order: (type, namespace, name, took over)."""

    entries: list[tuple[str, str, str, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


@contextlib.contextmanager
def daemonset_timeline(cluster: LocalCluster) -> Iterator[Timeline]:
    """One watch of every DaemonSet with our labels, so events of both namespaces are ordered."""
    timeline = Timeline()
    started = threading.Event()
    with api_client_for(cluster.kubeconfig) as api:
        apps = client.AppsV1Api(api)
        version = apps.list_daemon_set_for_all_namespaces(
            label_selector=SELECTOR
        ).metadata.resource_version

        def follow() -> None:
            nonlocal version
            stream = watch.Watch()
            started.set()
            while not timeline.stop.is_set():
                for event in stream.stream(
                    apps.list_daemon_set_for_all_namespaces,
                    label_selector=SELECTOR,
                    resource_version=version,
                    timeout_seconds=2,
                ):
                    obj = event["raw_object"]
                    meta = obj["metadata"]
                    version = meta["resourceVersion"]
                    gone = event["type"] == "DELETED" or bool(meta.get("deletionTimestamp"))
                    timeline.entries.append(
                        (
                            "DELETED" if gone else event["type"],
                            meta["namespace"],
                            meta["name"],
                            took_over(obj),
                        )
                    )
                    if timeline.stop.is_set():
                        break

        thread = threading.Thread(target=follow, name="daemonset-timeline", daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield timeline
        finally:
            timeline.stop.set()
            thread.join(10)


def test_a_move_to_a_clean_namespace_is_make_before_break(
    cluster: LocalCluster, k8s: client.ApiClient, operator: Running
) -> None:
    uid = wait_converged(operator, k8s)
    old = {name for kind, name in ours(k8s, AGENTS, uid) if kind == "DaemonSet"}
    assert old
    with daemonset_timeline(cluster) as timeline:
        set_namespace(k8s, CLEAN)
        try:
            wait_for(
                lambda: not any(k[0] == "DaemonSet" for k in ours(k8s, AGENTS, uid)),
                TIMEOUT,
                f"the agents in {AGENTS} pruned",
            )
            wait_converged(operator, k8s)
        except (TimeoutError, AssertionError):
            set_namespace(k8s, AGENTS)
            raise
    # Replay the order: the moment every new DaemonSet has taken over, and the
    # first deletion of an old one.
    state: dict[tuple[str, str], bool] = {(AGENTS, name): True for name in old}
    taken_over_at = first_deleted_at = None
    for index, (kind, namespace, name, done) in enumerate(timeline.entries):
        if kind == "DELETED":
            state.pop((namespace, name), None)
            if namespace == AGENTS and name in old and first_deleted_at is None:
                first_deleted_at = index
            continue
        state[(namespace, name)] = done
        if taken_over_at is None and all(state.get((CLEAN, n)) for n in old):
            taken_over_at = index
            assert all((AGENTS, n) in state for n in old), "an old DaemonSet went first"
    assert taken_over_at is not None, timeline.entries
    assert first_deleted_at is not None and first_deleted_at > taken_over_at, timeline.entries
    # The replay held at least one agent (ztunnel on the pod network) to Ready
    # beside its predecessor.
    beside = [
        ds.metadata.name
        for ds in client.AppsV1Api(k8s)
        .list_namespaced_daemon_set(CLEAN, label_selector=SELECTOR)
        .items
        if not ds.spec.template.spec.host_network
    ]
    assert beside, "no agent on the pod network to hand over beside its predecessor"
    after = ours(k8s, CLEAN, uid)
    assert {kind for kind, _ in after} == {"DaemonSet", "ConfigMap", "ServiceAccount"}
    assert ours(k8s, AGENTS, uid) == {}
    # And back, the same way, for the modules that follow.
    set_namespace(k8s, AGENTS)
    wait_for(lambda: not ours(k8s, CLEAN, uid), TIMEOUT, f"the agents in {CLEAN} pruned")
    wait_converged(operator, k8s)


# What upstream's charts' NetworkPolicies admit (templates/networkpolicy.yaml of
# each), and the selector of our Linux DaemonSets, literally.
ZTUNNEL_POLICY = {
    "podSelector": {"matchLabels": {"ambientoperator.io/platform": "linux", _NAME: "ztunnel"}},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [
        {"ports": [{"protocol": "TCP", "port": 15021}]},
        {"ports": [{"protocol": "TCP", "port": 15020}]},
        {"ports": [{"protocol": "TCP", "port": 15000}]},
        {"ports": [{"protocol": "TCP", "port": 15008}]},
        {"ports": [{"protocol": "TCP", "port": 15001}]},
        {"ports": [{"protocol": "TCP", "port": 15006}]},
        {"ports": [{"protocol": "TCP", "port": 15053}, {"protocol": "UDP", "port": 15053}]},
    ],
    "egress": [{}],
}
CNI_POLICY = {
    "podSelector": {"matchLabels": {"ambientoperator.io/platform": "linux", _NAME: CNI}},
    "policyTypes": ["Ingress", "Egress"],
    "ingress": [
        {"ports": [{"protocol": "TCP", "port": 15014}]},
        {"ports": [{"protocol": "TCP", "port": 8000}]},
    ],
    "egress": [{}],
}


def _policy(k8s: client.ApiClient, name: str) -> Any:
    try:
        return client.NetworkingV1Api(k8s).read_namespaced_network_policy(name, AGENTS)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def _spec_of(k8s: client.ApiClient, policy: Any) -> Any:
    return k8s.sanitize_for_serialization(policy.spec)


def test_network_policies_follow_the_spec_and_leave_a_foreign_one_alone(
    k8s: client.ApiClient, operator: Running
) -> None:
    net = client.NetworkingV1Api(k8s)
    uid = wait_converged(operator, k8s)
    assert _policy(k8s, "ztunnel") is None and _policy(k8s, CNI) is None
    # Somebody else's policy under the name of istio-cni's, as a Helm install leaves it.
    foreign_spec = {"podSelector": {"matchLabels": {"k8s-app": "istio-cni-node"}}}
    net.create_namespaced_network_policy(
        AGENTS,
        {"metadata": {"name": CNI, "labels": {c.LABEL_MANAGED_BY: "Helm"}}, "spec": foreign_spec},
        field_manager="helm",
    )
    foreign = snapshot(_policy(k8s, CNI))
    patch_spec(k8s, {"networkPolicy": {"enabled": True}})
    try:
        cond = wait_reconciled(operator, k8s, "NameConflict")
        assert f"NetworkPolicy {AGENTS}/{CNI}" in cond["message"], cond["message"]
        ztunnel = wait_for(lambda: _policy(k8s, "ztunnel"), TIMEOUT, "ztunnel's NetworkPolicy")
        assert owned_by(ztunnel, uid)
        assert _spec_of(k8s, ztunnel) == ZTUNNEL_POLICY
        passes_later(operator)
        assert snapshot(_policy(k8s, CNI)) == foreign
        assert _spec_of(k8s, _policy(k8s, CNI))["podSelector"] == foreign_spec["podSelector"]
        # Once the name is free, the operator's own policy takes it.
        net.delete_namespaced_network_policy(CNI, AGENTS)
        wait_converged(operator, k8s)
        cni = wait_for(
            lambda: (found := _policy(k8s, CNI)) is not None and owned_by(found, uid) and found,
            TIMEOUT,
            "istio-cni's NetworkPolicy",
        )
        assert _spec_of(k8s, cni) == CNI_POLICY
    finally:
        with contextlib.suppress(ApiException):
            if _policy(k8s, CNI) is not None and not owned_by(_policy(k8s, CNI), uid):
                net.delete_namespaced_network_policy(CNI, AGENTS)
        # A merge patch's null removes the field: the default, no NetworkPolicies.
        patch_spec(k8s, {"networkPolicy": None})
    wait_for(
        lambda: _policy(k8s, "ztunnel") is None and _policy(k8s, CNI) is None,
        TIMEOUT,
        "the NetworkPolicies pruned",
    )
    wait_converged(operator, k8s)


def test_the_narrow_rules_were_enough(
    k8s: client.ApiClient, operator: Running, identity: Identity, audit: AuditLog
) -> None:
    # Last in the module: every case above ran under rules that let the
    # operator write the agents' kinds in agents.namespaces only and no RBAC...
    for where in ("kube-system", "default", ""):
        assert not chart_rbac._can(
            k8s, identity, "delete", "daemonsets", group="apps", namespace=where
        )
        assert not chart_rbac._can(k8s, identity, "delete", "configmaps", namespace=where)
    for verb in ("create", "patch"):
        assert not chart_rbac._can(
            k8s, identity, verb, "clusterrolebindings", group="rbac.authorization.k8s.io"
        )
    for where in (AGENTS, CLEAN, HELMISH):
        assert chart_rbac._can(k8s, identity, "delete", "daemonsets", group="apps", namespace=where)
    # ...and not one of its requests was refused.
    refused = chart_rbac.forbidden(audit, operator.since, identity)
    assert refused == [], refused
