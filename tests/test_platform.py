"""Platform profiles offline: detection from realistic inventories, and what each renders.

Expected values are literal: the platform each inventory comes from, and the
paths, quotas and policies of each platform as upstream's profiles
(manifests/helm-profiles/platform-*.yaml) and each platform's CNI state them.
How upstream's charts render the same profiles is test_upstream_conformance's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cli.main import build_parser
from ambient_operator.cli.render import load_node_objects, load_nodes
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.cluster.platform import (
    Clue,
    PlatformGuess,
    choice_warning,
    detect_platform,
    effective_platform,
    node_clue,
)
from ambient_operator.cluster.watches import node_shape
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.status.platform import platform_status
from chart_helpers import by_kind, template
from checks import every
from render_cases import INVENTORIES

# Each realistic inventory and the platform it was taken from.
DETECTED = {
    "platform-aks.yaml": "aks",
    "platform-eks.yaml": "eks",
    "platform-gke.yaml": "gke",
    "platform-openshift.yaml": "openshift",
    "platform-k3s.yaml": "k3s",
    "platform-k3d.yaml": "k3d",
    "platform-kind.yaml": "kind",
    "platform-minikube.yaml": "minikube",
    "platform-microk8s.yaml": "microk8s",
    # Kubernetes on Azure VMs (Cluster API), not AKS.
    "platform-azure-vms.yaml": "generic",
    # kubeadm-style nodes with no platform's marks.
    "mixed-ws2022-ws2025.yaml": "generic",
    "every-reason.yaml": "generic",
}


def _nodes(name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = yaml.safe_load((INVENTORIES / name).read_text())["items"]
    return items


def _render(
    inventory: str, spec: dict[str, Any] | None = None, *, cni_rbac: bool = True
) -> RenderResult:
    """Render an inventory as the operator does: detect, let spec.platform override."""
    mesh = AmbientMeshSpec.model_validate(spec or {})
    choice = effective_platform(mesh.platform, detect_platform(_nodes(inventory)))
    facts = ClusterFacts(
        nodes=tuple(load_nodes(INVENTORIES / inventory)),
        istiod_ip="10.96.0.20",
        dns_ip="10.96.0.10",
        platform=choice.name,
        platform_warning=choice_warning(choice),
    )
    return render_dataplane(mesh, facts, cni_rbac=cni_rbac)


def _obj(result: RenderResult, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in result.objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def _host_paths(result: RenderResult, daemonset: str) -> dict[str, str]:
    pod = _obj(result, "DaemonSet", daemonset)["spec"]["template"]["spec"]
    return {v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v}


def _security(result: RenderResult, daemonset: str) -> dict[str, Any]:
    pod = _obj(result, "DaemonSet", daemonset)["spec"]["template"]["spec"]
    context: dict[str, Any] = pod["containers"][0]["securityContext"]
    return context


# -- detection ----------------------------------------------------------------


@pytest.mark.parametrize("inventory", sorted(DETECTED))
def test_each_inventory_is_detected_as_its_platform(inventory: str) -> None:
    guess = detect_platform(_nodes(inventory))
    assert (guess.platform, guess.conflicting) == (DETECTED[inventory], False)
    assert guess.evidence, "detection must say why"


def test_every_platform_inventory_is_listed() -> None:
    present = {p.name for p in INVENTORIES.glob("platform-*.yaml")}
    assert present <= set(DETECTED)


def test_evidence_names_the_marks_found() -> None:
    assert detect_platform(_nodes("platform-aks.yaml")).evidence == (
        "aks: 3 of 3 node(s), e.g. aks-nodepool1-38290124-vmss000000: "
        "label kubernetes.azure.com/cluster",
    )
    assert detect_platform(_nodes("platform-azure-vms.yaml")).evidence == (
        "2 node(s) with providerID azure:// but no kubernetes.azure.com/cluster label: "
        "Kubernetes on that cloud's machines, not aks",
    )
    assert detect_platform([]) == PlatformGuess("generic", ("no nodes yet",))


def test_windows_nodes_carry_their_platforms_marks() -> None:
    windows = {
        inventory: [
            n for n in _nodes(inventory) if n["metadata"]["labels"]["kubernetes.io/os"] == "windows"
        ]
        for inventory in (
            "platform-aks.yaml",
            "platform-eks.yaml",
            "platform-gke.yaml",
            "platform-openshift.yaml",
        )
    }
    clues = {inv: [node_clue(n) for n in nodes] for inv, nodes in windows.items()}
    assert clues == {
        "platform-aks.yaml": [Clue("aks", "label kubernetes.azure.com/cluster")],
        # An eksctl self-managed node group: no eks.amazonaws.com label at all.
        "platform-eks.yaml": [Clue("eks", "kubelet version v1.31.2-eks-94953ac")],
        "platform-gke.yaml": [Clue("gke", "label cloud.google.com/gke-nodepool")],
        "platform-openshift.yaml": [Clue("openshift", "label node.openshift.io/os_id=Windows")],
    }


def test_openshift_on_aws_is_openshift_not_eks() -> None:
    nodes = _nodes("platform-openshift.yaml")
    every(nodes, lambda n: n["spec"]["providerID"].startswith("aws://"), "nodes")
    assert detect_platform(nodes).platform == "openshift"


def test_k3d_is_told_from_k3s() -> None:
    image = "osImage 'K3s v1.31.5+k3s1' (k3s in a container)"
    assert [node_clue(n) for n in _nodes("platform-k3d.yaml")] == [
        Clue("k3d", f"providerID k3s://k3d-mesh-server-0 and {image}"),
        Clue("k3d", f"providerID k3s://k3d-mesh-agent-0 and {image}"),
    ]
    assert [node_clue(n) for n in _nodes("platform-k3s.yaml")] == [
        Clue("k3s", "providerID k3s://k3s-server-1"),
        Clue("k3s", "providerID k3s://k3s-agent-1"),
    ]


def test_nodes_without_marks_count_for_nothing() -> None:
    bare = {"metadata": {"name": "joining-1", "labels": {"kubernetes.io/os": "linux"}}}
    guess = detect_platform([*_nodes("platform-gke.yaml"), bare])
    assert guess.platform == "gke"
    assert guess.evidence[-1] == "1 node(s) carry no platform's providerID or labels"


def test_nodes_that_disagree_render_generic_and_say_so() -> None:
    guess = detect_platform([*_nodes("platform-aks.yaml"), *_nodes("platform-eks.yaml")])
    assert (guess.platform, guess.conflicting) == ("generic", True)
    assert guess.evidence[0] == (
        "nodes point at 2 platforms (aks, eks): rendering for generic; set spec.platform to "
        "the one whose paths the Linux nodes use"
    )
    choice = effective_platform("auto", guess)
    assert choice_warning(choice) == f"platform: {guess.evidence[0]}"
    # Naming the platform is the way out, and then there is nothing to warn about.
    assert choice_warning(effective_platform("aks", guess)) is None


def test_malformed_nodes_have_no_marks() -> None:
    odd: list[Any] = [{"metadata": None, "spec": "x"}, {"metadata": {"labels": ["a"]}}]
    assert node_clue(odd[0]) is None and node_clue(odd[1]) is None
    assert detect_platform(odd).platform == "generic"


def test_spec_platform_overrides_detection_and_status_says_both() -> None:
    guess = detect_platform(_nodes("platform-aks.yaml"))
    status = platform_status(effective_platform("gke", guess))
    assert (status.name, status.detected, status.source) == ("gke", "aks", "spec")
    auto = platform_status(effective_platform("auto", guess))
    assert (auto.name, auto.detected, auto.source) == ("aks", "aks", "detected")
    assert auto.evidence == list(guess.evidence)


# -- render ---------------------------------------------------------------------

LINUX_PATHS = {
    # platform: (CNI bin dir, CNI conf dir, netns dir) on Linux nodes
    "generic": ("/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"),
    "aks": ("/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"),
    "eks": ("/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"),
    "kind": ("/opt/cni/bin", "/etc/cni/net.d", "/var/run/netns"),
    "gke": ("/home/kubernetes/bin", "/etc/cni/net.d", "/var/run/netns"),
    "openshift": ("/var/lib/cni/bin", "/etc/cni/multus/net.d", "/var/run/netns"),
    "k3s": (
        "/var/lib/rancher/k3s/data/cni",
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        "/var/run/netns",
    ),
    "k3d": ("/bin", "/var/lib/rancher/k3s/agent/etc/cni/net.d", "/var/run/netns"),
    "microk8s": (
        "/var/snap/microk8s/current/opt/cni/bin",
        "/var/snap/microk8s/current/args/cni-network",
        "/var/run/netns",
    ),
    "minikube": ("/opt/cni/bin", "/etc/cni/net.d", "/var/run/docker/netns"),
}
# Where istio-cni's container sees the netns folder, where not /host/var/run/netns.
NETNS_MOUNTS = {"minikube": "/host/var/run/docker/netns"}
WINDOWS_DIRS = {
    # platform: (MOUNTED_CNI_NET_DIR, MOUNTED_CNI_BIN_DIR) on Windows nodes
    "aks": (r"C:\k\azurecni\netconf", r"C:\k\azurecni\bin"),
    "generic": (r"C:\k\azurecni\netconf", r"C:\k\azurecni\bin"),
    "eks": (r"C:\ProgramData\Amazon\EKS\cni\config", r"C:\Program Files\Amazon\EKS\cni"),
    "gke": (r"C:\etc\kubernetes\cni\config", r"C:\etc\kubernetes\cni"),
    "openshift": (r"C:\k\cni\config", r"C:\k\cni"),
}
WINDOWS_CONFIG = "istio-cni-config-windows-ltsc2022"


@pytest.mark.parametrize("platform", sorted(LINUX_PATHS))
def test_linux_istio_cni_mounts_the_platforms_directories(platform: str) -> None:
    result = _render("mixed-ws2022-ws2025.yaml", {"platform": platform})
    paths = _host_paths(result, "istio-cni-node")
    bin_dir, conf_dir, netns_dir = LINUX_PATHS[platform]
    assert (paths["cni-bin-dir"], paths["cni-net-dir"], paths["cni-netns-dir"]) == (
        bin_dir,
        conf_dir,
        netns_dir,
    )
    # Wherever the CNI folders are on the host, install-cni finds them where it
    # looks; the agent opens a pod's netns at /host followed by the runtime's path.
    pod = _obj(result, "DaemonSet", "istio-cni-node")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert (mounts["cni-bin-dir"], mounts["cni-net-dir"], mounts["cni-netns-dir"]) == (
        "/host/opt/cni/bin",
        "/host/etc/cni/net.d",
        NETNS_MOUNTS.get(platform, "/host/var/run/netns"),
    )


def test_a_runtime_netns_folder_of_the_spec_is_mounted_where_istio_cni_opens_it() -> None:
    # containerd keeping namespaces under its state folder (the dev cluster's real
    # node): the CNI plugin hands the agent that host path, which it opens under
    # /host ("Make sure that the netns host path ... is mounted in under /host").
    netns = "/var/lib/node/containerd/state/io.containerd.grpc.v1.cri/netns"
    result = _render("linux-only.yaml", {"platforms": {"linux": {"cniNetnsDir": netns}}})
    assert _host_paths(result, "istio-cni-node")["cni-netns-dir"] == netns
    pod = _obj(result, "DaemonSet", "istio-cni-node")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["cni-netns-dir"] == {
        "name": "cni-netns-dir",
        "mountPath": "/host/var/lib/node/containerd/state/io.containerd.grpc.v1.cri/netns",
        "mountPropagation": "HostToContainer",
    }


@pytest.mark.parametrize(
    ("inventory", "platform"),
    [
        ("platform-aks.yaml", "aks"),
        ("platform-eks.yaml", "eks"),
        ("platform-gke.yaml", "gke"),
        ("platform-openshift.yaml", "openshift"),
        ("platform-azure-vms.yaml", "generic"),
    ],
)
def test_windows_istio_cni_uses_the_platforms_cni_directories(
    inventory: str, platform: str
) -> None:
    data = _obj(_render(inventory), "ConfigMap", WINDOWS_CONFIG)["data"]
    assert (data["MOUNTED_CNI_NET_DIR"], data["MOUNTED_CNI_BIN_DIR"]) == WINDOWS_DIRS[platform]


def test_the_specs_windows_directories_beat_the_platforms() -> None:
    spec = {"platforms": {"windows": {"cniConfDir": r"D:\cni\conf"}}}
    data = _obj(_render("platform-eks.yaml", spec), "ConfigMap", WINDOWS_CONFIG)["data"]
    assert (data["MOUNTED_CNI_NET_DIR"], data["MOUNTED_CNI_BIN_DIR"]) == (
        r"D:\cni\conf",
        r"C:\Program Files\Amazon\EKS\cni",
    )


QUOTA_SPEC = {
    # 5000, in the canonical form the API server stores (test_platform_cluster).
    "hard": {"pods": "5k"},
    "scopeSelector": {
        "matchExpressions": [
            {"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}
        ]
    },
}


@pytest.mark.parametrize("cni_rbac", [True, False])
def test_gke_gets_quotas_for_the_agents_critical_pods(cni_rbac: bool) -> None:
    result = _render("platform-gke.yaml", cni_rbac=cni_rbac)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in result.objects]
    quotas = [k for k in kinds if k[0] == "ResourceQuota"]
    assert quotas == [
        ("ResourceQuota", "istio-cni-resource-quota"),
        ("ResourceQuota", "ztunnel"),
    ]
    # Before any DaemonSet, whose pods the API server refuses until they exist.
    assert kinds.index(quotas[-1]) < kinds.index(("DaemonSet", "istio-cni-node"))
    for _, name in quotas:
        quota = _obj(result, "ResourceQuota", name)
        assert quota["metadata"]["namespace"] == "istio-system"
        assert quota["spec"] == QUOTA_SPEC
    # One quota per namespace and agent covers the Windows agents' pods too.
    windows = _obj(result, "DaemonSet", "ztunnel-windows-ltsc2022")["spec"]["template"]["spec"]
    assert windows["priorityClassName"] == "system-node-critical"


@pytest.mark.parametrize("platform", ["generic", "aks", "eks", "openshift", "k3s", "kind"])
def test_no_quota_where_the_platform_needs_none(platform: str) -> None:
    result = _render("mixed-ws2022-ws2025.yaml", {"platform": platform})
    assert not [o for o in result.objects if o["kind"] == "ResourceQuota"]


def test_openshift_runs_istio_cni_under_multus_with_selinux_and_the_privileged_scc() -> None:
    result = _render("platform-openshift.yaml")
    linux = _obj(result, "ConfigMap", "istio-cni-config")["data"]
    assert (linux["CHAINED_CNI_PLUGIN"], linux["CNI_CONF_NAME"]) == ("false", "istio-cni.conf")
    # Windows nodes chain to their own CNI; Multus is Linux's.
    windows = _obj(result, "ConfigMap", WINDOWS_CONFIG)["data"]
    assert windows["CHAINED_CNI_PLUGIN"] == "true" and "CNI_CONF_NAME" not in windows
    for daemonset in ("istio-cni-node", "ztunnel"):
        assert _security(result, daemonset)["seLinuxOptions"] == {"type": "spc_t"}
    scc = {
        "apiGroups": ["security.openshift.io"],
        "resources": ["securitycontextconstraints"],
        "resourceNames": ["privileged"],
        "verbs": ["use"],
    }
    assert scc in _obj(result, "ClusterRole", "istio-cni")["rules"]
    assert _obj(result, "ClusterRole", "ztunnel")["rules"] == [scc]
    binding = _obj(result, "ClusterRoleBinding", "ztunnel")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "ztunnel",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ztunnel", "namespace": "istio-system"},
        {"kind": "ServiceAccount", "name": "ztunnel-windows", "namespace": "istio-system"},
    ]


def test_elsewhere_no_selinux_no_scc_and_chained() -> None:
    result = _render("platform-aks.yaml")
    for daemonset in ("istio-cni-node", "ztunnel"):
        assert "seLinuxOptions" not in _security(result, daemonset)
    assert not any(
        "security.openshift.io" in r["apiGroups"]
        for r in _obj(result, "ClusterRole", "istio-cni")["rules"]
    )
    assert not [
        o
        for o in result.objects
        if o["metadata"]["name"] == "ztunnel" and o["kind"].startswith("ClusterRole")
    ]
    linux = _obj(result, "ConfigMap", "istio-cni-config")["data"]
    assert linux["CHAINED_CNI_PLUGIN"] == "true" and "CNI_CONF_NAME" not in linux


def test_a_disagreement_is_a_render_warning() -> None:
    both = [*_nodes("platform-aks.yaml"), *_nodes("platform-eks.yaml")]
    choice = effective_platform("auto", detect_platform(both))
    facts = ClusterFacts(nodes=(), platform=choice.name, platform_warning=choice_warning(choice))
    warnings = render_dataplane(AmbientMeshSpec(), facts).warnings
    assert warnings[0] == (
        "platform: nodes point at 2 platforms (aks, eks): rendering for generic; set "
        "spec.platform to the one whose paths the Linux nodes use"
    )


def test_offline_render_detects_the_platform_of_the_inventory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = build_parser().parse_args(["render", "--nodes", str(INVENTORIES / "platform-gke.yaml")])
    assert args.func(args) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ResourceQuota"] == [
        "istio-cni-resource-quota",
        "ztunnel",
    ]
    mesh = tmp_path / "mesh.yaml"
    mesh.write_text(
        "apiVersion: ambientoperator.io/v1alpha1\nkind: AmbientMesh\n"
        "metadata: {name: default}\nspec: {platform: k3s}\n"
    )
    args = build_parser().parse_args(
        ["render", "--nodes", str(INVENTORIES / "platform-gke.yaml"), "--mesh", str(mesh)]
    )
    assert args.func(args) == 0
    objects = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o]
    assert not [o for o in objects if o["kind"] == "ResourceQuota"]
    cni = next(
        o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "istio-cni-node"
    )
    paths = {
        v["name"]: v["hostPath"]["path"]
        for v in cni["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert paths["cni-bin-dir"] == "/var/lib/rancher/k3s/data/cni"


def test_load_node_objects_reads_what_load_nodes_reads() -> None:
    path = INVENTORIES / "platform-eks.yaml"
    assert [n["metadata"]["name"] for n in load_node_objects(path)] == [
        n.name for n in load_nodes(path)
    ]


@pytest.mark.parametrize("version", ["1.30", "1.37"])
@pytest.mark.parametrize("platform", sorted(LINUX_PATHS))
def test_each_platforms_objects_validate_strictly(platform: str, version: str) -> None:
    # Strict schemas refuse unknown fields: a typo in a platform's template fails here.
    objects = _render("platform-openshift.yaml", {"platform": platform}).objects
    # The loop judges the agents themselves, not only what is left when they are missing.
    assert sorted(o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet") == [
        "istio-cni-node",
        "istio-cni-node-windows-ltsc2022",
        "ztunnel",
        "ztunnel-windows-ltsc2022",
    ]
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, f"{version}.0", strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{platform}: {obj['kind']}/{obj['metadata']['name']}: {where}: {err}")


def test_the_chart_grants_the_scc_on_openshift_only_when_asked() -> None:
    scc = {
        "apiGroups": ["security.openshift.io"],
        "resources": ["securitycontextconstraints"],
        "resourceNames": ["privileged"],
        "verbs": ["use"],
    }

    def grants(values: dict[str, Any]) -> dict[str, Any]:
        objects = template(values)
        roles = {o["metadata"]["name"]: o for o in by_kind(objects, "ClusterRole")}
        bindings = {o["metadata"]["name"]: o for o in by_kind(objects, "ClusterRoleBinding")}
        return {
            "cni": scc in roles["ambient-operator-istio-cni"]["rules"],
            "ztunnel": roles.get("ambient-operator-ztunnel-scc", {}).get("rules"),
            "subjects": bindings.get("ambient-operator-ztunnel-scc", {}).get("subjects"),
        }

    assert grants({}) == {"cni": False, "ztunnel": None, "subjects": None}
    namespaces = ["istio-system", "mesh-agents"]
    assert grants({"agents": {"namespaces": namespaces, "openshiftSCC": True}}) == {
        "cni": True,
        "ztunnel": [scc],
        "subjects": [
            {"kind": "ServiceAccount", "name": name, "namespace": ns}
            for ns in namespaces
            for name in ("ztunnel", "ztunnel-windows")
        ],
    }


def test_a_providerid_set_after_joining_is_a_change_of_the_node() -> None:
    # Cloud controllers set spec.providerID once the node has registered.
    joined = {"metadata": {"name": "n", "labels": {"kubernetes.io/os": "linux"}}, "spec": {}}
    initialized = {**joined, "spec": {"providerID": "aws:///us-west-2a/i-0a1b2c3d4e5f60718"}}
    assert node_shape(joined) != node_shape(initialized)
