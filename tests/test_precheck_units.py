"""precheck's judgement, offline: literal snapshots, the level and words each check gives.

The live command (reading a cluster, its exit code, its JSON) is
tests/test_precheck.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ambient_operator.api.v1alpha1 import AmbientMeshSpec, AsIsDaemonSet, HeldTemplates
from ambient_operator.cli import precheck as pc
from ambient_operator.cli.main import build_parser
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.helm_releases import HelmRelease, ReleaseObject
from ambient_operator.status import precheck as p

WS2019, WS2022 = "10.0.17763", "10.0.20348"


def _node(name: str, os_name: str, build: str | None = None, arch: str = "amd64") -> dict[str, Any]:
    labels = {"kubernetes.io/os": os_name, "kubernetes.io/arch": arch}
    if build:
        labels["node.kubernetes.io/windows-build"] = build
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"nodeInfo": {"operatingSystem": os_name, "architecture": arch}},
    }


def _istiod(env: dict[str, str], image: str = "docker.io/istio/pilot:1.31.0") -> dict[str, Any]:
    return {
        "metadata": {"name": "istiod", "namespace": "istio-system"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "discovery",
                            "image": image,
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                        }
                    ]
                }
            }
        },
    }


HEALTHY_ENV = {
    "PILOT_ENABLE_AMBIENT": "true",
    "CA_TRUSTED_NODE_ACCOUNTS": "istio-system/ztunnel,istio-system/ztunnel-windows",
}
GATEWAY_CRDS = {
    name: {
        "metadata": {
            "name": name,
            "annotations": {
                "gateway.networking.k8s.io/bundle-version": "v1.6.1",
                "gateway.networking.k8s.io/channel": "standard",
            },
        }
    }
    for name in ("gatewayclasses.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io")
}


CHART_REGISTRY = "registry.example.com:5000/ambient"


def _snapshot(**changes: Any) -> p.Snapshot:
    base: dict[str, Any] = dict(
        kube_version=(1, 34),
        kube_version_text="v1.34.2",
        nodes=[_node("linux-1", "linux"), _node("win-2022", "windows", WS2022)],
        spec=AmbientMeshSpec(),
        mesh_installed=True,
        istiod_service=True,
        istiod=_istiod(HEALTHY_ENV),
        crds=GATEWAY_CRDS,
        daemonsets=[],
        namespaces={"apps": {"istio.io/dataplane-mode": "ambient"}},
        waypoints={},
        windows_misses=[],
        webhook=p.Webhook(
            configured=True, service="ambient-operator/ambient-operator", ready_endpoints=1
        ),
        # The chart's value registry, read off the operator's --default-registry.
        default_registry=CHART_REGISTRY,
    )
    base.update(changes)
    return p.Snapshot(**base)


def _levels(findings: list[p.Finding]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f.level)
    return out


def test_a_healthy_cluster_blocks_nothing() -> None:
    findings = p.judge(_snapshot())
    assert _levels(findings) == {
        "kubernetes": ["ok"],
        "nodes": ["info", "ok"],
        "platform": ["info"],
        "istiod": ["ok"],
        "ambient-enabled": ["ok"],
        "node-trust": ["ok"],
        "multi-cluster": ["ok"],
        # istiod 1.31.0, followed by the agents (no tag set); 1.31.1 is known.
        "version-skew": ["warning"],
        "gateway-api": ["ok"],
        "upstream-agents": ["ok"],
        "helm-releases": ["ok"],
        "revisions": ["ok"],
        "held-templates": ["ok"],
        "namespace-labels": ["ok"],
        "windows-pods": ["ok"],
        "bundled-images": ["ok"],
        "webhook": ["ok"],
    }
    assert not p.blocked(findings)
    by_check = {f.check: f for f in findings if f.level != "info"}
    assert by_check["istiod"].message == (
        "istiod istio-system/istiod 1.31.0 (docker.io/istio/pilot:1.31.0)"
    )
    assert by_check["gateway-api"].message == "Gateway API v1.6.1 (standard)"
    assert by_check["nodes"].message == "2 node(s) can run the agents"
    inventory = next(f for f in findings if f.check == "nodes" and f.level == "info")
    assert inventory.items == (
        "linux/amd64: 1 node(s)",
        "windows/amd64 Windows Server 2022 (10.0.20348): 1 node(s)",
    )


def _only(findings: list[p.Finding], check: str, level: str) -> p.Finding:
    found = [f for f in findings if f.check == check and f.level == level]
    assert len(found) == 1, findings
    return found[0]


def test_no_istiod_blocks_and_its_checks_are_skipped() -> None:
    findings = p.judge(_snapshot(istiod_service=False, istiod=None))
    assert p.blocked(findings)
    blocking = _only(findings, "istiod", "blocking")
    assert "Service istio-system/istiod not found" in blocking.message
    assert "--set profile=ambient" in blocking.message
    for check in ("ambient-enabled", "node-trust", "version-skew"):
        assert _only(findings, check, "info").message == "not checked: no istiod Deployment"


def test_istiod_without_ambient_blocks() -> None:
    env = {k: v for k, v in HEALTHY_ENV.items() if k != "PILOT_ENABLE_AMBIENT"}
    finding = _only(p.judge(_snapshot(istiod=_istiod(env))), "ambient-enabled", "blocking")
    assert "PILOT_ENABLE_AMBIENT is not set" in finding.message


def test_untrusted_windows_ztunnel_blocks_with_the_helm_value() -> None:
    env = {**HEALTHY_ENV, "CA_TRUSTED_NODE_ACCOUNTS": "istio-system/ztunnel"}
    finding = _only(p.judge(_snapshot(istiod=_istiod(env))), "node-trust", "blocking")
    assert finding.items == ("istio-system/ztunnel-windows",)
    assert "env.CA_TRUSTED_NODE_ACCOUNTS=istio-system/ztunnel,istio-system/ztunnel-windows" in (
        finding.message
    )
    # Without Windows nodes there is no Windows account to trust.
    linux_only = _snapshot(istiod=_istiod(env), nodes=[_node("linux-1", "linux")])
    assert _only(p.judge(linux_only), "node-trust", "ok")


@pytest.mark.parametrize(
    ("istiod_env", "mesh", "namespace_labels", "levels"),
    [
        ({}, {}, {}, ["ok"]),
        ({"CLUSTER_ID": "Kubernetes"}, {}, {}, ["ok"]),
        ({"CLUSTER_ID": "west"}, {"multiCluster": {"clusterName": "west"}}, {}, ["ok"]),
        ({"CLUSTER_ID": "west"}, {}, {}, ["blocking"]),
        ({}, {"multiCluster": {"clusterName": "west"}}, {}, ["blocking"]),
        ({}, {"network": "n1"}, {"topology.istio.io/network": "n1"}, ["ok"]),
        ({}, {"network": "n1"}, {}, ["warning"]),
        ({}, {}, {"topology.istio.io/network": "n1"}, ["warning"]),
        ({"CLUSTER_ID": "east"}, {"network": "n1"}, {}, ["blocking", "warning"]),
    ],
)
def test_multi_cluster_identity(
    istiod_env: dict[str, str],
    mesh: dict[str, Any],
    namespace_labels: dict[str, str],
    levels: list[str],
) -> None:
    snap = _snapshot(
        istiod=_istiod({**HEALTHY_ENV, **istiod_env}),
        spec=AmbientMeshSpec.model_validate(mesh),
        namespaces={
            "apps": {"istio.io/dataplane-mode": "ambient"},
            "istio-system": namespace_labels,
        },
    )
    findings = [f for f in p.judge(snap) if f.check == "multi-cluster"]
    assert [f.level for f in findings] == levels
    if "blocking" in levels:
        blocking = next(f for f in findings if f.level == "blocking")
        assert "Set spec.multiCluster.clusterName to " + istiod_env.get(
            "CLUSTER_ID", "Kubernetes"
        ) in (blocking.message)


@pytest.mark.parametrize(
    ("istiod_tag", "agents_tag", "level"),
    [
        ("1.30.7", "1.30.7", "ok"),
        # An older patch of istiod's minor than the newest known (1.30.7): a warning.
        ("1.30.4", "1.30.4", "warning"),
        ("1.31.0", "1.30.4", "ok"),  # istiod one minor ahead
        ("1.32.0", "1.30.4", "blocking"),  # two ahead
        ("1.29.3", "1.30.4", "blocking"),  # agents newer than istiod
    ],
)
def test_version_skew(istiod_tag: str, agents_tag: str, level: str) -> None:
    snap = _snapshot(
        istiod=_istiod(HEALTHY_ENV, f"docker.io/istio/pilot:{istiod_tag}"),
        spec=AmbientMeshSpec.model_validate({"images": {"tag": agents_tag}}),
    )
    assert _only(p.judge(snap), "version-skew", level)


def test_an_older_patch_warns_with_the_newest_and_what_it_fixes() -> None:
    snap = _snapshot(
        istiod=_istiod(HEALTHY_ENV, "docker.io/istio/pilot:1.30.4"),
        spec=AmbientMeshSpec.model_validate({"images": {"tag": "1.30.4"}}),
    )
    finding = _only(p.judge(snap), "version-skew", "warning")
    assert finding.message == (
        "istiod 1.30.4 serves agents at 1.30.4; the newest patch of 1.30 this operator knows "
        "is 1.30.7: run the agents at istiod's minor, newest patch (docs/versions.md)"
    )
    assert finding.items[0] == (
        "1.30.5: istio-cni's iptables backend could flip across restarts: duplicate rules (#61020)"
    )


def test_an_unset_tag_follows_istiod() -> None:
    istiod = _istiod(HEALTHY_ENV, "docker.io/istio/pilot:1.30.7")
    istiod["status"] = {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    snap = _snapshot(istiod=istiod)
    finding = _only(p.judge(snap), "version-skew", "ok")
    assert finding.message == "istiod 1.30.7 serves agents at 1.30.7 (follows istiod 1.30.7)"


def test_unsupported_windows_build_warns_by_name() -> None:
    nodes = [_node("linux-1", "linux"), _node("win-2019", "windows", WS2019)]
    finding = _only(p.judge(_snapshot(nodes=nodes)), "nodes", "warning")
    assert finding.message == ("1 node(s) can never run the agents; pods there are not in the mesh")
    assert len(finding.items) == 1
    assert finding.items[0].startswith("win-2019: WindowsBuildUnsupported: Windows Server 2019")


def test_no_node_for_the_agents_blocks() -> None:
    nodes = [_node("win-2019", "windows", WS2019), _node("s390", "linux", arch="s390x")]
    finding = _only(p.judge(_snapshot(nodes=nodes)), "nodes", "blocking")
    assert finding.message == "no node can run the ambient agents"
    assert [item.split(":")[0] for item in finding.items] == ["s390", "win-2019"]


def test_upstream_ztunnel_blocks() -> None:
    upstream = {
        "metadata": {
            "name": "ztunnel",
            "namespace": "istio-system",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "ztunnel"},
        },
        "spec": {"template": {"metadata": {"labels": {"app": "ztunnel"}}}},
    }
    ours = {
        "metadata": {
            "name": "ztunnel",
            "namespace": "istio-system",
            "labels": {"app.kubernetes.io/managed-by": "ambient-operator"},
        },
        "spec": {"template": {"metadata": {"labels": {"app": "ztunnel"}}}},
    }
    assert _only(p.judge(_snapshot(daemonsets=[ours])), "upstream-agents", "ok")
    finding = _only(p.judge(_snapshot(daemonsets=[upstream, ours])), "upstream-agents", "blocking")
    assert finding.items == ("istio-system/ztunnel: ztunnel, managed by Helm release ztunnel",)


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"data-plane-mode": "ambient"}, "MisspelledDataplaneMode"),
        ({"istio.io/dataplane-mode": "ambient", "istio-injection": "enabled"}, "SidecarAndAmbient"),
        (
            {"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "true"},
            "WaypointNameExpected",
        ),
    ],
)
def test_namespace_labels_warn(labels: dict[str, str], reason: str) -> None:
    finding = _only(p.judge(_snapshot(namespaces={"talk": labels})), "namespace-labels", "warning")
    assert [item.split(": ")[:2] for item in finding.items] == [["talk", reason]]


def test_gateway_api_missing_or_old_warns() -> None:
    missing = _only(p.judge(_snapshot(crds={})), "gateway-api", "warning")
    assert "L4 ambient works" in missing.message
    old = {
        name: {"metadata": {"annotations": {"gateway.networking.k8s.io/bundle-version": "v1.2.0"}}}
        for name in GATEWAY_CRDS
    }
    assert (
        "older than v1.4" in _only(p.judge(_snapshot(crds=old)), "gateway-api", "warning").message
    )


@pytest.mark.parametrize(
    ("version", "level"),
    [
        ((1, 29), "blocking"),
        ((1, 30), "ok"),
        ((1, 37), "ok"),
        ((1, 38), "warning"),
        (None, "warning"),
    ],
)
def test_kubernetes_version(version: tuple[int, int] | None, level: str) -> None:
    assert _only(p.judge(_snapshot(kube_version=version)), "kubernetes", level)


def test_webhook() -> None:
    none = p.Webhook()
    assert _only(p.judge(_snapshot(webhook=none, mesh_installed=False)), "webhook", "info")
    assert _only(p.judge(_snapshot(webhook=none)), "webhook", "warning")
    down = p.Webhook(configured=True, service="ops/ambient-operator", ready_endpoints=0)
    assert (
        "no ready endpoint" in _only(p.judge(_snapshot(webhook=down)), "webhook", "warning").message
    )


def test_windows_pods_without_the_workaround_warn() -> None:
    misses = ["apps/web-0: needs the init container"]
    finding = _only(p.judge(_snapshot(windows_misses=misses)), "windows-pods", "warning")
    assert finding.items == tuple(misses)


def test_bundled_images_say_what_to_build_and_set() -> None:
    healthy = _only(p.judge(_snapshot()), "bundled-images", "ok")
    assert healthy.message == (
        "the Windows agents and the redirection-wait image come from spec.images.registry "
        "registry.example.com:5000/ambient"
    )
    # No registry anywhere: both agents and the redirection-wait image are named.
    bare = _only(p.judge(_snapshot(default_registry=None)), "bundled-images", "warning")
    assert bare.message.startswith("3 image(s) the Windows nodes need are unset or placeholders")
    assert "`make images REGISTRY=<registry>` builds and pushes them" in bare.message
    assert [item.split(":")[0] for item in bare.items] == [
        "spec.images.ztunnel.windows is unset, and so is spec.images.registry",
        "spec.images.istioCni.windows is unset, and so is spec.images.registry",
        "spec.newPodWorkaround.multiBuildImage is unset, and so is spec.images.registry",
    ]
    assert all("`make images REGISTRY=<registry>`" in item for item in bare.items)
    assert "docker.io/istio/ztunnel-windows:1.31.0, which Istio does not publish" in bare.items[0]
    assert "(ImageUnavailable)" in bare.items[2]
    # The spec's own registry; a placeholder under Istio's hub is still named.
    spec = AmbientMeshSpec.model_validate(
        {
            "images": {
                "registry": "mine.example.com/amb",
                "ztunnel": {"windows": "docker.io/istio/ztunnel-windows:1.30.0"},
            }
        }
    )
    placeholder = _only(p.judge(_snapshot(spec=spec)), "bundled-images", "warning")
    assert placeholder.items == (
        "ztunnel on Windows Server 2022 (build 10.0.20348) uses "
        "docker.io/istio/ztunnel-windows:1.30.0, a placeholder: Istio does not publish Windows "
        "images under docker.io/istio. Build it with `make images REGISTRY=<registry>` "
        "(docs/images.md), then set spec.images.registry (or the chart's value registry) to "
        "that registry, or set spec.images.ztunnel.windows to an image of your own",
    )
    linux_only = _snapshot(nodes=[_node("linux-1", "linux")], default_registry=None)
    assert _only(p.judge(linux_only), "bundled-images", "info").message == (
        "no Windows node gets the agents: none needed"
    )


class _Deployments:
    """A Reader that knows one Deployment, as the chart renders the operator's."""

    def __init__(self, container: dict[str, Any]) -> None:
        self.container = container
        self.asked: list[tuple[str, str | None]] = []

    def get(self, kind: Any, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.asked.append((name, namespace))
        if (kind.kind, name, namespace) != ("Deployment", "ambient-operator", "ops"):
            return None
        return {"spec": {"template": {"spec": {"containers": [self.container]}}}}


@pytest.mark.parametrize(
    ("container", "found"),
    [
        ({"args": ["run", "--default-registry=r.example:5000/amb"]}, "r.example:5000/amb"),
        (
            {"env": [{"name": "AMBIENT_OPERATOR_DEFAULT_REGISTRY", "value": "r.example/env"}]},
            "r.example/env",
        ),
        ({"args": ["run", "--cni-rbac=chart"]}, None),
    ],
)
def test_precheck_reads_the_operators_default_registry(
    container: dict[str, Any], found: str | None
) -> None:
    # The Deployment the webhook's Service is named after: the chart names both alike.
    read = _Deployments(container)
    hook = p.Webhook(configured=True, service="ops/ambient-operator", ready_endpoints=1)
    assert pc._default_registry(cast(Any, read), hook) == found
    assert read.asked == [("ambient-operator", "ops")]
    # A webhook called by URL names no Service: nothing to read.
    by_url = _Deployments(container)
    by_url_hook = p.Webhook(configured=True, url="https://x")
    assert pc._default_registry(cast(Any, by_url), by_url_hook) is None
    assert by_url.asked == []


def test_every_check_says_when_it_blocks_and_warns() -> None:
    assert [check.name for check in p.CHECKS] == [
        "kubernetes",
        "nodes",
        "platform",
        "istiod",
        "ambient-enabled",
        "node-trust",
        "multi-cluster",
        "version-skew",
        "gateway-api",
        "upstream-agents",
        "helm-releases",
        "revisions",
        "held-templates",
        "namespace-labels",
        "windows-pods",
        "bundled-images",
        "webhook",
    ]
    assert all(check.what and check.blocks and check.warns for check in p.CHECKS)


def test_the_command_is_registered() -> None:
    args = build_parser().parse_args(["precheck", "-o", "json"])
    assert args.output == "json"


def test_the_docs_table_is_the_checks_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "precheck.md").read_text()
    for check in p.CHECKS:
        row = f"| `{check.name}` | {check.what} | {check.blocks} | {check.warns} |"
        assert row in page, row


def _pod(namespace: str, name: str, node: str, init: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "os": {"name": "windows"},
        "containers": [{"name": "app", "image": "example.com/app:1"}],
    }
    if init:
        spec["initContainers"] = [{"name": n, "image": "example.com/init:1"} for n in init]
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec, "status": {}}


@pytest.mark.parametrize("workaround", [True, False])
def test_windows_pods_missing_the_workaround_are_the_webhooks_decision(workaround: bool) -> None:
    nodes = [
        NodeFacts.from_node(_node("win-2022", "windows", WS2022)),
        NodeFacts.from_node(_node("win-2025", "windows", "10.0.26100")),
    ]
    namespaces = {"apps": {"istio.io/dataplane-mode": "ambient"}, "plain": {}}
    pods = [
        _pod("apps", "exposed", "win-2022"),
        _pod("apps", "covered", "win-2022", init=["ambient-redirection-wait"]),
        _pod("apps", "ws2025", "win-2025"),
        _pod("plain", "not-enrolled", "win-2022"),
    ]
    mesh = {"metadata": {"name": "default"}, "spec": {"newPodWorkaround": {"enabled": workaround}}}
    assert pc.windows_misses(pods, namespaces, mesh, nodes, {}) == [
        "apps/exposed: ScheduledOnPreWS2025Node: bound to node win-2022 (build 10.0.20348)"
    ]
    # Before installing: the defaults decide.
    assert len(pc.windows_misses(pods, namespaces, None, nodes, {})) == 1


# -- helm-releases: what spec.adopt would do ---------------------------------------------------

_HELM_META = {
    "labels": {"app.kubernetes.io/managed-by": "Helm", "app": "ztunnel"},
    "annotations": {
        "meta.helm.sh/release-name": "ztunnel",
        "meta.helm.sh/release-namespace": "istio-system",
    },
}


def _helm_ztunnel(pods: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "ztunnel", "namespace": "istio-system", "uid": "h1", **_HELM_META},
        "spec": {
            "selector": {"matchLabels": {"app": "ztunnel"}},
            "template": {"metadata": {"labels": {"app": "ztunnel"}}, "spec": {}},
        },
        "status": {"currentNumberScheduled": pods},
    }


def _helm_snapshot(spec: AmbientMeshSpec, *extra: Any) -> p.Snapshot:
    ds = _helm_ztunnel()
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "ztunnel", "namespace": "istio-system", "uid": "h2", **_HELM_META},
    }
    release = HelmRelease(
        name="ztunnel",
        namespace="istio-system",
        version=2,
        status="deployed",
        chart="ztunnel",
        chart_version="1.31.0",
        app_version="1.31.0",
        values={},
        objects=(
            ReleaseObject("v1", "ServiceAccount", "istio-system", "ztunnel"),
            ReleaseObject("apps/v1", "DaemonSet", "istio-system", "ztunnel"),
        ),
        record="sh.helm.release.v1.ztunnel.v2",
    )
    return _snapshot(
        spec=spec,
        daemonsets=[ds],
        helm_releases={"ztunnel": release},
        helm_live={
            ("apps/v1", "DaemonSet", "istio-system", "ztunnel"): ds,
            ("v1", "ServiceAccount", "istio-system", "ztunnel"): sa,
        },
        helm_labelled=[ds, sa, *extra],
    )


def test_a_helm_release_is_listed_with_what_adopt_would_take() -> None:
    findings = p.judge(_helm_snapshot(AmbientMeshSpec()))
    finding = _only(findings, "helm-releases", "info")
    assert finding.message.startswith(
        "Helm release istio-system/ztunnel (ztunnel 1.31.0): with ztunnel in "
        "spec.adopt.helmReleases, the operator would take 2 object(s) as they run, and no pod "
        "restarts; the first change of the AmbientMesh afterwards replaces ztunnel: 1 pod(s) "
        "on linux, "
    ), finding.message
    assert finding.items == (
        "DaemonSet istio-system/ztunnel",
        "ServiceAccount istio-system/ztunnel",
    )
    # Not named in spec.adopt: Helm's agents still block.
    _only(findings, "upstream-agents", "blocking")


def test_a_release_named_in_adopt_no_longer_blocks() -> None:
    spec = AmbientMeshSpec.model_validate({"adopt": {"helmReleases": ["ztunnel"]}})
    findings = p.judge(_helm_snapshot(spec))
    _only(findings, "upstream-agents", "ok")
    finding = _only(findings, "helm-releases", "info")
    assert "spec.adopt names it: it takes 2 object(s)" in finding.message


def test_a_release_adopt_would_refuse_is_a_warning_naming_the_object() -> None:
    stray = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "team", "namespace": "istio-system", **_HELM_META},
    }
    findings = p.judge(_helm_snapshot(AmbientMeshSpec(), stray))
    finding = _only(findings, "helm-releases", "warning")
    assert finding.items == (
        "ConfigMap istio-system/team: carries Helm release istio-system/ztunnel's ownership "
        "metadata but is not in its record, so Helm did not make it; remove that metadata or "
        "the object",
    )


def test_held_templates_say_what_would_restart_and_how_to_approve() -> None:
    held = HeldTemplates(
        approval="0f1e2d3c4b5a",
        daemon_sets=[
            AsIsDaemonSet(
                name="ztunnel-windows-ltsc2022",
                platform="10.0.20348",
                pods=2,
                differences=["spec.containers[istio-proxy].env[NEW]"],
                reason="OperatorUpgrade",
            ),
            AsIsDaemonSet(name="ztunnel", platform="linux", pods=3, reason="OperatorUpgrade"),
        ],
    )
    finding = _only(p.judge(_snapshot(held=held)), "held-templates", "info")
    assert finding.message == (
        "agents keep the pod template they run (status.held); the operator's render would "
        "restart linux: 3 pod(s); 10.0.20348: 2 pod(s). Nothing restarts until the AmbientMesh "
        "changes or you approve: kubectl annotate ambientmesh default "
        "ambientoperator.io/approve-templates=0f1e2d3c4b5a --overwrite"
    )
    assert finding.items == (
        "ztunnel-windows-ltsc2022 (10.0.20348, OperatorUpgrade): "
        "spec.containers[istio-proxy].env[NEW]",
        "ztunnel (linux, OperatorUpgrade): no field listed",
    )
    _only(p.judge(_snapshot()), "held-templates", "ok")
