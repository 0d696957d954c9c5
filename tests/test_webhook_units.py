"""The webhook's pure parts: decision, patch, init container, certificates, configuration."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re
import socket
import ssl
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import jsonpatch
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import AdmissionReason
from ambient_operator.cli.main import build_parser
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube
from ambient_operator.webhook import certs
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import WebhookOptions, webhook_configuration
from ambient_operator.webhook.misses import MissTracker
from ambient_operator.webhook.server import AdmissionServer
from ambient_operator.webhook.upkeep import Webhook

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_NODES = ROOT / "operator/ambient_operator/samples/nodes-mixed.yaml"
TOLERATE = [{"key": "os", "operator": "Exists"}]
ENROLLED = {c.LABEL_DATAPLANE_MODE: "ambient"}
NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _nodes() -> list[NodeFacts]:
    return [NodeFacts.from_node(n) for n in yaml.safe_load(SAMPLE_NODES.read_text())["items"]]


def _node(name: str, build: str, **labels: str) -> NodeFacts:
    return NodeFacts.from_node(
        {
            "metadata": {
                "name": name,
                "labels": {
                    c.LABEL_OS: "windows",
                    c.LABEL_ARCH: "amd64",
                    c.LABEL_WINDOWS_BUILD: build,
                    **labels,
                },
            }
        }
    )


def _mesh(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "default", "uid": "u"}, "spec": spec}


# Where `make images` pushed the bundled images: given as the operator's default
# (the chart's value registry), so the multi-build image is known.
REGISTRY = "registry.example.com:5000/ambient"


def _ctx(nodes: list[NodeFacts] | None = None, **spec: Any) -> d.Context:
    return d.Context.build(
        _mesh(**spec), _nodes() if nodes is None else nodes, default_registry=REGISTRY
    )


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {}, "annotations": {}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}], **spec},
    }


WIN = {"nodeSelector": {c.LABEL_OS: "windows"}, "tolerations": TOLERATE}


def _pinned(build: str) -> dict[str, Any]:
    return {"nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: build}}


@pytest.mark.parametrize(
    ("spec", "action", "reason", "build"),
    [
        ({"nodeSelector": {c.LABEL_OS: "linux"}}, "none", "NotWindows", None),
        ({}, "none", "NotWindows", None),
        (WIN, "inject", "MayLandOnPreWS2025Node", None),
        (
            {"os": {"name": "windows"}, "tolerations": TOLERATE},
            "inject",
            "MayLandOnPreWS2025Node",
            None,
        ),
        ({"os": {"name": "windows"}}, "none", "NoPreWS2025Node", None),  # taint not tolerated
        (_pinned(c.BUILD_WS2022), "inject", "PinnedToPreWS2025Build", c.BUILD_WS2022),
        (_pinned(c.BUILD_WS2025), "none", "NoPreWS2025Build", None),
        (_pinned(c.BUILD_WS2019), "none", "NoPreWS2025Build", None),  # no agents there
        ({"nodeName": "win2022-1"}, "inject", "ScheduledOnPreWS2025Node", c.BUILD_WS2022),
        ({"nodeName": "win2025-1"}, "none", "NoPreWS2025Node", None),
        ({"nodeName": "linux-amd64-1"}, "none", "NotWindows", None),
        (
            {"nodeSelector": {c.LABEL_HOSTNAME: "win2022-1"}, "tolerations": TOLERATE},
            "inject",
            "MayLandOnPreWS2025Node",
            None,
        ),
        ({**_pinned(c.BUILD_WS2022), "hostNetwork": True}, "none", "HostNetwork", None),
    ],
)
def test_decisions_on_the_sample_cluster(
    spec: dict[str, Any], action: str, reason: str, build: str | None
) -> None:
    decision = d.decide(_pod(**spec), ENROLLED, _ctx())
    assert (decision.action, decision.reason, decision.build) == (action, reason, build)


def test_only_ws2025_windows_nodes_means_no_injection() -> None:
    nodes = [n for n in _nodes() if n.os == "linux"] + [_node("w25", c.BUILD_WS2025)]
    decision = d.decide(_pod(**WIN), ENROLLED, _ctx(nodes))
    assert (decision.action, decision.reason) == ("none", "NoPreWS2025Node")
    # Pinned to WS2022 it still gets the workaround: a WS2022 node may join later.
    pinned = d.decide(_pod(**_pinned(c.BUILD_WS2022)), ENROLLED, _ctx(nodes))
    assert pinned.inject


def test_affinity_build_pins() -> None:
    def affinity(*terms: list[str]) -> dict[str, Any]:
        return {
            "tolerations": TOLERATE,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": c.LABEL_WINDOWS_BUILD, "operator": "In", "values": t}
                                ]
                            }
                            for t in terms
                        ]
                    }
                }
            },
        }

    one = d.decide(_pod(**affinity([c.BUILD_WS2022])), ENROLLED, _ctx())
    assert (one.action, one.build) == ("inject", c.BUILD_WS2022)
    assert one.image == "mcr.microsoft.com/windows/nanoserver:ltsc2022"
    both = d.decide(_pod(**affinity([c.BUILD_WS2022], [c.BUILD_WS2025])), ENROLLED, _ctx())
    assert (both.action, both.build) == ("inject", None)  # several builds: multi-build image
    assert both.image == f"{REGISTRY}/redirection-wait:{oracle.OPERATOR_VERSION}"
    ws2025 = d.decide(_pod(**affinity([c.BUILD_WS2025])), ENROLLED, _ctx())
    assert ws2025.action == "none"


def test_runtime_class_makes_a_windows_pod() -> None:
    rcs = {"win": {"nodeSelector": {c.LABEL_OS: "windows"}, "tolerations": TOLERATE}}
    ctx = d.Context.build(_mesh(), _nodes(), rcs, default_registry=REGISTRY)
    assert d.decide(_pod(runtimeClassName="win"), ENROLLED, ctx).inject
    assert not d.decide(_pod(runtimeClassName="other"), ENROLLED, ctx).inject


@pytest.mark.parametrize(
    ("labels", "annotations", "ns_labels", "reason"),
    [
        ({}, {d.ANNOTATION: "False"}, ENROLLED, "OptedOut"),
        ({c.LABEL_DATAPLANE_MODE: "none"}, {}, ENROLLED, "DataplaneModeNone"),
        ({"sidecar.istio.io/inject": "true"}, {}, ENROLLED, "Sidecar"),
        ({}, {"sidecar.istio.io/status": "{}"}, ENROLLED, "Sidecar"),
        ({}, {}, {**ENROLLED, "istio-injection": "enabled"}, "Sidecar"),
        ({}, {}, {}, "NotEnrolled"),
    ],
)
def test_pods_left_alone(
    labels: dict[str, str], annotations: dict[str, str], ns_labels: dict[str, str], reason: str
) -> None:
    pod = _pod(**_pinned(c.BUILD_WS2022))
    pod["metadata"].update(labels=labels, annotations=annotations)
    assert d.decide(pod, ns_labels, _ctx()).reason == reason


def test_pod_label_enrolls_and_unknown_namespace_trusts_the_selector() -> None:
    pod = _pod(**_pinned(c.BUILD_WS2022))
    assert d.decide(pod, None, _ctx()).inject
    pod["metadata"]["labels"] = ENROLLED
    assert d.decide(pod, {}, _ctx()).inject


def test_mesh_gates_the_workaround() -> None:
    pod = _pod(**_pinned(c.BUILD_WS2022))
    nodes = _nodes()
    assert d.decide(pod, ENROLLED, d.Context.build(None, nodes)).reason == "NoAmbientMesh"
    off = _ctx(newPodWorkaround={"enabled": False})
    assert d.decide(pod, ENROLLED, off).reason == "WorkaroundDisabled"
    no_windows = _ctx(platforms={"windows": {"enabled": False}})
    assert d.decide(pod, ENROLLED, no_windows).reason == "NoPreWS2025Build"
    only_2025 = _ctx(platforms={"windows": {"builds": [c.BUILD_WS2025]}})
    assert d.decide(_pod(**WIN), ENROLLED, only_2025).reason == "NoPreWS2025Node"
    invalid = d.Context.build(_mesh(newPodWorkaround={"timeoutSeconds": -1}), nodes)
    assert d.decide(pod, ENROLLED, invalid).reason == "NoAmbientMesh"


def test_images_and_timeout_come_from_the_spec() -> None:
    ctx = _ctx(
        images={"hub": "registry.example.com/istio", "tag": "9.9.9"},
        newPodWorkaround={
            "timeoutSeconds": 30,
            "images": {c.BUILD_WS2022: "registry.example.com/nano:ltsc2022"},
        },
    )
    pinned = d.decide(_pod(**_pinned(c.BUILD_WS2022)), ENROLLED, ctx)
    assert (pinned.image, pinned.timeout_seconds) == ("registry.example.com/nano:ltsc2022", 30)
    loose = d.decide(_pod(**WIN), ENROLLED, ctx)
    # Not under hub and tag, which are Istio's: under the registry `make images` pushed
    # to, tagged with the operator's version (pyproject.toml's).
    assert loose.image == f"{REGISTRY}/redirection-wait:{oracle.OPERATOR_VERSION}"
    own = _ctx(
        images={"registry": "mine.example.com/amb"},
        newPodWorkaround={"multiBuildImage": "mine.example.com/wait:multi"},
    )
    assert d.decide(_pod(**WIN), ENROLLED, own).image == "mine.example.com/wait:multi"
    spec_registry = _ctx(images={"registry": "mine.example.com/amb"})
    assert (
        d.decide(_pod(**WIN), ENROLLED, spec_registry).image
        == f"mine.example.com/amb/redirection-wait:{oracle.OPERATOR_VERSION}"
    )


def _bare(**spec: Any) -> d.Context:
    """A context with no registry anywhere: neither the spec's nor the operator's."""
    return d.Context.build(_mesh(**spec), _nodes())


def test_an_unavailable_image_is_withheld_not_handed_over() -> None:
    # The multi-build default with no registry is <hub>/redirection-wait:<tag>, which
    # nobody pushed: the pod is admitted unchanged but for the annotation saying why.
    pod = _pod(**WIN)
    decision = d.decide(pod, ENROLLED, _bare())
    assert (decision.action, decision.reason, decision.build, decision.image) == (
        "withheld",
        "ImageUnavailable",
        None,
        None,
    )
    out = d.mutated(pod, decision)
    assert out["metadata"]["annotations"] == {
        d.ANNOTATION: "withheld; build=any; reason=ImageUnavailable"
    }
    assert out["spec"] == pod["spec"]
    assert jsonpatch.apply_patch(pod, d.json_patch(pod, decision)) == out
    assert d.withheld(out) and not d.withheld(pod)
    # A placeholder under Istio's hub is as unavailable as nothing at all.
    placeholder = _bare(newPodWorkaround={"multiBuildImage": "docker.io/istio/redirection-wait:1"})
    assert d.decide(pod, ENROLLED, placeholder).reason == "ImageUnavailable"
    on_hub = _bare(images={"registry": "docker.io/istio"})
    assert d.decide(pod, ENROLLED, on_hub).reason == "ImageUnavailable"
    # Per-build images are real public images: a pod pinned to WS2022 still gets one.
    pinned = d.decide(_pod(**_pinned(c.BUILD_WS2022)), ENROLLED, _bare())
    assert (pinned.action, pinned.image) == (
        "inject",
        "mcr.microsoft.com/windows/nanoserver:ltsc2022",
    )
    # The spec's own registry wins over the operator's default.
    both = d.Context.build(
        _mesh(images={"registry": "mine.example.com/amb"}), _nodes(), default_registry=REGISTRY
    )
    assert (
        d.decide(pod, ENROLLED, both).image
        == f"mine.example.com/amb/redirection-wait:{oracle.OPERATOR_VERSION}"
    )


def test_init_container_volume_environment_and_command() -> None:
    decision = d.decide(_pod(**_pinned(c.BUILD_WS2022)), ENROLLED, _ctx())
    pod = d.mutated(_pod(**_pinned(c.BUILD_WS2022)), decision)
    ours = pod["spec"]["initContainers"][0]
    assert ours["name"] == d.CONTAINER_NAME
    assert ours["command"][:3] == ["cmd.exe", "/S", "/C"]
    env = {e["name"]: e["value"] for e in ours["env"]}
    assert env == {d.ENV_TIMEOUT: "120", d.ENV_FILE: "C:\\ambient\\podinfo\\annotations"}
    assert ours["volumeMounts"] == [
        {"name": d.VOLUME_NAME, "mountPath": "C:\\ambient\\podinfo", "readOnly": True}
    ]
    assert ours["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}}
    assert ours["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["spec"]["volumes"] == [
        {
            "name": d.VOLUME_NAME,
            "downwardAPI": {
                "items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]
            },
        }
    ]
    assert pod["metadata"]["annotations"][d.ANNOTATION] == (
        f"injected; build={c.BUILD_WS2022}; reason=PinnedToPreWS2025Build"
    )


def test_wait_script_survives_the_trip_to_cmd() -> None:
    script = d.COMMAND[3]
    # The runtime escapes double quotes with backslashes that cmd.exe keeps.
    assert '"' not in script
    # `^` is cmd's escape character outside quotes.
    assert "^" not in script
    # Percent signs: one FOR variable, then only paired environment references.
    assert script.count("%i") == 1
    refs = re.findall(r"%([A-Z_]+)%", script)
    assert set(refs) == {d.ENV_TIMEOUT, d.ENV_FILE}
    assert script.count("%") == 1 + 2 * len(refs)
    # It polls the annotation the downward API writes as key="value" lines,
    # anchored at the line start, about once a second, and fails at the end.
    assert "findstr /B /R /C:ambient\\.istio\\.io/redirection=.enabled." in script
    assert re.match(
        r"^ambient\.istio\.io/redirection=.enabled.", 'ambient.istio.io/redirection="enabled"'
    )
    assert "ping -n 2 127.0.0.1" in script
    assert script.startswith(f"for /L %i in (1,1,%{d.ENV_TIMEOUT}%) do @(")
    assert script.endswith("1>&2 & exit 1")
    assert "exit 0" in script
    assert not script.endswith("\\")  # a trailing backslash would be doubled when quoted


def test_guaranteed_pods_stay_guaranteed_and_security_is_copied() -> None:
    same = {"cpu": "1", "memory": "1Gi"}
    spec = {
        "containers": [
            {
                "name": "app",
                "resources": {"requests": same, "limits": same},
                "securityContext": {
                    "runAsNonRoot": True,
                    "windowsOptions": {"runAsUserName": "app-user"},
                },
            }
        ]
    }
    decision = d.Decision(
        "inject", AdmissionReason.PINNED_TO_PRE_WS2025_BUILD, "", c.BUILD_WS2022, "img", 120
    )
    ours = d.init_container(decision, spec)
    assert ours["resources"]["requests"] == ours["resources"]["limits"]
    # Restrictions copied, identity not: app-user need not exist in our image.
    assert ours["securityContext"] == {
        "runAsNonRoot": True,
        "windowsOptions": {"runAsUserName": "ContainerUser"},
    }


def test_no_duplicate_and_reinvocation_keeps_ours_first() -> None:
    ctx = _ctx()
    pod = _pod(**_pinned(c.BUILD_WS2022))
    once = d.mutated(pod, d.decide(pod, ENROLLED, ctx))
    again = d.decide(once, ENROLLED, ctx)
    assert (again.action, again.reason) == ("none", "AlreadyPresent")
    # Another webhook put its init container ahead of ours.
    once["spec"]["initContainers"].insert(0, {"name": "theirs", "image": "x"})
    reorder = d.decide(once, ENROLLED, ctx)
    assert reorder.action == "reorder"
    fixed = d.mutated(once, reorder)
    assert [ct["name"] for ct in fixed["spec"]["initContainers"]] == [d.CONTAINER_NAME, "theirs"]
    assert len(fixed["spec"]["volumes"]) == 1


_LABELS = st.dictionaries(
    st.sampled_from([c.LABEL_OS, c.LABEL_WINDOWS_BUILD, c.LABEL_HOSTNAME, "pool"]),
    st.sampled_from(["windows", "linux", c.BUILD_WS2022, c.BUILD_WS2025, "win2022-1", "x"]),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    selector=_LABELS,
    os_name=st.sampled_from([None, "windows", "linux"]),
    tolerate=st.booleans(),
    node_name=st.sampled_from([None, "win2022-1", "win2025-1", "linux-amd64-1", "nope"]),
    host_network=st.booleans(),
)
def test_decide_never_raises_and_mutation_is_idempotent(
    selector: dict[str, str],
    os_name: str | None,
    tolerate: bool,
    node_name: str | None,
    host_network: bool,
) -> None:
    spec: dict[str, Any] = {"nodeSelector": selector, "hostNetwork": host_network}
    if os_name:
        spec["os"] = {"name": os_name}
    if tolerate:
        spec["tolerations"] = TOLERATE
    if node_name:
        spec["nodeName"] = node_name
    ctx = _ctx()
    pod = _pod(**spec)
    decision = d.decide(pod, ENROLLED, ctx)
    out = d.mutated(pod, decision)
    assert len(
        [ct for ct in out["spec"].get("initContainers") or [] if ct["name"] == d.CONTAINER_NAME]
    ) == (1 if decision.inject else 0)
    assert d.decide(out, ENROLLED, ctx).action == "none"
    if decision.inject:
        assert os_name != "linux" and not host_network


# -- certificates -----------------------------------------------------------------


def test_generated_material_serves_the_hosts() -> None:
    material = certs.generate(["127.0.0.1", "hook.ns.svc"], NOW)
    assert certs.renewal_reason(material, ["127.0.0.1", "hook.ns.svc"], NOW) is None
    leaf = x509.load_pem_x509_certificate(material.cert)
    ca = x509.load_pem_x509_certificate(material.ca_bundle)
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "hook.ns.svc" in sans.get_values_for_type(x509.DNSName)
    assert b"PRIVATE KEY" in material.serving_pem() and b"CERTIFICATE" in material.serving_pem()


def test_leaf_renewal_keeps_the_ca() -> None:
    material = certs.generate(["127.0.0.1"], NOW)
    later = NOW + timedelta(days=certs.LEAF_DAYS - 10)
    assert certs.renewal_reason(material, ["127.0.0.1"], later) == "the certificate expires soon"
    renewed = certs.renewed(material, ["127.0.0.1"], later)
    assert renewed.ca_bundle == material.ca_bundle  # caBundle unchanged
    assert certs.renewal_reason(renewed, ["127.0.0.1"], later) is None
    assert certs.renewal_reason(material, ["other.svc"], NOW) is not None


def test_ca_rotation_keeps_the_old_ca_in_the_bundle() -> None:
    material = certs.generate(["127.0.0.1"], NOW)
    late = NOW + timedelta(days=certs.CA_DAYS - 100)
    assert certs.renewal_reason(material, ["127.0.0.1"], late) == "the CA expires soon"
    rotated = certs.renewed(material, ["127.0.0.1"], late)
    cas = x509.load_pem_x509_certificates(rotated.ca_bundle)
    assert len(cas) == 2 and cas[1].public_bytes(serialization.Encoding.PEM) == material.ca_bundle
    assert certs.renewal_reason(rotated, ["127.0.0.1"], late) is None


def test_broken_material_is_replaced() -> None:
    material = certs.generate(["127.0.0.1"], NOW)
    other = certs.generate(["127.0.0.1"], NOW)
    mixed = certs.TLSMaterial(material.ca_bundle, material.ca_key, other.cert, other.key)
    assert certs.renewal_reason(mixed, ["127.0.0.1"], NOW) is not None
    with pytest.raises(ValueError, match=r"tls\.key"):
        certs.TLSMaterial.from_data({"tls.crt": b"x", "ca.crt": b"y"})


def test_cert_dir_is_an_alternative_source(tmp_path: Path) -> None:
    material = certs.generate(["127.0.0.1"], NOW)
    for name, data in material.as_data().items():
        if name != certs.KEY_CA_KEY:
            (tmp_path / name).write_bytes(data)
    hook = Webhook(
        ClusterState(),
        cast(Kube, None),  # never called: the folder is the source
        WebhookOptions(url="https://127.0.0.1:9443", cert_dir=str(tmp_path)),
    )
    loaded = hook.load_material()
    assert (loaded.cert, loaded.ca_bundle, loaded.ca_key) == (
        material.cert,
        material.ca_bundle,
        None,
    )
    assert hook.serving_paths() == (tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")


# -- configuration and flags -------------------------------------------------------


def test_configuration_by_url_and_by_service() -> None:
    by_url = WebhookOptions(url="https://127.0.0.1:9443/")
    config = webhook_configuration(by_url.client_config(b"CA"))
    for hook in config["webhooks"]:
        assert hook["clientConfig"] == {
            "url": "https://127.0.0.1:9443/redirection-wait",
            "caBundle": base64.b64encode(b"CA").decode(),
        }
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 5
        assert hook["sideEffects"] == "None" and hook["reinvocationPolicy"] == "IfNeeded"
    by_service = WebhookOptions(service="istio-system/ambient-operator-webhook")
    assert by_service.client_config(b"CA")["service"] == {
        "namespace": "istio-system",
        "name": "ambient-operator-webhook",
        "port": 443,
        "path": "/redirection-wait",
    }
    assert "ambient-operator-webhook.istio-system.svc" in by_service.hosts()
    assert by_url.hosts() == ["127.0.0.1"]
    assert not WebhookOptions().enabled


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "http://127.0.0.1:9443"},
        {"url": "https://127.0.0.1:9443", "service": "a/b"},
        {"service": "no-slash"},
    ],
)
def test_bad_webhook_options_are_refused(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        WebhookOptions(**kwargs)


def test_run_flags() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--webhook-service",
            "ops/hook:8443",
            "--webhook-port",
            "9555",
            "--webhook-cert-dir",
            "/certs",
            "--webhook-namespace",
            "ops",
        ]
    )
    assert (args.webhook_service, args.webhook_port, args.webhook_cert_dir) == (
        "ops/hook:8443",
        9555,
        "/certs",
    )
    assert args.webhook_namespace == "ops" and args.webhook_listen_address == "0.0.0.0"


def test_a_bad_default_registry_is_refused_by_name() -> None:
    # `run` checks --default-registry as spec.images.registry is, before it starts.
    done = subprocess.run(
        [str(ROOT / ".venv/bin/ambient-operator"), "run", "--default-registry", "Reg.Example/UP/"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "ambient-operator run: --default-registry 'Reg.Example/UP/': Value error, "
        "'Reg.Example/UP/' is not a valid image repository (hub)"
    ), done.stderr


# -- misses -----------------------------------------------------------------------


def test_misses_are_judged_by_the_same_decision() -> None:
    state = ClusterState()
    state.namespaces["ns"] = {"labels": ENROLLED}
    ctx = _ctx()
    seen: list[int] = []
    tracker = MissTracker(state, cast(Any, None), lambda: ctx, lambda n, _u: seen.append(n))
    missed = _pod(**_pinned(c.BUILD_WS2022))
    missed["metadata"]["uid"] = "1"
    linux = _pod(nodeSelector={c.LABEL_OS: "linux"})
    linux["metadata"]["name"] = "linux"
    mutated = d.mutated(missed, d.decide(missed, ENROLLED, ctx))
    mutated["metadata"]["name"] = "ok"
    ws2025 = _pod(**_pinned(c.BUILD_WS2025))
    ws2025["metadata"]["name"] = "ws2025"
    for pod in (missed, linux, mutated, ws2025):
        tracker.observe("ADDED", pod)
    assert set(tracker.suspects) == {("ns", "p"), ("ns", "ws2025")}
    assert set(tracker.judge()) == {("ns", "p")}
    tracker.observe("DELETED", missed)
    assert tracker.judge() == {}


def test_pods_bound_to_known_linux_nodes_are_no_suspects() -> None:
    state = ClusterState()
    state.namespaces["ns"] = {"labels": ENROLLED}
    sample = {n["metadata"]["name"]: n for n in yaml.safe_load(SAMPLE_NODES.read_text())["items"]}
    state.nodes["linux-amd64-1"] = sample["linux-amd64-1"]
    state.nodes["win2022-1"] = sample["win2022-1"]
    ctx = _ctx()
    tracker = MissTracker(state, cast(Any, None), lambda: ctx, lambda _n, _u: None)
    for name, node in (
        ("on-linux", "linux-amd64-1"),
        ("on-win", "win2022-1"),
        ("early", "linux-amd64-2"),
    ):
        pod = _pod(nodeName=node, tolerations=TOLERATE)
        pod["metadata"]["name"] = name
        tracker.observe("ADDED", pod)
    # linux-amd64-2 is not known yet: its pod is kept until it is.
    assert set(tracker.suspects) == {("ns", "on-win"), ("ns", "early")}
    assert set(tracker.judge()) == {("ns", "on-win")}
    state.nodes["linux-amd64-2"] = sample["linux-amd64-2"]
    assert set(tracker.judge()) == {("ns", "on-win")}
    assert set(tracker.suspects) == {("ns", "on-win")}
    # Without suspects no context is built at all.
    asked: list[int] = []
    idle = MissTracker(state, cast(Any, None), lambda: asked.append(1) or ctx, lambda _n, _u: None)
    assert idle.judge() == {} and asked == []


class _Posted:
    """An EventRecorder that keeps what was posted."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.said: dict[str, tuple[str, str, str]] = {}

    def post(self, obj: Any, kind_type: str, reason: str, message: str) -> bool:
        self.names.append(obj["metadata"]["name"])
        self.said[obj["metadata"]["name"]] = (kind_type, reason, message)
        return True


def test_withheld_pods_are_misses_told_apart() -> None:
    state = ClusterState()
    state.namespaces["ns"] = {"labels": ENROLLED}
    bare = _bare()
    ctx = bare
    counts: list[tuple[int, int]] = []
    posted = _Posted()
    tracker = MissTracker(state, cast(Any, posted), lambda: ctx, lambda n, u: counts.append((n, u)))
    # Admitted by the webhook without the init container: its annotation says why.
    withheld = _pod(**WIN)
    withheld = d.mutated(withheld, d.decide(withheld, ENROLLED, bare))
    withheld["metadata"] |= {"name": "withheld", "uid": "u1"}
    # Admitted while the webhook did not answer: no annotation.
    unanswered = _pod(**_pinned(c.BUILD_WS2022))
    unanswered["metadata"] |= {"name": "unanswered", "uid": "u2"}
    # Given the init container: no miss.
    given = _pod(**_pinned(c.BUILD_WS2022))
    given = d.mutated(given, d.decide(given, ENROLLED, bare))
    given["metadata"] |= {"name": "given", "uid": "u3"}
    for pod in (withheld, unanswered, given):
        tracker.observe("ADDED", pod)
    assert set(tracker.suspects) == {("ns", "withheld"), ("ns", "unanswered")}
    asyncio.run(tracker.check())
    assert counts == [(2, 1)]
    assert {n: said[:2] for n, said in posted.said.items()} == {
        "withheld": ("Warning", "RedirectionWaitImageUnavailable"),
        "unanswered": ("Warning", "RedirectionWaitMissing"),
    }
    message = posted.said["withheld"][2]
    for fragment in (
        "(ImageUnavailable)",
        "bypasses ztunnel",
        "`make images REGISTRY=<registry>`",
        "set spec.images.registry",
    ):
        assert fragment in message, message
    # Once a registry is set the webhook would inject; the pod still lacks the init
    # container, for want of the image when it was admitted.
    ctx = _ctx()
    asyncio.run(tracker.check())
    assert counts[-1] == (2, 1)


def test_misses_are_told_twenty_a_pass_and_counted_at_once() -> None:
    state = ClusterState()
    state.namespaces["ns"] = {"labels": ENROLLED}
    ctx = _ctx()
    counts: list[int] = []
    posted = _Posted()
    tracker = MissTracker(state, cast(Any, posted), lambda: ctx, lambda n, _u: counts.append(n))
    for i in range(45):
        pod = _pod(**_pinned(c.BUILD_WS2022))
        pod["metadata"] |= {"name": f"p{i:02d}", "uid": f"u{i}"}
        tracker.observe("ADDED", pod)

    async def passes(n: int) -> None:
        for _ in range(n):
            state.trigger.clear()
            state.urgent = False
            await tracker.check()

    asyncio.run(passes(1))
    assert counts == [45] and len(posted.names) == 20
    assert state.trigger.is_set() and state.urgent  # the count changed: news
    asyncio.run(passes(1))
    assert len(posted.names) == 40
    assert state.trigger.is_set() and not state.urgent  # only Events left to post
    asyncio.run(passes(2))
    assert counts == [45, 45, 45, 45] and len(posted.names) == 45
    assert sorted(posted.names) == [f"p{i:02d}" for i in range(45)]
    assert not state.trigger.is_set()  # nothing left: no pass asked for


@pytest.mark.parametrize(
    "spec",
    [
        _pinned(c.BUILD_WS2022),
        {**_pinned(c.BUILD_WS2022), "initContainers": [{"name": "setup", "image": "s"}]},
        {**_pinned(c.BUILD_WS2022), "volumes": [{"name": "data", "emptyDir": {}}]},
    ],
)
@pytest.mark.parametrize("annotations", [None, {}, {"a/b": "c"}])
def test_json_patch_does_what_mutate_does(
    spec: dict[str, Any], annotations: dict[str, str] | None
) -> None:
    pod = _pod(**spec)
    if annotations is None:
        del pod["metadata"]["annotations"]
    else:
        pod["metadata"]["annotations"] = annotations
    decision = d.decide(pod, ENROLLED, _ctx())
    assert decision.inject
    assert jsonpatch.apply_patch(pod, d.json_patch(pod, decision)) == d.mutated(pod, decision)
    pod["spec"]["initContainers"] = [{"name": "x"}, {"name": d.CONTAINER_NAME}]
    pod["metadata"]["annotations"] = {d.ANNOTATION: decision.annotation()}
    reorder = d.decide(pod, ENROLLED, _ctx())
    assert jsonpatch.apply_patch(pod, d.json_patch(pod, reorder)) == d.mutated(pod, reorder)


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        (None, ["mirror", "corp"]),
        ([], ["mirror", "corp"]),
        ([{"name": "mirror"}], ["mirror", "corp"]),
        ([{"name": "other"}], ["other", "mirror", "corp"]),
    ],
)
def test_json_patch_adds_the_pull_secrets_mutate_adds(
    listed: list[dict[str, str]] | None, expected: list[str]
) -> None:
    pod = _pod(**_pinned(c.BUILD_WS2022))
    if listed is not None:
        pod["spec"]["imagePullSecrets"] = listed
    ctx = _ctx(
        images={"pullPolicy": "Always"},
        newPodWorkaround={"pullSecrets": ["mirror", "corp"]},
    )
    decision = d.decide(pod, ENROLLED, ctx)
    assert decision.inject
    after = d.mutated(pod, decision)
    assert jsonpatch.apply_patch(pod, d.json_patch(pod, decision)) == after
    # The pod's own first, each secret once, then the spec's in its order.
    assert [s["name"] for s in after["spec"]["imagePullSecrets"]] == expected
    assert after["spec"]["initContainers"][0]["imagePullPolicy"] == "Always"


def test_the_init_container_keeps_if_not_present_and_adds_no_secret_by_default() -> None:
    pod = _pod(**_pinned(c.BUILD_WS2022))
    after = d.mutated(pod, d.decide(pod, ENROLLED, _ctx()))
    assert after["spec"]["initContainers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert "imagePullSecrets" not in after["spec"]


def _review(pod: dict[str, Any], **request: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "operation": "CREATE",
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns",
            "object": pod,
            **request,
        },
    }


def test_review_allows_always_and_patches_only_when_needed() -> None:
    state = ClusterState()
    state.nodes = {
        n.name: {"metadata": {"name": n.name, "labels": dict(n.labels)}} for n in _nodes()
    }
    for name, node in state.nodes.items():
        if name.startswith("win"):
            node["spec"] = {"taints": [{"key": "os", "value": "windows", "effect": "NoSchedule"}]}
    state.mesh = _mesh()
    state.namespaces["ns"] = {"labels": ENROLLED}
    hook = Webhook(state, cast(Kube, None), WebhookOptions(url="https://127.0.0.1:9443"))
    pod = _pod(**_pinned(c.BUILD_WS2022))
    out = hook.review(_review(pod))
    assert out["response"]["uid"] == "u-1" and out["response"]["allowed"] is True
    ops = json.loads(base64.b64decode(out["response"]["patch"]))
    assert jsonpatch.apply_patch(pod, ops)["spec"]["initContainers"][0]["name"] == d.CONTAINER_NAME
    linux = hook.review(_review(_pod(nodeSelector={c.LABEL_OS: "linux"})))
    assert linux["response"] == {"uid": "u-1", "allowed": True}
    update = hook.review(_review(pod, operation="UPDATE"))
    assert "patch" not in update["response"]
    # A broken object is admitted unchanged, never denied, and the sender is told.
    broken = hook.review(_review(cast(Any, {"spec": {"nodeSelector": "not-a-map"}})))
    assert broken["response"] == {
        "uid": "u-1",
        "allowed": True,
        "warnings": [
            "ambient-operator redirection-wait webhook: MalformedPod: spec.nodeSelector is "
            "a string, not an object; the pod is admitted unchanged"
        ],
    }


def _post(port: int, ca: bytes, review: dict[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=ca.decode())
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        conn.request(
            "POST",
            "/redirection-wait",
            body=json.dumps(review),
            headers={"Content-Type": "application/json"},
        )
        out: dict[str, Any] = json.loads(conn.getresponse().read())
        return out
    finally:
        conn.close()


def test_server_rotates_certificates_without_restarting(tmp_path: Path) -> None:
    first, second = (certs.generate(["127.0.0.1"], datetime.now(UTC)) for _ in range(2))
    for name, material in (("a", first), ("b", second)):
        (tmp_path / f"{name}.pem").write_bytes(material.serving_pem())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    answer = {"kind": "AdmissionReview", "response": {"uid": "u", "allowed": True}}
    server = AdmissionServer(lambda review: answer, "127.0.0.1", port)
    server.set_certificate(tmp_path / "a.pem", tmp_path / "a.pem")
    server.start()
    try:
        assert _post(port, first.ca_bundle, _review(_pod())) == answer
        server.set_certificate(tmp_path / "b.pem", tmp_path / "b.pem")
        assert _post(port, second.ca_bundle, _review(_pod())) == answer
        with pytest.raises(ssl.SSLError):
            _post(port, first.ca_bundle, _review(_pod()))
    finally:
        server.stop()
