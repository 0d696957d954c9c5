"""Status names the root cause first, and each cause once (status/components.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from ambient_operator.api.conditions import MeshReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.cluster.state import ClusterState
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.render import render_dataplane
from ambient_operator.render.model import NodeVerdict, RenderResult
from ambient_operator.status.components import ApplyOutcome, degraded_verdict, mesh_problems

SPEC = AmbientMeshSpec.model_validate(
    {
        "images": {
            # The redirection-wait image's registry; the agents' images set in full.
            "registry": "registry.example.com/ambient",
            "ztunnel": {"windows": "registry.example.com/ztunnel-windows:1"},
            "istioCni": {"windows": "registry.example.com/install-cni-windows:1"},
        }
    }
)
ISTIOD_SERVICE = {("istio-system", "istiod")}
WS2019 = NodeVerdict(
    "win2019-1", "windows", "10.0.17763", False, "WindowsBuildUnsupported", "too old"
)
ZTUNNEL_WINDOWS_ACCOUNT = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {
        "name": "ztunnel-windows",
        "namespace": "istio-system",
        "labels": {"app.kubernetes.io/component": "ztunnel"},
    },
}
ISTIOD_TRUSTING_LINUX_ONLY = {
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "discovery",
                        "env": [
                            {"name": "CA_TRUSTED_NODE_ACCOUNTS", "value": "istio-system/ztunnel"}
                        ],
                    }
                ]
            }
        }
    }
}
DNS_WARNING = "cluster DNS Service IP unknown: Windows nodes get no rule"


def _node(name: str, os_name: str, build: str | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/os": os_name, "kubernetes.io/arch": "amd64"}
    info = {"operatingSystem": os_name, "architecture": "amd64", "kernelVersion": "6.8.0"}
    if build is not None:
        labels["node.kubernetes.io/windows-build"] = build
        info["kernelVersion"] = f"{build}.1"
    return {"metadata": {"name": name, "labels": labels}, "status": {"nodeInfo": info}}


def test_the_most_severe_problem_names_the_reason() -> None:
    result = RenderResult(
        objects=(ZTUNNEL_WINDOWS_ACCOUNT,),
        verdicts=(WS2019,),
        daemonsets=(),
        warnings=(DNS_WARNING, DNS_WARNING),
    )
    problems = mesh_problems(SPEC, result, set(), ISTIOD_TRUSTING_LINUX_ONLY)
    assert [(p.reason, p.message) for p in problems] == [
        ("IstiodNotFound", "Service istio-system/istiod not found; agents cannot reach istiod"),
        (
            "IstiodTrustMissing",
            "istiod's CA_TRUSTED_NODE_ACCOUNTS (istio-system/ztunnel) lacks "
            "istio-system/ztunnel-windows; those ztunnels cannot get certificates for their "
            "pods. Set the istiod chart value "
            "env.CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,istio-system/ztunnel-windows "
            "(helm upgrade ... --reuse-values --set-string "
            "env.CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel\\,istio-system/ztunnel-windows)",
        ),
        (
            "UnsupportedNodes",
            "1 node(s) get no ambient agent: win2019-1 (WindowsBuildUnsupported: too old)",
        ),
        # Told once, however many times the render said it.
        ("RenderWarning", DNS_WARNING),
    ]
    # Without istiod's problems, unsupported nodes come before render warnings.
    later = mesh_problems(SPEC, result, ISTIOD_SERVICE, None)
    assert [p.reason for p in later] == ["UnsupportedNodes", "RenderWarning"]


def test_a_missing_istiod_is_said_once_beside_unsupported_nodes() -> None:
    nodes = [
        _node("linux-1", "linux"),
        _node("win2019-1", "windows", "10.0.17763"),
        _node("win2022-1", "windows", "10.0.20348"),
    ]
    # No istiod Service, so no istiod IP: the render falls back for the Windows
    # agents and warns, which is the missing Service over again.
    result = render_dataplane(SPEC, ClusterFacts.from_nodes(nodes, dns_ip="10.96.0.10"))
    verdict = degraded_verdict(mesh_problems(SPEC, result, set(), None))
    assert (verdict.status, verdict.reason) == ("True", "IstiodNotFound")
    assert verdict.message.startswith(
        "Service istio-system/istiod not found; agents cannot reach istiod; "
        "1 node(s) get no ambient agent: win2019-1 (WindowsBuildUnsupported: "
    )
    assert verdict.message.count("istio-system/istiod") == 1
    assert "istiod Service IP unknown" not in verdict.message
    # With the Service there but its IP unknown (headless), the warning is the news.
    problems = mesh_problems(SPEC, result, ISTIOD_SERVICE, None)
    assert [p.reason for p in problems] == ["UnsupportedNodes", "RenderWarning"]
    assert problems[1].message.startswith(
        "istiod Service IP unknown (istio-system/istiod not found or headless)"
    )


def test_one_cause_for_every_write_is_said_once() -> None:
    outcome = ApplyOutcome()
    objects = [
        "ServiceAccount istio-system/istio-cni",
        "ServiceAccount istio-system/ztunnel",
        "ServiceAccount istio-system/ztunnel-windows",
        "ConfigMap istio-system/istio-cni-config",
        "ConfigMap istio-system/istio-cni-config-windows-ltsc2022",
        "ConfigMap istio-system/istio-cni-config-windows-ltsc2025",
        "DaemonSet istio-system/istio-cni-node",
        "DaemonSet istio-system/ztunnel",
        "DaemonSet istio-system/istio-cni-node-windows-ltsc2022",
        "DaemonSet istio-system/ztunnel-windows-ltsc2022",
        "DaemonSet istio-system/istio-cni-node-windows-ltsc2025",
        "DaemonSet istio-system/ztunnel-windows-ltsc2025",
    ]
    for what in objects:
        outcome.failed(what, 'namespaces "istio-system" not found')
    verdict = outcome.verdict(12)
    assert (verdict.status, verdict.reason) == ("False", "ApplyFailed")
    assert verdict.message == (
        'namespaces "istio-system" not found (12 objects: ServiceAccount istio-system/istio-cni, '
        "ServiceAccount istio-system/ztunnel, ServiceAccount istio-system/ztunnel-windows and "
        "9 more); nothing was pruned"
    )


def test_causes_are_grouped_in_the_order_they_came() -> None:
    webhook = 'Internal error occurred: failed calling webhook "policy.example.com": timeout'
    outcome = ApplyOutcome()
    outcome.failed("ConfigMap istio-system/istio-cni-config", webhook)
    outcome.failed("DaemonSet istio-system/ztunnel", 'daemonsets.apps "ztunnel" is forbidden')
    outcome.failed("DaemonSet istio-system/istio-cni-node", webhook)
    assert outcome.verdict(3).message == (
        f"{webhook} (2 objects: ConfigMap istio-system/istio-cni-config, DaemonSet "
        "istio-system/istio-cni-node); DaemonSet istio-system/ztunnel: "
        'daemonsets.apps "ztunnel" is forbidden; nothing was pruned'
    )
    # Beside a name conflict the errors are grouped too.
    outcome.conflicts.append("ServiceAccount istio-system/ztunnel is Helm's")
    verdict = outcome.verdict(3)
    assert verdict.reason == "NameConflict"
    assert verdict.message.startswith(
        f"ServiceAccount istio-system/ztunnel is Helm's; {webhook} (2 objects: "
    )


def test_one_failure_reads_as_before() -> None:
    outcome = ApplyOutcome()
    outcome.failed("prune DaemonSet istio-system/ztunnel-old", "etcdserver: request timed out")
    assert outcome.verdict(1).message == (
        "prune DaemonSet istio-system/ztunnel-old: etcdserver: request timed out; "
        "nothing was pruned"
    )


class _NoNamespaces:
    """A Kube whose every GET finds nothing."""

    def get(self, kind: object, name: str, namespace: str | None = None) -> None:
        return None


def test_a_missing_spec_namespace_is_one_refusal_before_any_write() -> None:
    # The pass stops here (controllers/dataplane.py), so Reconciled carries this
    # one message and no write is tried that could fail once per object.
    controller = DataplaneController(ClusterState(), _NoNamespaces(), None)  # type: ignore[arg-type]
    owner = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "uid-1")
    refusal = asyncio.run(controller.namespace_refusal("istio-sytem", controller.ours(owner)))
    assert refusal == (
        MeshReason.NAMESPACE_NOT_FOUND,
        "Namespace istio-sytem (spec.namespace) does not exist; nothing was changed and none "
        "was created. Create the namespace",
    )
