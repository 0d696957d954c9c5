"""istiod itself judges what the operator writes.

This module runs a control plane of its own with Istio installed the way a
user installs it: upstream's ``base`` and ``istiod`` charts through the real
``helm`` with ``profile=ambient``, and ``pilot-discovery`` from the pinned
``istio.io/istio`` module running against the API server with that
Deployment's arguments and environment (see ``devcluster/istio.py``). The
operator runs beside it. Every expectation here is read from istiod's own
debug endpoints (``/debug/ambientz``) or from objects istiod itself wrote,
never from the operator's render.

No istio-cni runs under kwok, so where istio-cni would mark a pod redirected
(``ambient.istio.io/redirection: enabled`` through ``pods/status``) the test
does that write itself, as istio-cni's ServiceAccount would.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import (
    IstioControlPlane,
    LocalCluster,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
    create_nodes,
)
from ambient_operator.api import constants as c
from conftest import BIN_DIR, SAMPLE_NODES, binaries_present, unique_name, wait_for
from operator_harness import RunningOperator
from upstream_diff import check_table, compare, generator, key_lists, matches, pod_view, pruned

ROOT = Path(__file__).resolve().parents[1]
GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
ISTIO_NS = "istio-system"
MESH_LISTENER = {"name": "mesh", "port": 15008, "protocol": "HBONE"}
TIMEOUT = 90.0


@pytest.fixture(scope="module")
def istio_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Our own control plane: the sample nodes, our CRDs, Gateway API v1.6."""
    if not binaries_present() or not (BIN_DIR / "pilot-discovery").exists():
        pytest.fail(
            f"binaries missing in {BIN_DIR} (pilot-discovery too); run hack/build-binaries.sh"
        )
    gateway_api = ROOT / ".cache" / "gateway-api" / "v1.6"
    with LocalCluster(tmp_path_factory.mktemp("istiod-cluster"), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [ROOT / "crds", gateway_api], timeout=60)
            create_nodes(api, SAMPLE_NODES, timeout=60)
            apply_objects(api, [cluster_dns_service()])
        yield local


@pytest.fixture(scope="module")
def istio(
    istio_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IstioControlPlane]:
    """Istio from its charts, istiod running."""
    plane = IstioControlPlane(istio_cluster.kubeconfig, tmp_path_factory.mktemp("istiod"), BIN_DIR)
    with plane:
        yield plane
    assert "panic:" not in plane.log_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def api(istio_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin client of the module's cluster."""
    with istio_cluster.api_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def operator(
    istio_cluster: LocalCluster,
    istio: IstioControlPlane,
    api: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator beside istiod, with the sample AmbientMesh."""
    op = RunningOperator(istio_cluster, tmp_path_factory.mktemp("istiod-operator"))
    with op.running():
        sample = ROOT / "operator" / "ambient_operator" / "samples" / "ambientmesh.yaml"
        apply_objects(api, [yaml.safe_load(sample.read_text())])
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


# -- helpers --------------------------------------------------------------------------------


def _b64_ip(value: Any) -> str | None:
    """ambientz writes each IP as the base64 of its text form (see istiod's debug.go)."""
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return value


def ambient_services(istio: IstioControlPlane) -> dict[tuple[str, str], dict[str, Any]]:
    """istiod's ambient Services by (namespace, name)."""
    view = istio.debug("/debug/ambientz")
    return {(s["namespace"], s["name"]): s for s in view.get("services") or []}


def ambient_workloads(istio: IstioControlPlane) -> dict[tuple[str, str], dict[str, Any]]:
    """istiod's ambient workloads (pods) by (namespace, name)."""
    view = istio.debug("/debug/ambientz")
    return {(w["namespace"], w["name"]): w for w in view.get("workloads") or []}


def waypoint_ip(entry: dict[str, Any]) -> str | None:
    """The IP of the waypoint istiod assigned to a Service or workload, if any."""
    waypoint = entry.get("waypoint") or {}
    address = (waypoint.get("address") or {}).get("address")
    return _b64_ip(address)


def make_namespace(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    """A namespace with labels, and its default ServiceAccount."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_for(lambda: core.read_namespaced_service_account("default", name), 30, "default SA")


def create_gateway(
    api: client.ApiClient,
    namespace: str,
    name: str,
    class_name: str,
    parameters: str | None = None,
    *,
    labels: dict[str, str] | None = None,
    infra_labels: dict[str, str] | None = None,
) -> None:
    """A waypoint Gateway with the one HBONE listener, and optionally a parametersRef
    ConfigMap, labels of its own and spec.infrastructure.labels."""
    spec: dict[str, Any] = {"gatewayClassName": class_name, "listeners": [MESH_LISTENER]}
    infrastructure: dict[str, Any] = {}
    if parameters:
        infrastructure["parametersRef"] = {"group": "", "kind": "ConfigMap", "name": parameters}
    if infra_labels is not None:
        infrastructure["labels"] = infra_labels
    if infrastructure:
        spec["infrastructure"] = infrastructure
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GW_GROUP,
        GW_VERSION,
        namespace,
        "gateways",
        {
            "apiVersion": f"{GW_GROUP}/{GW_VERSION}",
            "kind": "Gateway",
            "metadata": metadata,
            "spec": spec,
        },
    )


def gateway(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """A Gateway as a dict."""
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GW_GROUP, GW_VERSION, namespace, "gateways", name
    )
    return obj


def programmed_address(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """The Gateway's first IP address once Programmed=True."""
    obj = gateway(api, namespace, name)
    status = obj.get("status") or {}
    programmed = any(
        cond["type"] == "Programmed" and cond["status"] == "True"
        for cond in status.get("conditions") or []
    )
    ips = [a["value"] for a in status.get("addresses") or [] if a.get("type") == "IPAddress"]
    return ips[0] if programmed and ips else None


def app(
    namespace: str, name: str, node: str, labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """A pod pinned to a node (any OS), and a Service selecting it."""
    tolerations = [{"operator": "Exists"}]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app": name, **(labels or {})},
            },
            "spec": {
                "nodeName": node,
                "tolerations": tolerations,
                "containers": [{"name": "app", "image": "registry.example/app:1"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
        },
    ]


def redirect(api: client.ApiClient, namespace: str, name: str) -> None:
    """What istio-cni writes once a pod's traffic is redirected (there is no CNI under kwok)."""
    client.CoreV1Api(api).patch_namespaced_pod_status(
        name, namespace, {"metadata": {"annotations": {c.ANNOTATION_REDIRECTION: "enabled"}}}
    )


def node_os(api: client.ApiClient) -> dict[str, str]:
    """Each node's kubernetes.io/os label."""
    return {
        n.metadata.name: (n.metadata.labels or {}).get(c.LABEL_OS, "")
        for n in client.CoreV1Api(api).list_node().items
    }


# -- istiod is real ---------------------------------------------------------------------------


def test_istiods_webhooks_answer_the_api_server(
    api: client.ApiClient, istio: IstioControlPlane
) -> None:
    """The charts' webhooks reach this istiod: it rejects bad config and injects sidecars."""
    ns = unique_name("istiod-hooks")
    make_namespace(api, ns, {"istio-injection": "enabled"})
    bad = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "bad", "namespace": ns},
        "spec": {"rules": [{"to": [{"operation": {"methods": [""]}}]}]},
    }
    custom = client.CustomObjectsApi(api)

    def rejection() -> str | None:
        # istiod serves validation a moment after it reports ready; until then
        # the API server may admit the object, so take it back and ask again.
        try:
            custom.create_namespaced_custom_object(
                "security.istio.io", "v1", ns, "authorizationpolicies", bad
            )
        except client.ApiException as exc:
            return f"{exc.status} {json.loads(exc.body)['message']}"
        custom.delete_namespaced_custom_object(
            "security.istio.io", "v1", ns, "authorizationpolicies", "bad"
        )
        return None

    answer = wait_for(rejection, TIMEOUT, "istiod's validation webhook to reject bad config")
    assert answer.startswith("400 "), answer
    assert 'admission webhook "validation.istio.io" denied the request' in answer, answer
    core = client.CoreV1Api(api)

    def injected() -> list[str] | None:
        # The injector, too, may answer a moment after istiod reports ready.
        pod = core.create_namespaced_pod(
            ns, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "x"}]}}
        )
        # Istio injects its proxy as a native sidecar (an init container that keeps running).
        names = [ct.name for ct in [*(pod.spec.init_containers or []), *pod.spec.containers]]
        if "istio-proxy" in names:
            return names
        core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(ns).items, TIMEOUT, "uninjected pod gone")
        return None

    names = wait_for(injected, TIMEOUT, "istiod's injector to add its sidecar")
    assert names[-1] == "app" and "istio-proxy" in names, names


# -- waypoints ------------------------------------------------------------------------------


def test_our_waypoint_is_istiods_waypoint_and_never_its_own(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """A namespace's use-waypoint binds its Services to our waypoint, not the waypoint's own."""
    ns = unique_name("wp-bind")
    make_namespace(api, ns, {c.LABEL_DATAPLANE_MODE: "ambient", c.LABEL_USE_WAYPOINT: "wp"})
    apply_objects(api, app(ns, "web", "linux-amd64-1"))
    create_gateway(api, ns, "wp", "ambient-waypoint")
    address = wait_for(lambda: programmed_address(api, ns, "wp"), TIMEOUT, "wp Programmed")
    host = f"wp.{ns}.svc.cluster.local"

    def bound() -> dict[tuple[str, str], dict[str, Any]] | None:
        services = ambient_services(istio)
        web = services.get((ns, "web"))
        if web is None or (web.get("waypoint") or {}).get("hostname", {}).get("hostname") != host:
            return None
        return services

    services = wait_for(bound, TIMEOUT, f"istiod binding {ns}/web to its waypoint")
    own = services[(ns, "wp")]
    assert [_b64_ip(a.get("address")) for a in own["addresses"]] == [address]
    assert "waypoint" not in own, f"the waypoint's own Service names a waypoint: {own}"
    # Its pods are the waypoint, not workloads that could use one.
    pods = [w for (wns, _), w in ambient_workloads(istio).items() if wns == ns]
    waypoint_pods = [w for w in pods if w.get("workloadName") == "wp"]
    assert waypoint_pods and all("waypoint" not in w for w in waypoint_pods), pods


def _view(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """An object read from the API as a comparable view, minus what the API server
    or controllers assign; its namespace's name is written `<namespace>`."""
    out: dict[str, Any] = json.loads(json.dumps(obj).replace(namespace, "<namespace>"))
    meta = out["metadata"]
    for key in (
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
        "ownerReferences",
        "namespace",
    ):
        meta.pop(key, None)
    (meta.get("annotations") or {}).pop("deployment.kubernetes.io/revision", None)
    out.pop("status", None)
    spec = out.get("spec") or {}
    for allocated in ("clusterIP", "clusterIPs"):
        spec.pop(allocated, None)
    view = pruned(out)
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    if obj["kind"] == "Deployment":
        template = dict(view["spec"]["template"])
        template["spec"] = pod_view(template["spec"], name)
        view = {**view, "spec": {**view["spec"], "template": template}}
    result: dict[str, Any] = key_lists(view, name)
    return result


# One parameters ConfigMap, given to istiod's waypoint and to ours: the keys
# both read, as istiod's deployment controller reads them (object overlays).
SCALING_PARAMETERS = {
    "horizontalPodAutoscaler": (
        "spec:\n"
        "  minReplicas: 2\n"
        "  maxReplicas: 4\n"
        "  metrics:\n"
        "  - type: Resource\n"
        "    resource: {name: cpu, target: {type: Utilization, averageUtilization: 75}}\n"
        "  behavior:\n"
        "    scaleDown: {stabilizationWindowSeconds: 120}\n"
    ),
    "podDisruptionBudget": "spec:\n  minAvailable: 1\n  unhealthyPodEvictionPolicy: AlwaysAllow\n",
}


def waypoint_pair(
    api: client.ApiClient,
    prefix: str,
    *,
    labels: dict[str, str] | None = None,
    infra_labels: dict[str, str] | None = None,
) -> tuple[str, str]:
    """(ours, istiod's) namespaces, each with a Gateway `waypoint` of its class naming the
    same parameters, alike but for the class; once both are Programmed and scaled."""
    ours_ns, istio_ns = unique_name(f"{prefix}-ours"), unique_name(f"{prefix}-istiod")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    for ns, cls in ((ours_ns, "ambient-waypoint"), (istio_ns, c.ISTIO_WAYPOINT_CLASS)):
        make_namespace(api, ns, {})
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": "waypoint-params"}, "data": SCALING_PARAMETERS}
        )
        create_gateway(
            api,
            ns,
            "waypoint",
            cls,
            parameters="waypoint-params",
            labels=labels,
            infra_labels=infra_labels,
        )
    for ns in (ours_ns, istio_ns):
        wait_for(lambda ns=ns: programmed_address(api, ns, "waypoint"), TIMEOUT, f"{ns} Programmed")
        wait_for(
            lambda ns=ns: apps.read_namespaced_deployment("waypoint", ns).spec.replicas == 2,
            TIMEOUT,
            f"{ns}/waypoint scaled to the autoscaler's minReplicas",
        )
    return ours_ns, istio_ns


def waypoint_views(
    api: client.ApiClient, ours_ns: str, istio_ns: str
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(istiod's, ours): the comparable views of each side's five waypoint objects."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    autoscaling, policy = client.AutoscalingV2Api(api), client.PolicyV1Api(api)
    upstream: dict[str, dict[str, Any]] = {}
    ours: dict[str, dict[str, Any]] = {}
    for kind, read in (
        ("Deployment", apps.read_namespaced_deployment),
        ("Service", core.read_namespaced_service),
        ("ServiceAccount", core.read_namespaced_service_account),
        ("HorizontalPodAutoscaler", autoscaling.read_namespaced_horizontal_pod_autoscaler),
        ("PodDisruptionBudget", policy.read_namespaced_pod_disruption_budget),
    ):
        for side, ns in ((upstream, istio_ns), (ours, ours_ns)):
            obj = api.sanitize_for_serialization(read("waypoint", ns))
            side[f"{kind}/waypoint"] = _view({"kind": kind, **obj}, ns)
    return upstream, ours


def test_istio_waypoint_is_pinned_to_linux_and_matches_ours_field_by_field(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """istiod's own waypoint carries our Linux pin; its objects and ours differ only as listed.

    Both Gateways name a parameters ConfigMap with the same autoscaler and
    disruption budget, so those are compared too, and so is the Deployment's
    count, which on both sides is the autoscaler's (kube-controller-manager
    raises it to minReplicas without metrics).
    """
    ours_ns, istio_ns = waypoint_pair(api, "cmp")
    istio_dep = client.AppsV1Api(api).read_namespaced_deployment("waypoint", istio_ns)
    # Written by istiod, pinned by the class defaults the operator keeps for istio-waypoint.
    assert istio_dep.spec.template.spec.node_selector == {c.LABEL_OS: "linux"}
    check_table("waypoint", compare(*waypoint_views(api, ours_ns, istio_ns)))


# istiod's chart values for a cluster of a multi-cluster, multi-network mesh that pulls
# from a private registry, and the AmbientMesh fields that say the same.
CLUSTER_VALUES = {
    "global.multiCluster.clusterName": "west-1",
    "global.network": "net-west",
    "global.imagePullSecrets[0]": "reg-a",
    "global.imagePullSecrets[1]": "reg-b",
    "global.imagePullPolicy": "Always",
    "global.caAddress": "ca.mesh.example:15012",
}
CLUSTER_SPEC: dict[str, Any] = {
    "multiCluster": {"clusterName": "west-1"},
    "network": "net-west",
    "images": {"pullSecrets": ["reg-a", "reg-b"], "pullPolicy": "Always"},
    "istiod": {"caAddress": "ca.mesh.example:15012"},
}
# istiod has no XDS address value for its waypoints: they take the mesh config's
# defaultConfig.discoveryAddress, inside PROXY_CONFIG, as ours does xdsAddress.
XDS = "xds.mesh.example:15012"
XDS_VALUES = {"meshConfig.defaultConfig.discoveryAddress": XDS}
XDS_SPEC: dict[str, Any] = {"istiod": {"xdsAddress": XDS}}
PROXY_CONFIG_FIELD = "spec.template.spec.containers[istio-proxy].env[PROXY_CONFIG].value"
NETWORK_LABEL = "topology.istio.io/network"


def _nulls(patch: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that removes every leaf `patch` sets."""
    return {k: _nulls(v) if isinstance(v, dict) else None for k, v in patch.items()}


def _patch_mesh(api: client.ApiClient, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME, {"spec": spec}
    )


@contextmanager
def istiod_and_mesh(
    api: client.ApiClient, istio: IstioControlPlane
) -> Iterator[Callable[[dict[str, str], dict[str, Any]], None]]:
    """A way to give istiod more chart values and the AmbientMesh the matching fields;
    both are put back afterwards.

    istiod is upgraded and restarted each time: it reads CLUSTER_ID when it starts.
    """
    before = dict(istio.values)
    patched: list[dict[str, Any]] = []

    def change(values: dict[str, str], spec: dict[str, Any]) -> None:
        istio.values.update(values)
        istio.install()
        istio.stop()
        istio.start()
        patched.append(spec)
        _patch_mesh(api, spec)

    try:
        yield change
    finally:
        for spec in reversed(patched):
            _patch_mesh(api, _nulls(spec))
        istio.values.clear()
        istio.values.update(before)
        istio.install()
        istio.stop()
        istio.start()


def _proxy_env(api: client.ApiClient, namespace: str) -> dict[str, str]:
    dep = client.AppsV1Api(api).read_namespaced_deployment("waypoint", namespace)
    return {e.name: e.value for e in dep.spec.template.spec.containers[0].env if e.value}


def _pod_network(api: client.ApiClient, namespace: str) -> str | None:
    """The network label of the waypoint pods in a namespace."""
    dep = client.AppsV1Api(api).read_namespaced_deployment("waypoint", namespace)
    return (dep.spec.template.metadata.labels or {}).get(NETWORK_LABEL)


def _matches_table(api: client.ApiClient, ours_ns: str, istio_ns: str) -> bool:
    check_table("waypoint", compare(*waypoint_views(api, ours_ns, istio_ns)))
    return True


def test_cluster_network_pulls_and_istiod_addresses_match_istiods_own_waypoint(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """With istiod's chart values and the AmbientMesh saying the same cluster, network,
    pull secrets, pull policy and CA and XDS addresses, the waypoints differ as listed.

    No row of the table names these fields, so every one of them is the same on
    both sides, as istiod renders it. The network label is compared for each
    way a Gateway can name one (its own label, its infrastructure labels, both
    or neither). Each pair waits until our side matches the table, ours being
    the side that may render a Gateway before it sees the new spec; istiod
    restarted with the values before any of these Gateways existed.
    """
    shapes: dict[str, dict[str, Any]] = {
        "mc": {},
        "mc-own": {"labels": {NETWORK_LABEL: "net-east"}},
        "mc-infra": {"infra_labels": {NETWORK_LABEL: "net-east", "team": "a"}},
        "mc-both": {"labels": {NETWORK_LABEL: "net-east"}, "infra_labels": {"team": "a"}},
    }
    with istiod_and_mesh(api, istio) as change:
        change(CLUSTER_VALUES, CLUSTER_SPEC)
        pairs = {name: waypoint_pair(api, name, **shape) for name, shape in shapes.items()}
        for name, (ours_ns, istio_ns) in pairs.items():
            wait_for(
                lambda o=ours_ns, i=istio_ns: _matches_table(api, o, i),
                TIMEOUT,
                f"{name}: our waypoint to match istiod's but for the table",
            )
        # istiod did render with the values (else agreeing would prove nothing).
        ours_ns, istio_ns = pairs["mc"]
        env = _proxy_env(api, istio_ns)
        assert (env["ISTIO_META_CLUSTER_ID"], env["ISTIO_META_NETWORK"]) == ("west-1", "net-west")
        assert env["CA_ADDR"] == "ca.mesh.example:15012"
        pod = client.AppsV1Api(api).read_namespaced_deployment("waypoint", istio_ns).spec.template
        assert [s.name for s in pod.spec.image_pull_secrets] == ["reg-a", "reg-b"]
        assert pod.spec.containers[0].image_pull_policy == "Always"
        labels = {name: _pod_network(api, pair[1]) for name, pair in pairs.items()}
        assert labels == {
            "mc": "net-west",
            "mc-own": "net-east",
            "mc-infra": "net-west",
            "mc-both": None,
        }, "istiod's network labels are not what tests/test_waypoint_units.py says"

        change(XDS_VALUES, XDS_SPEC)

        def discovery() -> list[str] | None:
            found = [
                json.loads(_proxy_env(api, ns)["PROXY_CONFIG"]).get("discoveryAddress")
                for ns in (istio_ns, ours_ns)
            ]
            return found if found == [XDS] * 2 else None

        wait_for(discovery, TIMEOUT, "both waypoints to take the XDS address")
        found = {(d.object, d.field): d for d in compare(*waypoint_views(api, ours_ns, istio_ns))}
        rows = {(e.object, e.field): e for e in generator().load_tables()["waypoint"]}
        assert found.keys() == rows.keys()
        wrong = [
            key
            for key, d in found.items()
            if key[1] != PROXY_CONFIG_FIELD
            and not (matches(rows[key].upstream, d.upstream) and matches(rows[key].ours, d.ours))
        ]
        assert wrong == []
        # PROXY_CONFIG still differs as its row says, but for the address both now name.
        key = ("Deployment/waypoint", PROXY_CONFIG_FIELD)
        now = [json.loads(found[key].upstream), json.loads(found[key].ours)]
        listed = [json.loads(str(rows[key].upstream)), json.loads(str(rows[key].ours))]
        assert [side.pop("discoveryAddress") for side in now] == [XDS] * 2
        assert now == [
            {k: v for k, v in side.items() if k != "discoveryAddress"} for side in listed
        ]


def test_a_removed_scaling_key_prunes_ours_and_istiod_keeps_its_own(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """The one deliberate difference in behaviour (docs/waypoints.md, "Scaling and disruption").

    istiod renders an autoscaler or budget only while a key asks for it and
    never deletes one; ours are pruned when the key goes.
    """
    ours_ns, istio_ns = unique_name("prune-ours"), unique_name("prune-istiod")
    autoscaling, policy = client.AutoscalingV2Api(api), client.PolicyV1Api(api)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    def present(ns: str) -> bool:
        names = [
            [
                o.metadata.name
                for o in autoscaling.list_namespaced_horizontal_pod_autoscaler(ns).items
            ],
            [o.metadata.name for o in policy.list_namespaced_pod_disruption_budget(ns).items],
        ]
        return names == [["waypoint"], ["waypoint"]]

    for ns, cls in ((ours_ns, "ambient-waypoint"), (istio_ns, c.ISTIO_WAYPOINT_CLASS)):
        make_namespace(api, ns, {})
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": "waypoint-params"}, "data": SCALING_PARAMETERS}
        )
        create_gateway(api, ns, "waypoint", cls, parameters="waypoint-params")
        wait_for(lambda ns=ns: present(ns), TIMEOUT, f"{ns}: an HPA and a PDB")
    core.replace_namespaced_config_map(
        "waypoint-params", ours_ns, {"metadata": {"name": "waypoint-params"}, "data": {}}
    )
    # istiod's ConfigMap loses the same keys and gains one that it shows it has
    # read: an annotation on the Deployment it renders from the same ConfigMap.
    core.replace_namespaced_config_map(
        "waypoint-params",
        istio_ns,
        {
            "metadata": {"name": "waypoint-params"},
            "data": {"deployment": "metadata:\n  annotations: {example.com/read: 'yes'}\n"},
        },
    )
    wait_for(
        lambda: (
            not autoscaling.list_namespaced_horizontal_pod_autoscaler(ours_ns).items
            and not policy.list_namespaced_pod_disruption_budget(ours_ns).items
        ),
        TIMEOUT,
        "ours pruned",
    )

    def reread() -> bool:
        annotations = apps.read_namespaced_deployment("waypoint", istio_ns).metadata.annotations
        return (annotations or {}).get("example.com/read") == "yes"

    wait_for(reread, TIMEOUT, "istiod rendering its waypoint from the changed ConfigMap")
    assert present(istio_ns), "istiod deleted its HPA or PDB; docs/waypoints.md says it keeps them"


# -- enrollment -----------------------------------------------------------------------------


def test_enrolled_pods_on_every_os_are_istiods_ambient_workloads(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """Pods we count as enrolled and redirected are HBONE workloads to istiod, per OS."""
    ns = unique_name("enrolled")
    make_namespace(api, ns, {c.LABEL_DATAPLANE_MODE: "ambient"})
    placed = {"on-linux": "linux-amd64-1", "on-ws2022": "win2022-1", "on-ws2025": "win2025-1"}
    for name, node in placed.items():
        apply_objects(api, app(ns, name, node))
    # Enrolled but not redirected yet: istiod must not treat it as captured.
    apply_objects(api, app(ns, "not-yet", "linux-amd64-2"))
    for name in placed:
        wait_for(
            lambda name=name: client.CoreV1Api(api).read_namespaced_pod(name, ns).status.pod_ip,
            TIMEOUT,
            f"{name} running",
        )
        redirect(api, ns, name)

    def captured() -> dict[str, str] | None:
        workloads = ambient_workloads(istio)
        mine = {n: w for (wns, n), w in workloads.items() if wns == ns}
        if set(mine) != {*placed, "not-yet"}:
            return None
        hbone = {n: w["node"] for n, w in mine.items() if w.get("tunnelProtocol") == "HBONE"}
        return hbone if set(hbone) == set(placed) else None

    hbone = wait_for(captured, TIMEOUT, f"istiod to see {ns}'s pods as ambient workloads")
    assert hbone == placed
    assert ambient_workloads(istio)[(ns, "not-yet")].get("tunnelProtocol") is None

    # Cluster-wide, istiod's captured workloads per OS are what the AmbientMesh counts.
    oses = node_os(api)

    def counts_agree() -> tuple[dict[str, int], dict[str, int]] | None:
        theirs = {"linux": 0, "windows": 0}
        for w in ambient_workloads(istio).values():
            # HBONE without nativeTunnel is ztunnel's capture; nativeTunnel
            # marks a sidecar that speaks HBONE itself (sidecar wins).
            captured = w.get("tunnelProtocol") == "HBONE" and not w.get("nativeTunnel")
            if captured and w.get("workloadType", "POD") == "POD":
                theirs[oses.get(w.get("node", ""), "linux")] += 1
        mesh = client.CustomObjectsApi(api).get_cluster_custom_object(
            c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME
        )
        enrollment = (mesh.get("status") or {}).get("enrollment") or {}
        mine = {
            "linux": (enrollment.get("linuxPods") or {}).get("enabled", -1),
            "windows": (enrollment.get("windowsPods") or {}).get("enabled", -1),
        }
        seen.append((theirs, mine))
        return (theirs, mine) if theirs == mine and theirs["windows"] >= 2 else None

    seen: list[tuple[dict[str, int], dict[str, int]]] = []
    try:
        wait_for(
            counts_agree, TIMEOUT, "AmbientMesh enrollment to match istiod's captured workloads"
        )
    except TimeoutError as exc:
        raise AssertionError(f"istiod, ours (last seen): {seen[-1:]}") from exc


# -- trust ------------------------------------------------------------------------------------


def _degraded(api: client.ApiClient) -> dict[str, Any]:
    mesh = client.CustomObjectsApi(api).get_cluster_custom_object(
        c.API_GROUP, c.API_VERSION, c.PLURAL, c.MESH_NAME
    )
    return next(
        cond
        for cond in (mesh.get("status") or {}).get("conditions") or []
        if cond["type"] == "Degraded"
    )


def test_trust_check_reads_what_the_real_chart_renders(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    """Upstream's default trusts only istio-system/ztunnel; we say which Helm value adds ours."""
    istio.install(trust_windows=False)
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment("istiod", ISTIO_NS)
        env = {e.name: e.value for e in dep.spec.template.spec.containers[0].env}
        assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "istio-system/ztunnel"  # the chart's default

        def missing() -> str | None:
            message = str(_degraded(api)["message"])
            return message if "lacks istio-system/ztunnel-windows" in message else None

        message = wait_for(missing, TIMEOUT, "IstiodTrustMissing in Degraded")
        assert (
            "env.CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,istio-system/ztunnel-windows"
            in message
        ), message
    finally:
        istio.install()
    wait_for(
        lambda: "CA_TRUSTED_NODE_ACCOUNTS" not in str(_degraded(api)["message"]),
        TIMEOUT,
        "the trust problem to clear once the value is set",
    )
