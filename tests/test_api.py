"""The AmbientMesh API: generated CRD, and validation by the real API server."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from ambient_operator.api import crdgen
from ambient_operator.api.v1alpha1 import AmbientMesh
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "operator/ambient_operator/samples/ambientmesh.yaml"
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]


def test_committed_crds_match_the_models() -> None:
    for name, obj in crdgen.all_crds().items():
        committed = (ROOT / "crds" / name).read_text()
        assert committed == crdgen.dump(obj), (
            f"crds/{name} differs from the models; run `make crd` and commit the result"
        )


def test_crd_schema_is_structural() -> None:
    text = (ROOT / "crds/ambientoperator.io_ambientmeshes.yaml").read_text()
    for forbidden in ("$ref", "anyOf: [", "propertyNames", "additionalProperties: false", "title:"):
        assert forbidden not in text


def _mesh(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ambientoperator.io/v1alpha1",
        "kind": "AmbientMesh",
        "metadata": {"name": "default"},
        "spec": spec,
    }


# (case id, object, the field path the API server must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "second-object",
        {**_mesh(), "metadata": {"name": "other"}},
        "metadata.name",
    ),
    ("negative-timeout", _mesh(newPodWorkaround={"timeoutSeconds": -5}), "timeoutSeconds"),
    (
        "unknown-windows-build",
        _mesh(platforms={"windows": {"builds": ["10.0.17763"]}}),
        "spec.platforms.windows.builds[0]",
    ),
    (
        "rollout-both-zero",
        _mesh(ztunnel={"rollout": {"maxUnavailable": 0, "maxSurge": 0}}),
        "spec.ztunnel.rollout",
    ),
    (
        "rollout-default-surge-zeroed",
        _mesh(ztunnel={"rollout": {"maxSurge": "0%"}}),
        "spec.ztunnel.rollout",
    ),
    (
        "rollout-both-nonzero",
        _mesh(istioCni={"rollout": {"maxUnavailable": 2, "maxSurge": 1}}),
        "spec.istioCni.rollout",
    ),
    ("bad-enum", _mesh(logLevel="verbose"), "spec.logLevel"),
    # A platform name must be one the operator has a profile for (docs/platforms.md).
    ("unknown-platform", _mesh(platform="rke2"), "spec.platform"),
    ("unknown-field", _mesh(ztunnell={"rollout": {}}), "ztunnell"),
    (
        "malformed-image",
        _mesh(images={"ztunnel": {"linux": "Docker.io//istio/ztunnel::1.0"}}),
        "spec.images.ztunnel.linux",
    ),
    (
        "negative-quantity",
        _mesh(ztunnel={"resources": {"requests": {"cpu": "-100m"}}}),
        "spec.ztunnel.resources.requests.cpu",
    ),
    (
        "negative-integer-quantity",
        _mesh(istioCni={"resources": {"limits": {"memory": -1}}}),
        "spec.istioCni.resources.limits.memory",
    ),
    (
        "image-for-unknown-build",
        _mesh(images={"istioCni": {"windowsBuilds": {"10.0.17763": "docker.io/istio/cni:1"}}}),
        "spec.images.istioCni.windowsBuilds",
    ),
    ("bad-hub", _mesh(images={"hub": "https://docker.io/istio"}), "spec.images.hub"),
    # The values Istio's charts take (api/helm_values.py), each with its own rule.
    (
        "cluster-name-with-space",
        _mesh(multiCluster={"clusterName": "west 1"}),
        "spec.multiCluster.clusterName",
    ),
    ("network-longer-than-a-label", _mesh(network="n" * 64), "spec.network"),
    ("unknown-pull-policy", _mesh(images={"pullPolicy": "Sometimes"}), "spec.images.pullPolicy"),
    (
        "pull-secret-not-a-name",
        _mesh(images={"pullSecrets": ["Registry_Key"]}),
        "spec.images.pullSecrets[0]",
    ),
    ("unknown-variant", _mesh(images={"variant": "alpine"}), "spec.images.variant"),
    ("env-name-with-equals", _mesh(ztunnel={"env": {"A=B": "1"}}), "spec.ztunnel.env"),
    ("env-name-leading-digit", _mesh(istioCni={"env": {"1A": "1"}}), "spec.istioCni.env"),
    (
        "annotation-not-a-string",
        _mesh(ztunnel={"podAnnotations": {"a": 1}}),
        "spec.ztunnel.podAnnotations.a",
    ),
    (
        "label-value-too-long",
        _mesh(istioCni={"podLabels": {"a": "v" * 64}}),
        "spec.istioCni.podLabels.a",
    ),
    ("agent-log-level", _mesh(istioCni={"logLevel": "verbose"}), "spec.istioCni.logLevel"),
    ("json-logs-not-a-bool", _mesh(ztunnel={"logAsJson": "yes"}), "spec.ztunnel.logAsJson"),
    (
        "excluded-namespace-not-a-name",
        _mesh(istioCni={"excludeNamespaces": ["Kube_System"]}),
        "spec.istioCni.excludeNamespaces[0]",
    ),
    (
        "cni-grace-zero",
        _mesh(istioCni={"terminationGracePeriodSeconds": 0}),
        "spec.istioCni.terminationGracePeriodSeconds",
    ),
    (
        "ca-address-without-port",
        _mesh(istiod={"caAddress": "ca.example.com"}),
        "spec.istiod.caAddress",
    ),
    (
        "nftables-not-a-bool",
        _mesh(istioCni={"nativeNftables": "on"}),
        "spec.istioCni.nativeNftables",
    ),
    ("unknown-dns-policy", _mesh(ztunnel={"dnsPolicy": "Cluster"}), "spec.ztunnel.dnsPolicy"),
    (
        "four-nameservers",
        _mesh(ztunnel={"dnsConfig": {"nameservers": ["1.1.1.1"] * 4}}),
        "spec.ztunnel.dnsConfig.nameservers",
    ),
    (
        "unknown-seccomp",
        _mesh(istioCni={"seccompProfile": {"type": "Strict"}}),
        "spec.istioCni.seccompProfile.type",
    ),
    (
        "conf-file-with-folder",
        _mesh(istioCni={"cniConfFileName": "../10-x.conflist"}),
        "spec.istioCni.cniConfFileName",
    ),
    ("quota-of-no-pods", _mesh(resourceQuotas={"pods": 0}), "spec.resourceQuotas.pods"),
    (
        "relative-cni-dir",
        _mesh(platforms={"linux": {"cniBinDir": "opt/cni/bin"}}),
        "spec.platforms.linux.cniBinDir",
    ),
    (
        "init-container-not-a-name",
        _mesh(istioCni={"repairInitContainerName": "Istio_Validation"}),
        "spec.istioCni.repairInitContainerName",
    ),
    ("provider-unknown", _mesh(istioCni={"provider": "Multus"}), "spec.istioCni.provider"),
    ("repair-mode-unknown", _mesh(istioCni={"repairMode": "Restart"}), "spec.istioCni.repairMode"),
    (
        "broken-pod-label-key-with-space",
        _mesh(istioCni={"brokenPodLabel": {"key": "broken pod"}}),
        "spec.istioCni.brokenPodLabel.key",
    ),
    (
        "broken-pod-label-value-too-long",
        _mesh(istioCni={"brokenPodLabel": {"value": "v" * 64}}),
        "spec.istioCni.brokenPodLabel.value",
    ),
    (
        "broken-pod-label-value-not-a-label",
        _mesh(istioCni={"brokenPodLabel": {"value": "-true"}}),
        "spec.istioCni.brokenPodLabel.value",
    ),
    (
        "volume-of-two-kinds",
        _mesh(ztunnel={"volumes": [{"name": "x", "emptyDir": {}, "secret": {"secretName": "s"}}]}),
        "spec.ztunnel.volumes[0]",
    ),
    (
        "volume-named-as-ztunnels-own",
        _mesh(ztunnel={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        "spec.ztunnel",
    ),
    (
        "mount-of-no-volume",
        _mesh(ztunnel={"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}),
        "spec.ztunnel",
    ),
    (
        "mount-over-ztunnels-own",
        _mesh(
            ztunnel={
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/var/run/ztunnel"}],
            }
        ),
        "spec.ztunnel",
    ),
    (
        "affinity-term-without-expressions",
        _mesh(platforms={"linux": {"nodeAffinity": [{"matchExpressions": []}]}}),
        "spec.platforms.linux.nodeAffinity[0].matchExpressions",
    ),
    (
        "affinity-unknown-operator",
        _mesh(
            platforms={
                "linux": {"nodeAffinity": [{"matchExpressions": [{"key": "a", "operator": "Is"}]}]}
            }
        ),
        "spec.platforms.linux.nodeAffinity[0].matchExpressions[0].operator",
    ),
    # Found by the fuzz test (seed 1163165953): the API server refused the DaemonSet instead.
    ("dns-policy-none-alone", _mesh(ztunnel={"dnsPolicy": "None"}), "spec.ztunnel"),
    (
        "dns-policy-none-without-nameservers",
        _mesh(ztunnel={"dnsPolicy": "None", "dnsConfig": {"searches": ["svc.cluster.local"]}}),
        "spec.ztunnel",
    ),
]

# Every field Istio's chart values become, set at once: valid, and kept as written.
EVERY_VALUE_FIELD = _mesh(
    multiCluster={"clusterName": "cluster-west"},
    network="network-west",
    images={"variant": "distroless", "pullPolicy": "Always", "pullSecrets": ["registry-key"]},
    istiod={"caAddress": "ca.example.com:15012", "xdsAddress": "xds.example.com:15012"},
    resourceQuotas={"enabled": True, "pods": 200},
    ztunnel={
        "labels": {"team": "mesh"},
        "annotations": {"example.com/owner": "mesh"},
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "2"}]},
        "seLinuxOptions": {"type": "spc_t", "level": "s0"},
        "volumes": [{"name": "extra-ca", "configMap": {"name": "corporate-ca", "optional": True}}],
        "volumeMounts": [{"name": "extra-ca", "mountPath": "/etc/extra-ca", "readOnly": True}],
        "env": {"CUSTOM_SETTING": "on", "a.b-c_D": "1"},
        "podLabels": {"team": "mesh"},
        "podAnnotations": {"example.com/owner": "mesh"},
        "logLevel": "debug",
        "logAsJson": True,
        "peerCaCrl": True,
    },
    istioCni={
        "env": {"CUSTOM_SETTING": "on"},
        "excludeNamespaces": ["kube-system", "monitoring"],
        "dnsCapture": False,
        "ipv6": False,
        "reconcileIptablesOnStartup": False,
        "enableAmbientDetectionRetry": True,
        "nativeNftables": True,
        "terminationGracePeriodSeconds": 45,
        "logAsJson": True,
        "labels": {"team": "mesh"},
        "seLinuxOptions": {"level": "s0"},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/cni.json"},
        "istioOwnedCniConfig": True,
        "istioOwnedCniConfigFileName": "02-istio.conflist",
        "chained": False,
        "cniConfFileName": "10-calico.conflist",
        "repair": False,
        "repairInitContainerName": "mesh-check",
        "repairMode": "Label",
        "provider": "multus",
        "brokenPodLabel": {"key": "mesh.example.com/unredirected", "value": "repair-me"},
    },
    platforms={
        "linux": {
            "cniBinDir": "/usr/libexec/cni",
            "cniConfDir": "/etc/cni/net.d",
            "cniNetnsDir": "/run/netns",
        }
    },
)


@pytest.mark.parametrize(("case", "obj", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_models_reject_what_the_schema_rejects(case: str, obj: dict[str, Any], field: str) -> None:
    # The operator reads objects with the same rules: no invalid spec slips in
    # through an older CRD or the offline `render` command.
    with pytest.raises(ValidationError):
        AmbientMesh.model_validate(obj)


def test_sample_is_valid_offline() -> None:
    mesh = AmbientMesh.model_validate(yaml.safe_load(SAMPLE.read_text()))
    assert mesh.metadata["name"] == "default"


@pytest.fixture(scope="module")
def kube(cluster: Any, crds_installed: None) -> Kube:
    from ambient_operator.kube.credentials import load_credentials

    return Kube(load_credentials(str(cluster.kubeconfig)))


def _create_strict(kube: Kube, obj: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = kube.request(
        "POST",
        MESH.collection(),
        body=obj,
        query=[("fieldValidation", "Strict"), ("dryRun", "All")],
    )
    return result


@pytest.mark.cluster
@pytest.mark.parametrize(("case", "obj", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_api_server_rejects_invalid_mesh(
    kube: Kube, case: str, obj: dict[str, Any], field: str
) -> None:
    with pytest.raises(KubeError) as err:
        _create_strict(kube, copy.deepcopy(obj))
    assert err.value.status in (400, 422), err.value
    assert field in err.value.message, err.value.message


def test_every_value_field_is_valid_offline() -> None:
    assert AmbientMesh.model_validate(EVERY_VALUE_FIELD).spec.istio_cni.native_nftables


@pytest.mark.cluster
def test_api_server_accepts_every_value_field_as_written(kube: Kube) -> None:
    created = _create_strict(kube, copy.deepcopy(EVERY_VALUE_FIELD))
    assert created["spec"] == EVERY_VALUE_FIELD["spec"]


@pytest.mark.cluster
def test_api_server_accepts_sample(kube: Kube) -> None:
    sample = yaml.safe_load(SAMPLE.read_text())
    created = _create_strict(kube, sample)
    assert created["spec"] == sample["spec"]


@pytest.mark.cluster
def test_kubectl_apply_client_and_server_side(cluster: Any, crds_installed: None) -> None:
    kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    for mode in ([], ["--server-side"]):
        done = subprocess.run(
            [*kubectl, "apply", *mode, "-f", str(ROOT / "crds")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        done = subprocess.run(
            [*kubectl, "apply", *mode, "--dry-run=server", "-f", str(SAMPLE)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


# istiod's own controllers (pkg/config/constants, and PILOT_GATEWAY_API_CONTROLLER_NAME's
# default in pilot/pkg/features) and a subdomain of theirs: a class naming one is istiod's.
ISTIOD_CONTROLLERS = [
    "istio.io/mesh-controller",
    "istio.io/gateway-controller",
    "istio.io/unmanaged-gateway",
    "istio.io/eastwest-controller",
    "waypoints.istio.io/controller",
]
OTHER_CONTROLLERS = [
    "ambientoperator.io/waypoint-controller",
    "example.com/istio.io/mesh-controller",
    "istio.io.example.com/waypoints",
]
BAD_PRIORITY_CLASSES = ["System-Node-Critical", "team/critical", "-critical", "a_b", "a" * 254]
GOOD_PRIORITY_CLASSES = ["system-node-critical", "team.critical-1", "a" * 253]


def test_models_refuse_istiod_controllers_and_priority_classes_that_are_no_names() -> None:
    for name in ISTIOD_CONTROLLERS:
        with pytest.raises(ValidationError, match="istiod serves") as err:
            AmbientMesh.model_validate(_mesh(waypoints={"controllerName": name}))
        assert "waypoints.controllerName" in str(err.value)
    for name in OTHER_CONTROLLERS:
        spec = AmbientMesh.model_validate(_mesh(waypoints={"controllerName": name})).spec
        assert spec.waypoints.controller_name == name
    for name in BAD_PRIORITY_CLASSES:
        with pytest.raises(ValidationError, match="priorityClassName"):
            AmbientMesh.model_validate(_mesh(priorityClassName=name))
    for name in GOOD_PRIORITY_CLASSES:
        assert AmbientMesh.model_validate(_mesh(priorityClassName=name)).spec.priority_class_name


@pytest.mark.cluster
def test_api_server_refuses_istiod_controllers(kube: Kube) -> None:
    for name in ISTIOD_CONTROLLERS:
        with pytest.raises(KubeError) as err:
            _create_strict(kube, _mesh(waypoints={"controllerName": name}))
        assert err.value.status == 422, err.value
        assert "spec.waypoints.controllerName" in err.value.message, err.value.message
        assert "istiod serves" in err.value.message, err.value.message
    for name in OTHER_CONTROLLERS:
        created = _create_strict(kube, _mesh(waypoints={"controllerName": name}))
        assert created["spec"]["waypoints"]["controllerName"] == name


@pytest.mark.cluster
def test_api_server_refuses_priority_classes_that_are_no_names(kube: Kube) -> None:
    for name in BAD_PRIORITY_CLASSES:
        with pytest.raises(KubeError) as err:
            _create_strict(kube, _mesh(priorityClassName=name))
        assert err.value.status == 422, err.value
        assert "spec.priorityClassName" in err.value.message, err.value.message
    for name in GOOD_PRIORITY_CLASSES:
        assert _create_strict(kube, _mesh(priorityClassName=name))["spec"]["priorityClassName"]
