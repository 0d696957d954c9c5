"""Behaviour the documents promise and no other test exercised (issue 15, point 9).

Status reasons ApplyFailed, IstiodNotFound, IstiodTrustMissing, RenderWarning
and NoAgents; the GatewayClassNotApplied and ClassDefaultsUnreadable Events;
ambient_operator_webhook_reviews_total; a Gateway that stops being Accepted
keeping its objects; a class that stops being ours taking them away; no
AmbientMesh, no waypoint writes; someone else's ServiceAccount left alone.
Each expectation is quoted from docs/troubleshooting.md or docs/waypoints.md.

The module runs its own control plane with two nodes of its own, a Linux and
a WS2022 one, so that no unsupported node of the shared sample inventory
names the Degraded reason first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from ambient_devcluster import (
    LocalCluster,
    apply_dirs,
    create_nodes,
    install_istiod_objects,
)
from ambient_devcluster.harness import (
    condition,
    create_mesh,
    delete_mesh,
    get_mesh,
    set_mesh_spec,
)
from ambient_operator.api import constants as c
from conftest import BIN_DIR, REPO_ROOT, binaries_present, ignoring, unique_name, wait_for
from operator_harness import AuditLog, RunningOperator, free_port, webhook_args

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
AGENTS_NS = "istio-system"
MESH_LISTENER = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
TIMEOUT = 90.0
WINDOWS_TAINT = {"key": "os", "value": "windows", "effect": "NoSchedule"}
NODES = [
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "linux-1",
            "labels": {c.LABEL_OS: "linux", c.LABEL_ARCH: "amd64", c.LABEL_HOSTNAME: "linux-1"},
        },
        "status": {"nodeInfo": {"operatingSystem": "linux", "kernelVersion": "6.8.0"}},
    },
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "win2022-1",
            "labels": {
                c.LABEL_OS: "windows",
                c.LABEL_ARCH: "amd64",
                c.LABEL_HOSTNAME: "win2022-1",
                c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022,
            },
        },
        "spec": {"taints": [WINDOWS_TAINT]},
        "status": {"nodeInfo": {"operatingSystem": "windows", "kernelVersion": "10.0.20348.1"}},
    },
]
# Windows images named, and the registry of the redirection-wait image, so nothing
# but what a test changes degrades the mesh.
BASE_SPEC: dict[str, Any] = {
    "images": {
        "registry": "registry.example.com/ambient",
        "ztunnel": {"windows": "registry.example.com/istio/ztunnel-windows:1.31.0"},
        "istioCni": {"windows": "registry.example.com/istio/install-cni-windows:1.31.0"},
    }
}
TRUST_BOTH = f"{AGENTS_NS}/ztunnel,{AGENTS_NS}/ztunnel-windows"


def _istiod(api: client.ApiClient, trusted: str) -> None:
    install_istiod_objects(
        api, BIN_DIR, AGENTS_NS, values={"env.CA_TRUSTED_NODE_ACCOUNTS": trusted}
    )


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of this module's own: CRDs, two nodes, istiod's objects."""
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}; run hack/build-binaries.sh")
    gateway_api = REPO_ROOT / ".cache" / "gateway-api" / "v1.6"
    with LocalCluster(tmp_path_factory.mktemp("documented"), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [REPO_ROOT / "crds", gateway_api], timeout=60)
            create_nodes(api, copy.deepcopy(NODES), timeout=60)
            _istiod(api, TRUST_BOTH)
        yield local


@pytest.fixture(scope="module")
def api(own: LocalCluster) -> Iterator[client.ApiClient]:
    with own.api_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def audit(own: LocalCluster) -> AuditLog:
    return AuditLog(own.audit_log)


@pytest.fixture(scope="module")
def webhook_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def operator(
    own: LocalCluster, api: client.ApiClient, webhook_port: int, tmp_path_factory: Any
) -> Iterator[RunningOperator]:
    """One operator for the module, serving the webhook on a loopback port."""
    create_mesh(api, copy.deepcopy(BASE_SPEC))
    op = RunningOperator(
        own,
        tmp_path_factory.mktemp("documented-operator"),
        extra_args=["--resync-seconds", "2", *webhook_args(webhook_port, AGENTS_NS)],
    )
    with op.running():
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _set_spec(api: client.ApiClient, spec: dict[str, Any]) -> int:
    """Replace the spec; the new generation."""
    return int(set_mesh_spec(api, spec)["metadata"]["generation"])


def _wait_condition(
    api: client.ApiClient, kind: str, status: str, reason: str, generation: int
) -> dict[str, Any]:
    """The condition once it has this status and reason for the generation."""
    last: dict[str, Any] = {}

    def there() -> dict[str, Any] | None:
        nonlocal last
        last = condition(get_mesh(api), kind)
        ok = last.get("observedGeneration") == generation and last.get("status") == status
        return last if ok and last.get("reason") == reason else None

    try:
        return wait_for(there, TIMEOUT, f"{kind}={status} ({reason})")
    except TimeoutError as exc:
        raise AssertionError(f"{kind} is {last}, not {status}/{reason}") from exc


def _mesh_events(api: client.ApiClient) -> set[str]:
    events = client.CoreV1Api(api).list_namespaced_event(
        "default", field_selector="involvedObject.kind=AmbientMesh"
    )
    return {e.reason for e in events.items}


@pytest.fixture
def base(api: client.ApiClient, operator: RunningOperator) -> Iterator[None]:
    """Each test starts from the base spec, reconciled, and leaves it so."""
    generation = _set_spec(api, copy.deepcopy(BASE_SPEC))
    _wait_condition(api, "Reconciled", "True", "Reconciled", generation)
    yield
    generation = _set_spec(api, copy.deepcopy(BASE_SPEC))
    _wait_condition(api, "Reconciled", "True", "Reconciled", generation)


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    spec.update(changes)
    return spec


def _daemonset_uids(api: client.ApiClient, namespace: str) -> dict[str, str]:
    items = client.AppsV1Api(api).list_namespaced_daemon_set(namespace).items
    return {ds.metadata.name: ds.metadata.uid for ds in items}


# -- AmbientMesh status reasons ------------------------------------------------------------------


def test_degraded_is_as_expected_on_the_base_spec(api: client.ApiClient, base: None) -> None:
    # The other reasons below are each the only thing wrong: here nothing is.
    generation = int(get_mesh(api)["metadata"]["generation"])
    _wait_condition(api, "Degraded", "False", "AsExpected", generation)
    _wait_condition(api, "Ready", "True", "AgentsReady", generation)


def test_apply_failed_names_the_refusal_and_prunes_nothing(
    api: client.ApiClient, base: None
) -> None:
    # "ApplyFailed: The API server refused one or more objects; the message lists them
    # with its answer. Usually RBAC (forbidden), an admission policy, or a quota.
    # Nothing is pruned in that pass."
    core = client.CoreV1Api(api)
    before = _daemonset_uids(api, AGENTS_NS)
    assert set(before) >= {"ztunnel", "istio-cni-node"}
    quota_ns = unique_name("quota")
    core.create_namespace({"metadata": {"name": quota_ns}})
    core.create_namespaced_resource_quota(
        quota_ns,
        {"metadata": {"name": "no-daemonsets"}, "spec": {"hard": {"count/daemonsets.apps": "0"}}},
    )
    wait_for(
        lambda: core.read_namespaced_resource_quota("no-daemonsets", quota_ns).status.hard,
        30,
        "the quota in force",
    )
    try:
        generation = _set_spec(api, _spec(namespace=quota_ns))
        reconciled = _wait_condition(api, "Reconciled", "False", "ApplyFailed", generation)
        assert "DaemonSet" in reconciled["message"], reconciled
        assert "exceeded quota" in reconciled["message"], reconciled
        assert _daemonset_uids(api, AGENTS_NS) == before
        assert _daemonset_uids(api, quota_ns) == {}
        wait_for(lambda: "ApplyFailed" in _mesh_events(api), 30, "an ApplyFailed Event")
    finally:
        _set_spec(api, copy.deepcopy(BASE_SPEC))
        with ignoring(404):
            core.delete_namespace(quota_ns)


def test_istiod_not_found(api: client.ApiClient, base: None) -> None:
    # "IstiodNotFound: The istiod Service (spec.istiod.serviceName, ...) does not exist,
    # and no spec.istiod.address is set."
    generation = _set_spec(api, _spec(istiod={"serviceName": "istiod-missing"}))
    degraded = _wait_condition(api, "Degraded", "True", "IstiodNotFound", generation)
    assert f"{AGENTS_NS}/istiod-missing" in degraded["message"], degraded
    wait_for(lambda: "IstiodNotFound" in _mesh_events(api), 30, "an IstiodNotFound Event")
    # An address instead of the Service: nothing to find.
    generation = _set_spec(
        api, _spec(istiod={"serviceName": "istiod-missing", "address": "10.0.0.7:15012"})
    )
    _wait_condition(api, "Degraded", "False", "AsExpected", generation)


def test_istiod_trust_missing(api: client.ApiClient, base: None) -> None:
    # "IstiodTrustMissing: istiod's CA_TRUSTED_NODE_ACCOUNTS does not list every ztunnel
    # ServiceAccount (e.g. istio-system/ztunnel-windows)"; the message names the value.
    generation = int(get_mesh(api)["metadata"]["generation"])
    _istiod(api, f"{AGENTS_NS}/ztunnel")
    try:
        degraded = _wait_condition(api, "Degraded", "True", "IstiodTrustMissing", generation)
        assert f"{AGENTS_NS}/ztunnel-windows" in degraded["message"], degraded
        assert "env.CA_TRUSTED_NODE_ACCOUNTS" in degraded["message"], degraded
    finally:
        _istiod(api, TRUST_BOTH)
    _wait_condition(api, "Degraded", "False", "AsExpected", generation)


def test_render_warning_names_the_unset_windows_image(api: client.ApiClient, base: None) -> None:
    # "RenderWarning: ... spec.images.ztunnel.windows / spec.images.istioCni.windows is
    # unset, so Windows agents get an image name Istio does not publish."
    generation = _set_spec(api, {})
    degraded = _wait_condition(api, "Degraded", "True", "RenderWarning", generation)
    assert "spec.images.ztunnel.windows" in degraded["message"], degraded
    assert "spec.images.istioCni.windows" in degraded["message"], degraded
    wait_for(lambda: "RenderWarning" in _mesh_events(api), 30, "a RenderWarning Event")


def test_no_agents_when_every_platform_is_disabled(api: client.ApiClient, base: None) -> None:
    # "NoAgents: No node gets an agent: no supported node, or every platform disabled."
    off = {"linux": {"enabled": False}, "windows": {"enabled": False}}
    generation = _set_spec(api, _spec(platforms=off))
    _wait_condition(api, "Ready", "False", "NoAgents", generation)


def test_no_agents_when_no_node_gets_an_agent(api: client.ApiClient, base: None) -> None:
    # The same row, the other way there: the platforms are on, and no node is served.
    nowhere = {
        "linux": {"nodeSelector": {"ambient-test/pool": "nobody"}},
        "windows": {"enabled": False},
    }
    generation = _set_spec(api, _spec(platforms=nowhere))
    _wait_condition(api, "Ready", "False", "NoAgents", generation)


# -- Events -----------------------------------------------------------------------------------


def test_gateway_class_not_applied(api: client.ApiClient, base: None) -> None:
    # "GatewayClassNotApplied (on the AmbientMesh): The operator could not create or update
    # its GatewayClass (message has the API server's answer ...)". A class's
    # controllerName is immutable, so renaming the controller cannot be applied.
    generation = _set_spec(
        api, _spec(waypoints={"controllerName": "ambientoperator.io/renamed-controller"})
    )
    _wait_condition(api, "Reconciled", "True", "Reconciled", generation)
    found = wait_for(
        lambda: (
            client.CoreV1Api(api)
            .list_namespaced_event(
                "default",
                field_selector="involvedObject.kind=AmbientMesh,reason=GatewayClassNotApplied",
            )
            .items
        ),
        TIMEOUT,
        "a GatewayClassNotApplied Event",
    )
    assert found[0].type == "Warning"
    assert "immutable" in found[0].message, found[0].message


def test_class_defaults_unreadable(api: client.ApiClient, base: None) -> None:
    # "An overlay that is not a YAML mapping ... is left alone, and the ConfigMap gets a
    # ClassDefaultsUnreadable Warning Event." The operator's own defaults ConfigMap
    # (there is a Windows node) with a list for an overlay:
    core = client.CoreV1Api(api)
    name = "ambient-operator-istio-waypoint-defaults"
    wait_for(lambda: core.read_namespaced_config_map(name, AGENTS_NS), TIMEOUT, f"{name}")
    overlay = "- not\n- a mapping\n"
    core.patch_namespaced_config_map(name, AGENTS_NS, {"data": {"deployment": overlay}})
    try:
        (event,) = wait_for(
            lambda: (
                core.list_namespaced_event(
                    AGENTS_NS,
                    field_selector=f"involvedObject.name={name},reason=ClassDefaultsUnreadable",
                ).items
            ),
            TIMEOUT,
            "a ClassDefaultsUnreadable Event",
        )
        assert event.type == "Warning" and event.involved_object.kind == "ConfigMap"
        assert core.read_namespaced_config_map(name, AGENTS_NS).data["deployment"] == overlay
    finally:
        core.patch_namespaced_config_map(name, AGENTS_NS, {"data": {"deployment": ""}})


# -- metrics -----------------------------------------------------------------------------------


def test_webhook_reviews_are_counted_by_action_and_reason(
    api: client.ApiClient, base: None, operator: RunningOperator
) -> None:
    # "Every admission review is counted in ambient_operator_webhook_reviews_total{action,
    # reason}".
    core = client.CoreV1Api(api)
    ns = unique_name("reviews")
    core.create_namespace({"metadata": {"name": ns, "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, "its ServiceAccount")

    def pod(name: str, selector: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": selector,
                "tolerations": [{"key": "os", "operator": "Exists"}],
                "containers": [{"name": "app", "image": "example.com/app:1"}],
            },
        }

    pinned = {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022}
    inject = {"action": "inject", "reason": "PinnedToPreWS2025Build"}
    skip = {"action": "none", "reason": "NotWindows"}
    metric = "ambient_operator_webhook_reviews_total"

    def mutated() -> bool:
        out = core.create_namespaced_pod(ns, pod("probe", pinned), dry_run="All")
        return any(ct.name == "ambient-redirection-wait" for ct in out.spec.init_containers or [])

    try:
        wait_for(mutated, TIMEOUT, "the webhook to mutate")
        before = {k: operator.metric(metric, **v) for k, v in (("inject", inject), ("skip", skip))}
        core.create_namespaced_pod(ns, pod("windows", pinned))
        for i in range(2):
            core.create_namespaced_pod(ns, pod(f"linux-{i}", {c.LABEL_OS: "linux"}))
        assert operator.metric(metric, **inject) == before["inject"] + 1
        assert operator.metric(metric, **skip) == before["skip"] + 2
    finally:
        with ignoring(404):
            core.delete_namespace(ns)


# -- waypoints ---------------------------------------------------------------------------------


def _gateway(
    api: client.ApiClient,
    namespace: str,
    name: str,
    class_name: str = "ambient-waypoint",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {"gatewayClassName": class_name, "listeners": [MESH_LISTENER]},
    }
    made: dict[str, Any] = _custom(api).create_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", body
    )
    return made


def _get_gateway(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = _custom(api).get_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", name
    )
    return obj


def _gateway_condition(
    api: client.ApiClient, namespace: str, name: str, kind: str, status: str, reason: str
) -> dict[str, Any] | None:
    gw = _get_gateway(api, namespace, name)
    cond = condition(gw, kind)
    current = cond.get("observedGeneration") == gw["metadata"]["generation"]
    return gw if current and (cond.get("status"), cond.get("reason")) == (status, reason) else None


def _waypoint_objects(api: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    """Kind -> UID of the Gateway's ServiceAccount, Deployment and Service."""
    selector = f"{c.LABEL_GATEWAY_NAME}={name}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    out = {}
    for kind, items in (
        (
            "ServiceAccount",
            core.list_namespaced_service_account(namespace, label_selector=selector),
        ),
        ("Deployment", apps.list_namespaced_deployment(namespace, label_selector=selector)),
        ("Service", core.list_namespaced_service(namespace, label_selector=selector)),
    ):
        for item in items.items:
            out[kind] = item.metadata.uid
    return out


@pytest.fixture
def ns(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = unique_name("wp")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with ignoring(404):
        core.delete_namespace(name)


def test_a_gateway_no_longer_accepted_keeps_its_objects(
    api: client.ApiClient, base: None, ns: str, audit: AuditLog
) -> None:
    # "A Gateway that is not Accepted gets no new objects; objects it already has are
    # left as they are, so a bad edit does not take a working waypoint down."
    _gateway(api, ns, "waypoint")
    wait_for(
        lambda: _gateway_condition(api, ns, "waypoint", "Programmed", "True", "Programmed"),
        TIMEOUT,
        "Programmed",
    )
    objects = _waypoint_objects(api, ns, "waypoint")
    assert set(objects) == {"ServiceAccount", "Deployment", "Service"}
    mark = audit.mark()
    http = [{"name": "http", "port": 80, "protocol": "HTTP"}]
    _custom(api).patch_namespaced_custom_object(
        GW_GROUP, GW_VERSION, ns, "gateways", "waypoint", {"spec": {"listeners": http}}
    )
    wait_for(
        lambda: _gateway_condition(api, ns, "waypoint", "Accepted", "False", "ListenersNotValid"),
        TIMEOUT,
        "Accepted=False (ListenersNotValid)",
    )
    assert _waypoint_objects(api, ns, "waypoint") == objects
    touched = [
        w
        for w in audit.writes(mark)
        if f"/namespaces/{ns}/" in w and "/gateways/" not in w and "/events" not in w
    ]
    assert touched == []


def test_objects_go_when_the_class_stops_being_ours(
    api: client.ApiClient, base: None, ns: str
) -> None:
    # "A Gateway whose class stops being ours (or disappears) has its own objects
    # deleted ...; its last status stays." Every class naming our controller is ours.
    custom = _custom(api)
    klass = unique_name("second-class")
    custom.create_cluster_custom_object(
        GW_GROUP,
        GW_VERSION,
        "gatewayclasses",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": klass},
            "spec": {"controllerName": "ambientoperator.io/waypoint-controller"},
        },
    )
    try:
        _gateway(api, ns, "waypoint", class_name=klass)
        gw = wait_for(
            lambda: _gateway_condition(api, ns, "waypoint", "Programmed", "True", "Programmed"),
            TIMEOUT,
            "Programmed under the second class",
        )
        assert len(_waypoint_objects(api, ns, "waypoint")) == 3
    finally:
        with ignoring(404):
            custom.delete_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses", klass)
    wait_for(lambda: _waypoint_objects(api, ns, "waypoint") == {}, TIMEOUT, "its objects deleted")
    after = _get_gateway(api, ns, "waypoint")
    assert after["status"]["conditions"] == gw["status"]["conditions"]
    assert after["status"].get("addresses") == gw["status"].get("addresses")


def test_without_an_ambientmesh_the_waypoint_controller_writes_nothing(
    api: client.ApiClient, operator: RunningOperator, audit: AuditLog, ns: str
) -> None:
    # "Without an AmbientMesh named default ... the waypoint controller does nothing: it
    # writes nothing and posts no Event."
    custom = _custom(api)
    klass = unique_name("user-class")
    custom.create_cluster_custom_object(
        GW_GROUP,
        GW_VERSION,
        "gatewayclasses",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "GatewayClass",
            "metadata": {"name": klass},
            "spec": {"controllerName": "ambientoperator.io/waypoint-controller"},
        },
    )
    operator.stop()
    delete_mesh(api)
    _gateway(api, ns, "waypoint", class_name=klass)
    mark = audit.mark()
    log_before = len(operator.log_text())
    operator.start()
    try:
        # Both loops start once every cache is primed (the Gateway in it); then two
        # passes of the operator's loop, each of which calls the waypoint
        # controller, and its own loop, woken by priming.
        def passes() -> int:
            return operator.log_text()[log_before:].count("reconcile pass:")

        wait_for(lambda: passes() >= 2, TIMEOUT, "two passes after priming")
        waypoint_writes = [
            w
            for w in audit.writes(mark)
            if any(part in w for part in (f"/namespaces/{ns}/", "/gatewayclasses", "/events"))
        ]
        assert waypoint_writes == []
        assert not _get_gateway(api, ns, "waypoint").get("status", {}).get("addresses")
    finally:
        create_mesh(api, copy.deepcopy(BASE_SPEC))
    # With the AmbientMesh back the same Gateway is deployed: the check above had work to skip.
    wait_for(
        lambda: _gateway_condition(api, ns, "waypoint", "Programmed", "True", "Programmed"),
        TIMEOUT,
        "Programmed once the AmbientMesh is back",
    )
    with ignoring(404):
        custom.delete_cluster_custom_object(GW_GROUP, GW_VERSION, "gatewayclasses", klass)


def test_someone_elses_service_account_is_never_written(
    api: client.ApiClient, base: None, ns: str, audit: AuditLog
) -> None:
    # docs/waypoints.md: an existing ServiceAccount that is not the Gateway's own "is then
    # used as it is, never written", if spec.waypoints.policy.serviceAccountLabels allows
    # it (default: labelled ambientoperator.io/waypoint-service-account=true); one the
    # policy does not allow makes the Gateway Accepted=False, reason InvalidParameters.
    core = client.CoreV1Api(api)
    allowed = {"ambientoperator.io/waypoint-service-account": "true"}
    core.create_namespaced_service_account(
        ns, {"metadata": {"name": "blessed", "labels": {"team": "mesh", **allowed}}}
    )
    core.create_namespaced_service_account(ns, {"metadata": {"name": "plain"}})
    before = {
        name: core.read_namespaced_service_account(name, ns).metadata.resource_version
        for name in ("blessed", "plain")
    }
    mark = audit.mark()
    annotation = c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT
    _gateway(api, ns, "uses-blessed", annotations={annotation: "blessed"})
    _gateway(api, ns, "uses-plain", annotations={annotation: "plain"})
    wait_for(
        lambda: _gateway_condition(api, ns, "uses-blessed", "Programmed", "True", "Programmed"),
        TIMEOUT,
        "the Gateway with the allowed account Programmed",
    )
    refused = wait_for(
        lambda: _gateway_condition(api, ns, "uses-plain", "Accepted", "False", "InvalidParameters"),
        TIMEOUT,
        "the Gateway with another account refused",
    )
    assert "serviceAccountLabels" in condition(refused, "Accepted")["message"]
    deployment = client.AppsV1Api(api).read_namespaced_deployment("uses-blessed", ns)
    assert deployment.spec.template.spec.service_account_name == "blessed"
    assert _waypoint_objects(api, ns, "uses-plain") == {}
    for name, version in before.items():
        account = core.read_namespaced_service_account(name, ns)
        assert account.metadata.resource_version == version, name
        assert not account.metadata.owner_references, name
    written = [
        (e["verb"], e["objectRef"].get("name"))
        for e in audit.events(mark)
        if e.get("verb") in ("create", "update", "patch", "delete")
        and (e.get("objectRef") or {}).get("resource") == "serviceaccounts"
        and (e.get("objectRef") or {}).get("name") in before
    ]
    assert written == []
