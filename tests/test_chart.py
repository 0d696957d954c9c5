"""The Helm chart with the real `helm`: lint, values schema, manifests valid for
every supported Kubernetes minor, and install, upgrade, uninstall against the
local control plane (the operator's pods run under kwok: no container starts,
so what is checked is that Kubernetes accepts, schedules and rolls the chart).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster
from ambient_operator.api import constants as c
from ambient_operator.api import crdgen
from ambient_operator.cli.main import build_parser
from chart_helpers import (
    CHART,
    TEMPLATE_KUBE_VERSION,
    by_kind,
    helm,
    one,
    template,
    template_error,
)
from conftest import unique_name, wait_for

VERSIONS = [f"1.{minor}" for minor in range(30, 38)]
# Kinds whose schemas kubernetes-validate does not ship (they come with their
# own CRDs): the cert-manager objects, the ServiceMonitor and our AmbientMesh.
# Every other object, the chart's CRD included, is validated strictly.
NOT_IN_SCHEMA_SET = {
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    (f"{c.API_GROUP}/{c.API_VERSION}", c.KIND),
}
EVERYTHING_ON: dict[str, Any] = {
    "highAvailability": {"enabled": True, "replicas": 3, "minAvailable": 2},
    "webhook": {"certManager": {"enabled": True}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "ambientMesh": {"create": True, "spec": {"namespace": "istio-system", "logLevel": "debug"}},
    "priorityClassName": "system-cluster-critical",
    "imagePullSecrets": [{"name": "registry"}],
    "image": {"digest": "sha256:" + "a" * 64},
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
}
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything-on": EVERYTHING_ON,
    "webhook-off": {"webhook": {"enabled": False}, "leaderElection": {"enabled": False}},
    "issuer": {"webhook": {"certManager": {"enabled": True, "issuerRef": {"name": "ca"}}}},
}


# -- the chart itself ---------------------------------------------------------------


def test_chart_crds_match_the_models() -> None:
    generated = crdgen.all_crds()
    shipped = {p.name for p in (CHART / "crds").iterdir()}
    assert shipped == set(generated), "run `make crd`"
    for name, obj in generated.items():
        assert (CHART / "crds" / name).read_text() == crdgen.dump(obj), (
            f"charts/ambient-operator/crds/{name} differs from the models; run `make crd`"
        )


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_strict(case: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(CASES[case]))
    done = helm(
        "lint", "--strict", str(CHART), "-f", str(values), "--kube-version", TEMPLATE_KUBE_VERSION
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_validate_strictly(case: str, version: str) -> None:
    objects = template(CASES[case], include_crds=True)
    checked = 0
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        try:
            kubernetes_validate.validate(obj, f"{version}.0", strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert key in NOT_IN_SCHEMA_SET, f"no schema for {key}"
            continue
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{case}: {obj['kind']} invalid for {version}: {path}: {err.message}")
        checked += 1
    assert checked >= 6  # CRD, ServiceAccount, ClusterRole+Binding, Service, Deployment


def test_schemas_exist_for_every_version() -> None:
    available = {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}
    assert set(VERSIONS) <= available


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"logLevel": "verbose"}, "/logLevel"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"webhok": {"enabled": False}}, "additional properties 'webhok' not allowed"),
    ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"resources": {"requests": {"cpu": "lots"}}}, "/resources/requests/cpu"),
    ({"nodeSelector": {"kubernetes.io/os": "windows"}}, "value must be 'linux'"),
    ({"webhook": {"port": 70000}}, "/webhook/port"),
    ({"webhook": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "'name' required"),
    ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
    (
        {"replicaCount": 2, "leaderElection": {"enabled": False}},
        "2 replicas need leaderElection.enabled=true",
    ),
    (
        {"highAvailability": {"enabled": True, "replicas": 2, "minAvailable": 2}},
        "must be below highAvailability.replicas",
    ),
    ({"metrics": {"port": 8080}}, "health.port and metrics.port must differ"),
    ({"registry": "Registry.example.com/UPPER"}, "/registry"),
    ({"registry": "registry.example.com/ambient/"}, "/registry"),
]


def test_old_kubernetes_is_refused() -> None:
    done = helm("template", "x", str(CHART), "--kube-version", "1.29.4")
    assert done.returncode != 0
    assert "Kubernetes v1.29.4 is not supported: the chart needs 1.30 or later" in done.stderr


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_bad_values_fail_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    assert message in template_error(values)


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return container


def test_deployment_is_locked_down() -> None:
    objects = template()
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    assert pod["nodeSelector"] == {c.LABEL_OS: "linux"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(objects)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ports["health"] == 8080
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert "--webhook-service=ambient-operator/ambient-operator:443" in container["args"]
    assert "--webhook-namespace=ambient-operator" in container["args"]
    assert "--lease-namespace=ambient-operator" in container["args"]
    assert not by_kind(objects, "PodDisruptionBudget")
    assert not by_kind(objects, "ServiceMonitor")
    assert not by_kind(objects, c.KIND)
    service = one(objects, "Service")
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("https-webhook", 443, "webhook"),
        ("http-metrics", 9090, "metrics"),
    }


def test_registry_names_the_operator_image_and_the_operators_default() -> None:
    # Unset: the image as before, and no default registry handed to the operator.
    plain = _container(template())
    assert plain["image"] == "ambient-operator:0.1.0"
    assert not [a for a in plain["args"] if a.startswith("--default-registry")]
    # Set: where `make images REGISTRY=...` pushed the operator, tagged with appVersion,
    # and the AmbientMesh's spec.images.registry when it sets none.
    both = _container(template({"registry": "registry.example.com:5000/ambient"}))
    assert both["image"] == "registry.example.com:5000/ambient/ambient-operator:0.1.0"
    assert "--default-registry=registry.example.com:5000/ambient" in both["args"]
    # The operator parses what the chart hands it into its option.
    args = build_parser().parse_args(["run", *both["args"][1:]])
    assert args.default_registry == "registry.example.com:5000/ambient"
    # An image of your own wins; a tag or a digest still apply under the registry.
    own = _container(
        template({"registry": "r.example/amb", "image": {"repository": "mine.example/op"}})
    )
    assert own["image"] == "mine.example/op:0.1.0"
    assert "--default-registry=r.example/amb" in own["args"]
    tagged = _container(template({"registry": "r.example/amb", "image": {"tag": "0.2.0-rc.1"}}))
    assert tagged["image"] == "r.example/amb/ambient-operator:0.2.0-rc.1"
    pinned = _container(
        template({"registry": "r.example/amb", "image": {"digest": "sha256:" + "b" * 64}})
    )
    assert pinned["image"] == "r.example/amb/ambient-operator@sha256:" + "b" * 64


def test_user_node_selector_cannot_unpin_linux() -> None:
    pod = one(template({"nodeSelector": {"pool": "a"}}), "Deployment")["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {c.LABEL_OS: "linux", "pool": "a"}


def test_high_availability() -> None:
    objects = template({"highAvailability": {"enabled": True}})
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert "--leader-election" in _container(objects)["args"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"]


def test_cert_manager_mode_mounts_the_certificate_and_drops_the_secret_rules() -> None:
    objects = template({"webhook": {"certManager": {"enabled": True}}})
    args = _container(objects)["args"]
    assert "--webhook-cert-dir=/etc/ambient-operator/webhook-tls" in args
    certificate = one(objects, "Certificate")
    assert one(objects, "Issuer")["spec"] == {"selfSigned": {}}
    volume = next(
        v
        for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "webhook-tls"
    )
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert "ambient-operator.ambient-operator.svc" in certificate["spec"]["dnsNames"]
    # The release namespace's Role (the agents' namespaces have their own).
    (role,) = [
        r for r in by_kind(objects, "Role") if r["metadata"]["namespace"] == "ambient-operator"
    ]
    assert all("secrets" not in rule["resources"] for rule in role["rules"])


def test_default_ambientmesh_is_optional() -> None:
    mesh = one(template({"ambientMesh": {"create": True}}), c.KIND)
    assert mesh["metadata"]["name"] == c.MESH_NAME
    assert mesh["spec"] == {}


# -- install, upgrade, uninstall ----------------------------------------------------


@pytest.fixture
def release_namespace(k8s: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(k8s)
    name = unique_name("chart")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


def _running_pods(k8s: client.ApiClient, namespace: str, release: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(k8s).list_namespaced_pod(
        namespace, label_selector=f"app.kubernetes.io/instance={release}"
    )
    return [
        p for p in pods.items if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]


def _node_os(k8s: client.ApiClient, name: str) -> str:
    node = client.CoreV1Api(k8s).read_node(name)
    return str(node.metadata.labels.get(c.LABEL_OS))


def _available(k8s: client.ApiClient, namespace: str, name: str, replicas: int) -> bool:
    dep = client.AppsV1Api(k8s).read_namespaced_deployment(name, namespace)
    st = dep.status
    return bool(
        st.observed_generation == dep.metadata.generation
        and (st.available_replicas or 0) == replicas
        and (st.updated_replicas or 0) == replicas
        and any(cond.type == "Available" and cond.status == "True" for cond in st.conditions or [])
    )


def test_install_upgrade_uninstall(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    release_namespace: str,
) -> None:
    ns, release = release_namespace, unique_name("ao")
    name = f"{release}-ambient-operator"
    kube = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", ns]
    # The chart puts a Role in the agents' namespace (agents.namespaces), which
    # exists before install, as istiod's does; other modules may have made it.
    with contextlib.suppress(ApiException):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": "istio-system"}})
    done = helm("install", release, str(CHART), *kube, "--wait", "--timeout", "3m")
    assert done.returncode == 0, done.stderr
    # NOTES.txt tells what to do next.
    for step in (
        f"rollout status deployment/{name}",
        "CA_TRUSTED_NODE_ACCOUNTS",
        "kind: AmbientMesh",
        "istio.io/dataplane-mode=ambient",
        "kubectl delete mutatingwebhookconfiguration ambient-operator",
        # No value registry: where the Windows images come from, and the command.
        "`make images REGISTRY=<registry>` (docs/images.md)",
    ):
        assert step in done.stdout, step
    assert _available(k8s, ns, name, 1)
    pods = _running_pods(k8s, ns, release)
    assert len(pods) == 1
    assert _node_os(k8s, pods[0].spec.node_name) == "linux"
    crd = client.ApiextensionsV1Api(k8s).read_custom_resource_definition(
        f"{c.PLURAL}.{c.API_GROUP}"
    )
    assert crd.spec.names.kind == c.KIND

    done = helm(
        "upgrade",
        release,
        str(CHART),
        *kube,
        "--wait",
        "--timeout",
        "3m",
        "--set",
        "logLevel=debug",
        "--set",
        "highAvailability.enabled=true",
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: _available(k8s, ns, name, 2), 60, "2 replicas available")
    dep = client.AppsV1Api(k8s).read_namespaced_deployment(name, ns)
    assert "--log-level=debug" in dep.spec.template.spec.containers[0].args
    assert client.PolicyV1Api(k8s).read_namespaced_pod_disruption_budget(name, ns)
    pods = wait_for(
        lambda: (p := _running_pods(k8s, ns, release)) and len(p) == 2 and p,
        60,
        "2 running pods",
    )
    assert {_node_os(k8s, p.spec.node_name) for p in pods} == {"linux"}
    history = helm("history", release, *kube)
    assert history.returncode == 0 and "upgrade" in history.stdout.lower(), history.stdout

    done = helm("uninstall", release, *kube, "--wait", "--timeout", "2m")
    assert done.returncode == 0, done.stderr
    apps, rbac = client.AppsV1Api(k8s), client.RbacAuthorizationV1Api(k8s)
    with pytest.raises(ApiException) as gone:
        apps.read_namespaced_deployment(name, ns)
    assert gone.value.status == 404
    with pytest.raises(ApiException) as gone:
        rbac.read_cluster_role(name)
    assert gone.value.status == 404
    with pytest.raises(ApiException) as gone:
        rbac.read_namespaced_role(f"{name}-agents", "istio-system")
    assert gone.value.status == 404
    # Helm never deletes CRDs: the AmbientMesh and what it owns outlive the release.
    assert client.ApiextensionsV1Api(k8s).read_custom_resource_definition(
        f"{c.PLURAL}.{c.API_GROUP}"
    )
