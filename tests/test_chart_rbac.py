"""The chart's RBAC is enough and no more.

Offline: no wildcards, Secrets only by name, the names the operator uses,
every watch the operator registers, agents written only in the agents'
namespaces, and the istio-cni agent's RBAC shipped by the chart (the same
rules `ambient-operator render` emits without it), so the operator holds
neither `pods/status` nor any RBAC write.

On the local control plane: the chart's ServiceAccount, ClusterRoles, Roles
and bindings are applied, and the real operator runs with a token of that
ServiceAccount and the chart's arguments through the whole scenario (an
AmbientMesh converging, a waypoint programmed, the webhook mutating a Windows
pod) without a single Forbidden answer in the API server's audit log.
SubjectAccessReviews show what the identity cannot do. The helpers here
(chart_identity, the fixtures) serve the other modules that run the operator
under the chart's RBAC: test_ownership_dataplane.py runs the namespace typo,
the moves and the hand-labelled objects with these rules.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, apply_objects
from ambient_devcluster.harness import (
    borrowed_mesh,
    condition,
    read_mesh,
)
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.app.operator import Operator
from ambient_operator.app.options import Options
from ambient_operator.cli.main import build_parser
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.render import render_dataplane
from ambient_operator.render import values as rv
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import CONFIG_NAME, SECRET_NAME, WebhookOptions
from chart_helpers import by_kind, one, template
from checks import every
from conftest import SAMPLE_NODES, ignoring, unique_name, wait_for
from operator_harness import AuditLog, RunningOperator, free_port, webhook_args

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# Arguments of the chart's Deployment that say what the operator may touch.
SCOPE_FLAGS = (
    "--agents-namespace=",
    "--cni-rbac=",
    "--istio-cni-may-delete-pods",
    "--network-attachments",
)
AGENTS_NAMESPACE = "istio-system"
GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "high-availability": {"highAvailability": {"enabled": True}},
    "webhook-off": {"webhook": {"enabled": False}},
    "adoption": {"adoption": {"enabled": True}},
    "istio-cni-deletes-pods": {"istioCniRepair": {"deletePods": True}},
}
Rule = Mapping[str, Any]
GET_LIST = ("get", "list", "watch")


def allows(rules: Sequence[Rule], group: str, resource: str, verb: str, name: str = "") -> bool:
    """Whether RBAC rules allow a request (what the API server's RBAC authorizer does)."""
    for rule in rules:
        if group not in rule.get("apiGroups", []) or resource not in rule.get("resources", []):
            continue
        if verb not in rule.get("verbs", []):
            continue
        names = rule.get("resourceNames") or []
        if not names or name in names:
            return True
    return False


def _rules(
    values: Mapping[str, Any],
    kind: str,
    namespace: str | None = None,
    suffix: str = "",
    *,
    agents_too: bool = False,
) -> list[Rule]:
    """Rules the chart grants the operator (and the istio-cni agent with `agents_too`)."""
    objects = template(values)
    found = [
        obj
        for obj in by_kind(objects, kind)
        if (namespace is None or obj["metadata"].get("namespace") == namespace)
        and obj["metadata"]["name"].endswith(suffix)
        and (agents_too or not obj["metadata"]["name"].endswith("-istio-cni"))
    ]
    return [rule for obj in found for rule in obj.get("rules", [])]


def chart_operator_args(objects: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The chart Deployment's arguments that scope the operator (SCOPE_FLAGS)."""
    container = one(list(objects), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return tuple(arg for arg in container["args"] if arg.startswith(SCOPE_FLAGS))


# -- offline ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_no_wildcards(case: str) -> None:
    for kind in ("ClusterRole", "Role"):
        for rule in _rules(VALUE_SETS[case], kind, agents_too=True):
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in item for item in rule.get(key) or []), (kind, rule)
            assert "nonResourceURLs" not in rule


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_secrets_only_by_name_in_the_release_namespace(case: str) -> None:
    objects = template(VALUE_SETS[case], namespace="ops")
    for rule in (r for obj in by_kind(objects, "ClusterRole") for r in obj["rules"]):
        assert "secrets" not in rule["resources"], rule
    roles = by_kind(objects, "Role")
    agents = [role for role in roles if role["metadata"]["namespace"] == AGENTS_NAMESPACE]
    assert len(agents) == 1
    # Only a take-over (adoption.enabled) lists them there, to read Helm's release records.
    listed = [r for r in agents[0]["rules"] if "secrets" in r["resources"]]
    assert listed == (
        [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]
        if case == "adoption"
        else []
    )
    for role in roles:
        if role in agents:
            continue
        assert role["metadata"]["namespace"] == "ops"
        for rule in role["rules"]:
            if "secrets" not in rule["resources"]:
                continue
            if rule["verbs"] == ["create"]:
                continue  # a POST carries no name to restrict; creating reads nothing
            assert rule["resourceNames"] == [SECRET_NAME], rule
            assert set(rule["verbs"]) <= {"get", "update"}, rule
    owns_secret = case not in ("cert-manager", "webhook-off")
    assert any("secrets" in r["resources"] for role in roles for r in role["rules"]) == owns_secret


def test_resource_names_are_the_operators() -> None:
    cluster_rules = _rules({}, "ClusterRole")
    role_rules = _rules({}, "Role", namespace="ambient-operator")
    class_name = AmbientMeshSpec().waypoints.class_name
    for verb in ("patch", "delete"):
        assert allows(cluster_rules, GW_GROUP, "gatewayclasses", verb, class_name)
        assert not allows(cluster_rules, GW_GROUP, "gatewayclasses", verb, c.ISTIO_WAYPOINT_CLASS)
    renamed = _rules({"waypoints": {"className": "mesh-waypoints"}}, "ClusterRole")
    assert allows(renamed, GW_GROUP, "gatewayclasses", "patch", "mesh-waypoints")
    assert not allows(renamed, GW_GROUP, "gatewayclasses", "patch", class_name)
    assert allows(
        cluster_rules,
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "patch",
        CONFIG_NAME,
    )
    assert allows(cluster_rules, c.API_GROUP, f"{c.PLURAL}/status", "patch", c.MESH_NAME)
    assert allows(role_rules, "", "secrets", "update", SECRET_NAME)
    assert allows(role_rules, "coordination.k8s.io", "leases", "update", Options().lease_name)
    assert not allows(
        cluster_rules, "rbac.authorization.k8s.io", "clusterroles", "create", "cluster-admin"
    )
    assert not allows(role_rules, "", "secrets", "get", "some-other-secret")


def _rendered(cni_rbac: bool) -> list[dict[str, Any]]:
    spec = AmbientMeshSpec.model_validate({})
    nodes = [n for n in yaml.safe_load(SAMPLE_NODES.read_text())["items"]]
    facts = ClusterFacts(nodes=tuple(NodeFacts.from_node(n) for n in nodes))
    return list(render_dataplane(spec, facts, cni_rbac=cni_rbac).objects)


def _grants(rules: Sequence[Rule]) -> set[tuple[str, str, str, str]]:
    return {
        (group, resource, verb, name)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def test_the_chart_ships_what_render_grants_the_istio_cni_agent() -> None:
    # What the agent may do, from istio-cni's own needs (see the template's comments).
    expected = {
        *(("", res, verb, "") for res in ("pods", "namespaces", "nodes") for verb in GET_LIST),
        ("", "events", "create", ""),
        ("", "events", "patch", ""),
        ("", "pods/status", "patch", ""),
        ("", "pods/status", "update", ""),
        ("apps", "daemonsets", "get", "istio-cni-node"),
    }
    objects = template({"agents": {"namespaces": ["istio-system", "mesh-agents"]}})
    shipped = [o for o in by_kind(objects, "ClusterRole") if o["metadata"]["name"].endswith("-cni")]
    assert len(shipped) == 1
    assert _grants(shipped[0]["rules"]) == expected
    # Standalone (`ambient-operator render`, no chart) emits the same grant.
    rendered = [o for o in _rendered(cni_rbac=True) if o["kind"] == "ClusterRole"]
    assert _grants(rendered[0]["rules"]) == expected
    binding = next(
        o for o in by_kind(objects, "ClusterRoleBinding") if o["metadata"]["name"].endswith("-cni")
    )
    assert binding["roleRef"]["name"] == shipped[0]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": rv.SA_ISTIO_CNI, "namespace": ns}
        for ns in ("istio-system", "mesh-agents")
    ]
    # With the chart the operator renders no RBAC of its own.
    kinds = {o["kind"] for o in _rendered(cni_rbac=False)}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert kinds == {"ConfigMap", "DaemonSet", "ServiceAccount"}, "the agents are still rendered"
    assert "--cni-rbac=chart" in chart_operator_args(objects)


@pytest.mark.parametrize(
    ("values", "deletes"),
    [
        ({}, False),
        ({"istioCniRepair": {"deletePods": False}}, False),
        (VALUE_SETS["istio-cni-deletes-pods"], True),
    ],
    ids=["default", "off", "on"],
)
def test_istio_cni_may_delete_pods_only_when_the_chart_value_says_so(
    values: dict[str, Any], deletes: bool
) -> None:
    objects = template(values)
    shipped = [o for o in by_kind(objects, "ClusterRole") if o["metadata"]["name"].endswith("-cni")]
    assert len(shipped) == 1
    assert allows(shipped[0]["rules"], "", "pods", "delete") is deletes
    # The operator is told, so that it refuses the Delete repair mode without the grant.
    assert ("--istio-cni-may-delete-pods" in chart_operator_args(objects)) is deletes
    # The grant is the agent's alone: the operator holds no Pod write either way.
    held = _rules(values, "ClusterRole") + _rules(values, "Role")
    for verb in ("create", "patch", "update", "delete"):
        assert not allows(held, "", "pods", verb), verb


NADS = ("k8s.cni.cncf.io", "network-attachment-definitions")


def test_network_attachments_only_with_the_chart_value_and_written_only_in_default() -> None:
    default = template({})
    assert "--network-attachments" not in chart_operator_args(default)
    every(
        [r for o in by_kind(default, "ClusterRole") + by_kind(default, "Role") for r in o["rules"]],
        lambda r: NADS[0] not in r["apiGroups"],
        "rules without multus.enabled",
    )
    values = {"multus": {"enabled": True}}
    objects = template(values)
    assert "--network-attachments" in chart_operator_args(objects)
    cluster_rules = _rules(values, "ClusterRole")
    assert {
        v for v in (*GET_LIST, "create", "patch", "delete") if allows(cluster_rules, *NADS, v)
    } == {
        "list",
        "watch",
    }
    roles = [o for o in by_kind(objects, "Role") if NADS[0] in str(o["rules"])]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in roles] == [
        (
            "default",
            [
                {
                    "apiGroups": [NADS[0]],
                    "resources": [NADS[1]],
                    "verbs": ["get", "create", "patch", "delete"],
                }
            ],
        )
    ]
    (binding,) = [
        o
        for o in by_kind(objects, "RoleBinding")
        if o["roleRef"]["name"] == roles[0]["metadata"]["name"]
    ]
    assert binding["metadata"]["namespace"] == "default"
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_no_agent_permission_and_no_rbac_writes(case: str) -> None:
    held = _grants(_rules(VALUE_SETS[case], "ClusterRole") + _rules(VALUE_SETS[case], "Role"))
    assert not {g for g in held if g[1] == "pods/status"}
    assert not {g for g in held if g[0] == "rbac.authorization.k8s.io"}
    for verb in ("escalate", "bind", "impersonate"):
        assert not {g for g in held if g[2] == verb}


def test_agents_are_written_only_in_the_agents_namespaces() -> None:
    # kube-system stays a valid agents' namespace (upstream suggests it for the
    # system-node-critical priority class): the API and the chart both take it.
    assert AmbientMeshSpec.model_validate({"namespace": "kube-system"}).namespace == "kube-system"
    values = {"agents": {"namespaces": ["istio-system", "kube-system"]}}
    objects = template(values)
    cluster_rules = _rules(values, "ClusterRole")
    for verb in ("create", "patch", "update", "delete"):
        assert not allows(cluster_rules, "apps", "daemonsets", verb), verb
        assert not allows(cluster_rules, "", "configmaps", verb), verb
    assert allows(cluster_rules, "apps", "daemonsets", "watch")
    for namespace in ("istio-system", "kube-system"):
        rules = _rules(values, "Role", namespace=namespace, suffix="-agents")
        for verb in ("create", "patch", "delete"):
            for group, resource in (("apps", "daemonsets"), ("", "configmaps")):
                assert allows(rules, group, resource, verb), (namespace, resource, verb)
            assert allows(rules, "", "serviceaccounts", verb)
        binding = next(
            o
            for o in by_kind(objects, "RoleBinding")
            if o["metadata"]["namespace"] == namespace and o["metadata"]["name"].endswith("-agents")
        )
        assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert chart_operator_args(objects) == (
        "--agents-namespace=istio-system",
        "--agents-namespace=kube-system",
        "--cni-rbac=chart",
    )


def test_every_watch_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "unused"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # Operator() sets it; restored after
    scope = build_parser().parse_args(["run", *chart_operator_args(template({}))])
    operator = Operator(
        Options(
            kubeconfig=str(kubeconfig),
            webhook=WebhookOptions(url="https://127.0.0.1:1"),
            agents_namespaces=tuple(scope.agents_namespace),
            cni_rbac=scope.cni_rbac,
        )
    )
    watched = {(feed.kind.group, feed.kind.plural) for feed in operator.watching.feeds}
    watched.add(("", "pods"))  # the pod informer's (cluster/pods.py)
    assert len(watched) >= 10
    # With the chart's istio-cni RBAC the operator has no RBAC object to keep.
    assert not {w for w in watched if w[0] == "rbac.authorization.k8s.io"}, watched
    held = _rules({}, "ClusterRole")
    for group, resource in sorted(watched):
        for verb in ("list", "watch"):
            assert allows(held, group, resource, verb), f"cannot {verb} {group}/{resource}"
    # kopf follows CRDs for its own discovery, whatever it handles.
    assert allows(held, "apiextensions.k8s.io", "customresourcedefinitions", "watch")


# -- on the local control plane ------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    namespace: str
    service_account: str
    kubeconfig: Path
    # What the chart's Deployment passes to scope the operator (SCOPE_FLAGS).
    operator_args: tuple[str, ...] = ()

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def groups(self) -> list[str]:
        return [
            "system:serviceaccounts",
            f"system:serviceaccounts:{self.namespace}",
            "system:authenticated",
        ]


@contextlib.contextmanager
def chart_identity(
    cluster: LocalCluster, k8s: client.ApiClient, values: Mapping[str, Any] | None = None
) -> Iterator[Identity]:
    """The chart's ServiceAccount and RBAC (rendered with `values`), and a token of it.

    The release gets a namespace of its own; the agents' namespaces the
    values name are created when missing (the chart puts a Role in each).
    """
    namespace, release = unique_name("ao-rbac"), unique_name("rbac")
    rendered = template(values, release=release, namespace=namespace)
    objects = [o for o in rendered if o["kind"] in RBAC_KINDS]
    core = client.CoreV1Api(k8s)
    core.create_namespace({"metadata": {"name": namespace}})
    for agents in {o["metadata"]["namespace"] for o in objects if o["kind"] == "Role"}:
        with ignoring(409):  # istio-system is shared with other modules
            core.create_namespace({"metadata": {"name": agents}})
    apply_objects(k8s, objects)
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    try:
        yield Identity(
            namespace,
            account,
            cluster.serviceaccount_kubeconfig(namespace, account),
            chart_operator_args(rendered),
        )
    finally:
        rbac = client.RbacAuthorizationV1Api(k8s)
        for obj in objects:
            meta = obj["metadata"]
            with contextlib.suppress(ApiException):
                if obj["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(meta["name"])
                elif obj["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(meta["name"])
                elif obj["kind"] == "Role" and meta["namespace"] != namespace:
                    rbac.delete_namespaced_role(meta["name"], meta["namespace"])
                elif obj["kind"] == "RoleBinding" and meta["namespace"] != namespace:
                    rbac.delete_namespaced_role_binding(meta["name"], meta["namespace"])
        with contextlib.suppress(ApiException):
            core.delete_namespace(namespace)


@pytest.fixture(scope="module")
def identity(cluster: LocalCluster, k8s: client.ApiClient) -> Iterator[Identity]:
    """The chart's ServiceAccount and RBAC with the default values, and its token."""
    with chart_identity(cluster, k8s) as ident:
        yield ident


def _custom(k8s: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


@dataclass(frozen=True)
class Mesh:
    generation: int
    agents_namespace: str


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> Iterator[Mesh]:
    """The shared AmbientMesh, changed so that only a working operator can reconcile it.

    A new log level is a new generation and new DaemonSets: a Ready condition
    for that generation can only come from the operator under test. The mesh
    is put back (or deleted, when this module created it) afterwards.
    """

    def spec_for(original: dict[str, Any] | None) -> dict[str, Any]:
        spec = copy.deepcopy((original or {}).get("spec") or {})
        spec["logLevel"] = "debug" if spec.get("logLevel") != "debug" else "info"
        spec["newPodWorkaround"] = {**spec.get("newPodWorkaround", {}), "enabled": True}
        spec.setdefault("platforms", {}).setdefault("windows", {})["enabled"] = True
        return spec

    with borrowed_mesh(k8s, spec_for) as live:
        agents = AmbientMeshSpec.model_validate(live.get("spec") or {}).namespace
        with ignoring(409):  # other modules may have made it already
            client.CoreV1Api(k8s).create_namespace({"metadata": {"name": agents}})
        yield Mesh(int(live["metadata"]["generation"]), agents)


@pytest.fixture(scope="module")
def audit(cluster: LocalCluster) -> AuditLog:
    return AuditLog(cluster.audit_log)


@dataclass(frozen=True)
class Running:
    op: RunningOperator
    since: int
    enrolled: str


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    identity: Identity,
    mesh: Mesh,
    gateway_api_crds: None,
    audit: AuditLog,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Running]:
    """The operator as the chart's ServiceAccount, with the chart's scope, webhook on loopback."""
    # Whatever an earlier operator left, this must now be made by this identity.
    with ignoring(404):
        client.AdmissionregistrationV1Api(k8s).delete_mutating_webhook_configuration(CONFIG_NAME)
    enrolled = unique_name("rbac-enrolled")
    client.CoreV1Api(k8s).create_namespace(
        {"metadata": {"name": enrolled, "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}}
    )
    port = free_port()
    ns = identity.namespace
    op = RunningOperator(
        cluster,
        tmp_path_factory.mktemp("rbac-operator"),
        extra_args=[
            *webhook_args(port, ns),
            "--leader-election",
            "--lease-namespace",
            ns,
            "--resync-seconds",
            "5",
            *identity.operator_args,
        ],
        kubeconfig=identity.kubeconfig,
    )
    since = audit.mark()
    op.start()
    try:
        yield Running(op, since, enrolled)
    finally:
        op.stop()
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(k8s).delete_mutating_webhook_configuration(
                CONFIG_NAME
            )
        with contextlib.suppress(ApiException):
            client.CoreV1Api(k8s).delete_namespace(enrolled)
    log = op.log_text()
    assert "Traceback" not in log, log[-4000:]


def _fail_with_log(op: RunningOperator, what: str) -> NoReturn:
    raise AssertionError(f"{what}; operator log:\n{op.log_text()[-6000:]}")


def test_the_mesh_converges(
    k8s: client.ApiClient, mesh: Mesh, operator: Running, identity: Identity, audit: AuditLog
) -> None:
    def ready() -> bool:
        live = read_mesh(k8s) or {}
        cond = condition(live, "Ready")
        return cond.get("status") == "True" and cond.get("observedGeneration") == mesh.generation

    try:
        wait_for(ready, 120, "AmbientMesh Ready for the new generation")
    except TimeoutError:
        _fail_with_log(operator.op, f"not Ready: {condition(read_mesh(k8s) or {}, 'Ready')}")
    live = read_mesh(k8s) or {}
    assert condition(live, "Reconciled")["status"] == "True"
    daemonsets = (
        client.AppsV1Api(k8s)
        .list_namespaced_daemon_set(
            mesh.agents_namespace, label_selector=f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
        )
        .items
    )
    assert any("windows" in ds.metadata.name for ds in daemonsets)
    assert all(ds.status.number_ready == ds.status.desired_number_scheduled for ds in daemonsets)
    writes = audit.writes(operator.since, user=identity.user)
    assert any("/daemonsets" in w for w in writes if w.startswith(("create", "patch"))), writes
    assert any(w.startswith("patch") and "/ambientmeshes/default/status" in w for w in writes)
    # The istio-cni RBAC is the chart's: the operator writes no RBAC at all.
    assert not [w for w in writes if "rbac.authorization.k8s.io" in w], writes
    assert "--cni-rbac=chart" in identity.operator_args


def test_a_waypoint_is_programmed(k8s: client.ApiClient, operator: Running) -> None:
    core, custom = client.CoreV1Api(k8s), _custom(k8s)
    ns = unique_name("rbac-waypoint")
    core.create_namespace({"metadata": {"name": ns}})
    try:
        custom.create_namespaced_custom_object(
            GW_GROUP,
            GW_VERSION,
            ns,
            "gateways",
            {
                "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
                "kind": "Gateway",
                "metadata": {"name": "waypoint"},
                "spec": {
                    "gatewayClassName": AmbientMeshSpec().waypoints.class_name,
                    "listeners": [{"name": "mesh", "port": c.PORT_HBONE, "protocol": "HBONE"}],
                },
            },
        )

        def programmed() -> dict[str, Any] | None:
            gw: dict[str, Any] = custom.get_namespaced_custom_object(
                GW_GROUP, GW_VERSION, ns, "gateways", "waypoint"
            )
            cond = condition(gw, "Programmed")
            ok = cond.get("status") == "True" and (gw.get("status") or {}).get("addresses")
            return gw if ok else None

        try:
            gw = wait_for(programmed, 90, "the waypoint Gateway Programmed=True")
        except TimeoutError:
            _fail_with_log(operator.op, "waypoint not programmed")
        assert condition(gw, "Accepted")["status"] == "True"
        pods = core.list_namespaced_pod(ns, label_selector=f"{c.LABEL_GATEWAY_NAME}=waypoint")
        # Programmed means an available pod: the loop below judges at least one.
        assert pods.items, "a Programmed waypoint without a pod"
        for pod in pods.items:
            node = core.read_node(pod.spec.node_name)
            assert node.metadata.labels[c.LABEL_OS] == "linux"
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)


def _windows_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022},
            "tolerations": [
                {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}
            ],
            "containers": [{"name": "app", "image": "example.com/app:1"}],
        },
    }


def test_the_webhook_mutates_a_windows_pod(
    k8s: client.ApiClient, operator: Running, identity: Identity
) -> None:
    core = client.CoreV1Api(k8s)

    def injected() -> bool:
        out = core.create_namespaced_pod(operator.enrolled, _windows_pod("probe"), dry_run="All")
        return any(ct.name == d.CONTAINER_NAME for ct in out.spec.init_containers or [])

    try:
        wait_for(injected, 90, "the webhook to mutate a Windows pod")
    except TimeoutError:
        _fail_with_log(operator.op, "webhook not mutating")
    core.create_namespaced_pod(operator.enrolled, _windows_pod("app"))
    stored = core.read_namespaced_pod("app", operator.enrolled)
    assert stored.spec.init_containers[0].name == d.CONTAINER_NAME
    # The TLS Secret was created by this identity in its own namespace.
    secret = core.read_namespaced_secret(SECRET_NAME, identity.namespace)
    assert secret.type == "kubernetes.io/tls"
    config = client.AdmissionregistrationV1Api(k8s).read_mutating_webhook_configuration(CONFIG_NAME)
    assert config.webhooks[0].client_config.ca_bundle


def test_leader_lease_is_held(k8s: client.ApiClient, operator: Running, identity: Identity) -> None:
    lease = client.CoordinationV1Api(k8s).read_namespaced_lease(
        Options().lease_name, identity.namespace
    )
    assert lease.spec.holder_identity


def _can(
    k8s: client.ApiClient,
    who: Identity,
    verb: str,
    resource: str,
    *,
    group: str = "",
    namespace: str = "",
    name: str = "",
    subresource: str = "",
) -> bool:
    review = client.AuthorizationV1Api(k8s).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": who.user,
                "groups": who.groups,
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                    "name": name,
                },
            },
        }
    )
    return bool(review.status.allowed)


def test_subject_access_reviews(k8s: client.ApiClient, identity: Identity) -> None:
    ns = identity.namespace
    # What it cannot do.
    for verb in ("list", "watch", "get"):
        assert not _can(k8s, identity, verb, "secrets"), f"{verb} secrets cluster-wide"
        assert not _can(k8s, identity, verb, "secrets", namespace="kube-system")
    assert not _can(k8s, identity, "list", "secrets", namespace=ns)
    assert not _can(k8s, identity, "get", "secrets", namespace=ns, name="another-secret")
    for where in ("", "default", ns):
        assert not _can(k8s, identity, "create", "pods", namespace=where)
    assert not _can(k8s, identity, "create", "pods", namespace="default", subresource="exec")
    for verb in ("patch", "update", "delete", "create"):
        assert not _can(k8s, identity, verb, "nodes"), f"{verb} nodes"
        assert not _can(k8s, identity, verb, "nodes", name="linux-amd64-1")
        assert not _can(k8s, identity, verb, "namespaces", name="default")
    for verb in ("escalate", "bind"):
        assert not _can(k8s, identity, verb, "clusterroles", group="rbac.authorization.k8s.io")
    assert not _can(
        k8s,
        identity,
        "patch",
        "clusterroles",
        group="rbac.authorization.k8s.io",
        name="cluster-admin",
    )
    assert not _can(k8s, identity, "impersonate", "serviceaccounts")
    assert not _can(
        k8s, identity, "delete", "customresourcedefinitions", group="apiextensions.k8s.io"
    )
    # Controls: the same questions answered yes where the chart means yes.
    assert _can(k8s, identity, "get", "secrets", namespace=ns, name=SECRET_NAME)
    assert _can(k8s, identity, "create", "secrets", namespace=ns)
    assert not _can(k8s, identity, "create", "secrets", namespace="default")
    assert _can(k8s, identity, "list", "nodes")
    assert _can(k8s, identity, "patch", "daemonsets", group="apps", namespace="istio-system")
    # The agents' kinds are written in the agents' namespace only.
    for where in ("", "default", "kube-system", ns):
        for verb in ("create", "patch", "delete"):
            assert not _can(k8s, identity, verb, "daemonsets", group="apps", namespace=where)
            assert not _can(k8s, identity, verb, "configmaps", namespace=where)
    for verb in ("create", "patch", "delete"):
        assert _can(k8s, identity, verb, "configmaps", namespace=AGENTS_NAMESPACE)
    # No agent permission held to grant it, no RBAC written.
    assert not _can(k8s, identity, "patch", "pods", subresource="status", namespace="default")
    for resource in ("clusterroles", "clusterrolebindings", "roles", "rolebindings"):
        for verb in ("create", "patch", "delete"):
            assert not _can(k8s, identity, verb, resource, group="rbac.authorization.k8s.io")
            assert not _can(
                k8s, identity, verb, resource, group="rbac.authorization.k8s.io", name="istio-cni"
            )
    # GatewayClasses are changed by the one name the operator keeps.
    mine = AmbientMeshSpec().waypoints.class_name
    assert _can(k8s, identity, "patch", "gatewayclasses", group=GW_GROUP, name=mine)
    for other in (c.ISTIO_WAYPOINT_CLASS, "someone-elses"):
        for verb in ("patch", "delete", "update"):
            assert not _can(k8s, identity, verb, "gatewayclasses", group=GW_GROUP, name=other)


def forbidden(audit: AuditLog, since: int, identity: Identity) -> list[str]:
    """'verb uri' of each request of `identity` the API server answered 403."""
    return [
        f"{e['verb']} {e.get('requestURI')}"
        for e in audit.events(since, user=identity.user)
        if (e.get("responseStatus") or {}).get("code") == 403
    ]


def test_no_request_was_forbidden(operator: Running, identity: Identity, audit: AuditLog) -> None:
    # Last in the module: everything above ran under this identity.
    assert len(audit.events(operator.since, user=identity.user)) > 50
    refused = forbidden(audit, operator.since, identity)
    assert refused == [], refused
