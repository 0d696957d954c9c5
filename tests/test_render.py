"""render_dataplane and facts, one behaviour at a time."""

from __future__ import annotations

import re
from typing import Any

import jinja2
import pytest
import yaml

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cli.render import load_nodes
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts, Taint, windows_build
from ambient_operator.render import RenderResult, output, render_dataplane
from ambient_operator.render.templating import render_object
from render_cases import INVENTORIES, REPO

WS2022, WS2025 = c.BUILD_WS2022, c.BUILD_WS2025
STANDARD_TOLERATIONS = [
    {"effect": "NoSchedule", "operator": "Exists"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"effect": "NoExecute", "operator": "Exists"},
]
WINDOWS_TOLERATION = {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}
MY_TEMPLATES = [
    "_daemonset.yaml.j2",
    "_macros.j2",
    "_extras.j2",
    "clusterrole-istio-cni.yaml.j2",
    "clusterrolebinding.yaml.j2",
    "configmap-istio-cni.yaml.j2",
    "daemonset-istio-cni-linux.yaml.j2",
    "daemonset-istio-cni-windows.yaml.j2",
    "daemonset-ztunnel-linux.yaml.j2",
    "daemonset-ztunnel-windows.yaml.j2",
    "serviceaccount.yaml.j2",
]


def linux(name: str, arch: str = "amd64") -> NodeFacts:
    return NodeFacts(name, "linux", arch, None, False, {c.LABEL_OS: "linux", c.LABEL_ARCH: arch})


def windows(name: str, build: str, *, labeled: bool = True) -> NodeFacts:
    labels = {c.LABEL_OS: "windows", c.LABEL_ARCH: "amd64"}
    if labeled:
        labels[c.LABEL_WINDOWS_BUILD] = build
    return NodeFacts(
        name, "windows", "amd64", build, labeled, labels, (Taint("os", "windows", "NoSchedule"),)
    )


MIXED = (linux("l1"), linux("l2", "arm64"), windows("w22", WS2022), windows("w25", WS2025))


def render(
    nodes: tuple[NodeFacts, ...] = MIXED,
    spec: dict[str, Any] | None = None,
    istiod_ip: str | None = "10.96.0.20",
    dns_ip: str | None = "10.96.0.10",
) -> RenderResult:
    return render_dataplane(
        AmbientMeshSpec.model_validate(spec or {}), ClusterFacts(nodes, istiod_ip, dns_ip)
    )


def obj(result: RenderResult, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in result.objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} rendered {len(found)} times"
    return found[0]


def pod(result: RenderResult, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = obj(result, "DaemonSet", name)["spec"]["template"]["spec"]
    return spec


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def names(result: RenderResult) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in result.objects]


# -- facts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "build"),
    [
        ("10.0.20348.2762", "10.0.20348"),
        ("10.0.26100.2314", "10.0.26100"),
        ("10.0.17763.6414 (WinBuild.160101.0800)", "10.0.17763"),
        ("10.0.20348", "10.0.20348"),
        ("6.8.0-1021-azure", None),
        ("", None),
        (None, None),
    ],
)
def test_windows_build_from_kernel_version(kernel: str | None, build: str | None) -> None:
    assert windows_build(kernel) == build


def test_node_facts_prefer_labels_then_node_info() -> None:
    node = NodeFacts.from_node(
        {
            "metadata": {"name": "w", "labels": {c.LABEL_OS: "windows"}},
            "spec": {
                "taints": [
                    {"key": "os", "value": "windows", "effect": "NoSchedule"},
                    {"key": "x", "effect": "NoExecute"},
                ]
            },
            "status": {
                "nodeInfo": {
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "kernelVersion": "10.0.20348.2762",
                }
            },
        }
    )
    assert (node.os, node.arch, node.build, node.build_from_label) == (
        "windows",
        "amd64",
        WS2022,
        False,
    )
    assert node.taints == (Taint("os", "windows", "NoSchedule"), Taint("x", None, "NoExecute"))


def test_build_label_wins_over_kernel_version() -> None:
    node = NodeFacts.from_node(
        {
            "metadata": {
                "name": "w",
                "labels": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: WS2025},
            },
            "status": {"nodeInfo": {"kernelVersion": "10.0.20348.1"}},
        }
    )
    assert (node.build, node.build_from_label) == (WS2025, True)


def test_build_from_os_image_when_kernel_version_is_empty() -> None:
    node = NodeFacts.from_node(
        {
            "metadata": {"name": "w"},
            "status": {
                "nodeInfo": {
                    "operatingSystem": "windows",
                    "kernelVersion": "",
                    "osImage": "Windows Server 2025 Datacenter",
                }
            },
        }
    )
    assert node.build == WS2025


def test_linux_nodes_have_no_build() -> None:
    assert (
        NodeFacts.from_node(
            {
                "metadata": {
                    "name": "l",
                    "labels": {c.LABEL_OS: "linux", c.LABEL_WINDOWS_BUILD: WS2022},
                }
            }
        ).build
        is None
    )


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"metadata": {}}, "metadata.name"),
        ({"metadata": {"name": "n", "labels": ["a"]}}, "metadata.labels"),
        ({"metadata": {"name": "n"}, "spec": {"taints": "x"}}, "spec.taints"),
        ({"metadata": {"name": "n"}, "status": {"nodeInfo": 3}}, "status.nodeInfo"),
    ],
)
def test_malformed_nodes_name_the_field(node: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(field)}: "):
        NodeFacts.from_node(node)


# -- what is rendered ----------------------------------------------------------


def test_objects_come_in_apply_order() -> None:
    assert names(render()) == [
        "ServiceAccount/istio-cni",
        "ServiceAccount/ztunnel",
        "ServiceAccount/ztunnel-windows",
        "ClusterRole/istio-cni",
        "ClusterRoleBinding/istio-cni",
        "ConfigMap/istio-cni-config",
        "ConfigMap/istio-cni-config-windows-ltsc2022",
        "ConfigMap/istio-cni-config-windows-ltsc2025",
        "DaemonSet/istio-cni-node",
        "DaemonSet/ztunnel",
        "DaemonSet/istio-cni-node-windows-ltsc2022",
        "DaemonSet/ztunnel-windows-ltsc2022",
        "DaemonSet/istio-cni-node-windows-ltsc2025",
        "DaemonSet/ztunnel-windows-ltsc2025",
    ]


def test_every_object_carries_the_common_labels_and_no_owner() -> None:
    result = render()
    for o in result.objects:
        labels = o["metadata"]["labels"]
        assert labels[c.LABEL_PART_OF] == "istio-ambient"
        assert labels[c.LABEL_MANAGED_BY] == "ambient-operator"
        assert labels[c.LABEL_NAME] in ("ztunnel", "istio-cni")
        assert labels[c.LABEL_COMPONENT] == labels[c.LABEL_NAME]
        assert "ownerReferences" not in o["metadata"]
    platforms = {
        o["metadata"]["name"]: o["metadata"]["labels"][c.LABEL_PLATFORM] for o in result.objects
    }
    assert platforms["ztunnel-windows"] == "all"
    assert platforms["istio-cni-config"] == "linux"
    assert platforms["istio-cni-config-windows-ltsc2025"] == WS2025
    assert platforms["ztunnel-windows-ltsc2022"] == WS2022
    assert platforms["istio-cni-node"] == "linux"


def test_pod_labels_keep_agents_out_of_the_mesh_and_select_uniquely() -> None:
    result = render()
    selectors = []
    for ds in (o for o in result.objects if o["kind"] == "DaemonSet"):
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert labels[c.LABEL_DATAPLANE_MODE] == "none"
        assert labels["sidecar.istio.io/inject"] == "false"
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        selectors.append(tuple(sorted(selector.items())))
    assert len(selectors) == 6  # a pair for Linux and for each of the two Windows builds
    assert len(set(selectors)) == len(selectors)


def test_linux_ztunnel_production_settings() -> None:
    result = render()
    ds = obj(result, "DaemonSet", "ztunnel")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    template = ds["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "15020"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    spec = template["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == "ztunnel"
    assert spec["tolerations"] == STANDARD_TOLERATIONS
    assert spec["nodeSelector"] == {c.LABEL_OS: "linux"}
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": c.LABEL_ARCH, "operator": "In", "values": ["amd64", "arm64"]}
            ]
        }
    ]
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"],
    }
    assert security["readOnlyRootFilesystem"] is True
    assert security["privileged"] is False
    assert (security["runAsUser"], security["runAsGroup"]) == (0, 1337)
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}
    assert container["resources"] == {"requests": {"cpu": "200m", "memory": "512Mi"}}
    variables = env(container)
    assert variables["CA_ADDRESS"] == variables["XDS_ADDRESS"] == "istiod.istio-system.svc:15012"
    assert variables["INPOD_UDS"] == "/var/run/ztunnel/ztunnel.sock"
    assert variables["TERMINATION_GRACE_PERIOD_SECONDS"] == "30"
    # ztunnel sizes its worker threads from its CPU limit (node capacity when unset).
    cpu_limit = {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}
    assert variables["ZTUNNEL_CPU_LIMIT"] == cpu_limit
    assert "ZTUNNEL_RESOURCE_CPU_LIMIT" not in variables
    for name in ("POD_NAME", "POD_NAMESPACE", "NODE_NAME", "INSTANCE_IP", "SERVICE_ACCOUNT"):
        assert "fieldRef" in variables[name]
    volumes = {v["name"]: v for v in spec["volumes"]}
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca"}
    assert volumes["istiod-ca-cert"]["configMap"]["name"] == "istio-ca-root-cert"
    assert volumes["cni-ztunnel-sock-dir"]["hostPath"] == {
        "path": "/var/run/ztunnel",
        "type": "DirectoryOrCreate",
    }
    # No volume may carry a Kubernetes API credential.
    assert not any("secret" in v for v in spec["volumes"])


def test_linux_istio_cni_production_settings() -> None:
    result = render()
    ds = obj(result, "DaemonSet", "istio-cni-node")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    spec = ds["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["serviceAccountName"] == "istio-cni"
    (container,) = spec["containers"]
    # The install-cni image has no entrypoint.
    assert container["command"] == ["install-cni"]
    assert env(container)["REPAIR_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # iptables takes /run/xtables.lock; AppArmor would block the capabilities.
    assert "readOnlyRootFilesystem" not in container["securityContext"]
    assert container["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cni-netns-dir"]["mountPath"] == "/host/var/run/netns"
    assert mounts["cni-netns-dir"]["mountPropagation"] == "HostToContainer"
    assert container["securityContext"]["capabilities"]["add"] == [
        "NET_ADMIN",
        "NET_RAW",
        "SYS_PTRACE",
        "SYS_ADMIN",
        "DAC_OVERRIDE",
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8000}
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "100Mi"}}
    assert container["envFrom"] == [{"configMapRef": {"name": "istio-cni-config"}}]
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths == {
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/var/run/istio-cni",
        "/var/run/ztunnel",
        "/var/run/netns",
        "/proc",
    }
    proc = next(m for m in container["volumeMounts"] if m["name"] == "cni-host-procfs")
    assert proc["readOnly"] is True


def test_ztunnel_is_told_which_cpu_bounds_were_set() -> None:
    resources = {"requests": {"memory": "1Gi"}, "limits": {"cpu": "2"}}
    variables = env(
        pod(render(spec={"ztunnel": {"resources": resources}}), "ztunnel")["containers"][0]
    )
    assert variables["ZTUNNEL_RESOURCE_CPU_LIMIT"] == {
        "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}
    }
    assert "ZTUNNEL_RESOURCE_CPU_REQUEST" not in variables


def test_istio_cni_enrolls_what_the_istio_api_says() -> None:
    data = obj(render(), "ConfigMap", "istio-cni-config")["data"]
    # An empty or missing selector list enrolls no pod at all.
    assert yaml.safe_load(data["AMBIENT_ENABLEMENT_SELECTOR"]) == [
        {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
        {
            "podSelector": {
                "matchExpressions": [
                    {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}
                ]
            },
            "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}},
        },
    ]
    assert data["REPAIR_ENABLED"] == data["REPAIR_REPAIR_PODS"] == "true"


def test_rollout_comes_from_the_spec() -> None:
    result = render(
        spec={
            "ztunnel": {"rollout": {"maxUnavailable": "10%", "maxSurge": 0}},
            "istioCni": {"rollout": {"maxUnavailable": "25%"}},
        }
    )
    for name in ("ztunnel", "ztunnel-windows-ltsc2022"):
        assert obj(result, "DaemonSet", name)["spec"]["updateStrategy"]["rollingUpdate"] == {
            "maxUnavailable": "10%",
            "maxSurge": 0,
        }
    assert obj(result, "DaemonSet", "istio-cni-node")["spec"]["updateStrategy"][
        "rollingUpdate"
    ] == {"maxUnavailable": "25%", "maxSurge": 0}


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"ztunnel": {"rollout": {"maxSurge": "20%"}}},
        {"istioCni": {"rollout": {"maxUnavailable": 0, "maxSurge": 2}}},
    ],
)
def test_host_network_daemonsets_never_surge(spec: dict[str, Any]) -> None:
    # A surge pod would wait forever for ports its predecessor holds on the node.
    result = render(spec=spec)
    checked = []
    for ds in (o for o in result.objects if o["kind"] == "DaemonSet"):
        rolling = ds["spec"]["updateStrategy"]["rollingUpdate"]
        if ds["spec"]["template"]["spec"].get("hostNetwork"):
            assert rolling["maxSurge"] == 0, ds["metadata"]["name"]
            assert rolling["maxUnavailable"] not in (0, "0%")
            checked.append(ds["metadata"]["name"])
    # Every agent but Linux ztunnel uses the host network: the loop judged five of six.
    assert sorted(checked) == [
        "istio-cni-node",
        "istio-cni-node-windows-ltsc2022",
        "istio-cni-node-windows-ltsc2025",
        "ztunnel-windows-ltsc2022",
        "ztunnel-windows-ltsc2025",
    ]


def test_surge_budget_becomes_unavailability_on_the_host_network() -> None:
    result = render(
        spec={
            "ztunnel": {"rollout": {"maxSurge": "20%"}},
            "istioCni": {"rollout": {"maxUnavailable": 0, "maxSurge": 2}},
        }
    )

    def rolling(name: str) -> dict[str, Any]:
        out: dict[str, Any] = obj(result, "DaemonSet", name)["spec"]["updateStrategy"][
            "rollingUpdate"
        ]
        return out

    assert rolling("ztunnel") == {"maxUnavailable": 0, "maxSurge": "20%"}
    assert rolling("ztunnel-windows-ltsc2022") == {"maxUnavailable": "20%", "maxSurge": 0}
    assert rolling("istio-cni-node") == {"maxUnavailable": 2, "maxSurge": 0}
    assert rolling("istio-cni-node-windows-ltsc2025") == {"maxUnavailable": 2, "maxSurge": 0}


def test_windows_daemonsets_are_host_process_pods_per_build() -> None:
    result = render()
    for build, suffix in ((WS2022, "ltsc2022"), (WS2025, "ltsc2025")):
        for name, account in (
            (f"ztunnel-windows-{suffix}", "ztunnel-windows"),
            (f"istio-cni-node-windows-{suffix}", "istio-cni"),
        ):
            spec = pod(result, name)
            assert spec["os"] == {"name": "windows"}
            assert spec["hostNetwork"] is True
            assert spec["securityContext"]["windowsOptions"] == {
                "hostProcess": True,
                "runAsUserName": "NT AUTHORITY\\SYSTEM",
            }
            assert spec["nodeSelector"] == {
                c.LABEL_OS: "windows",
                c.LABEL_ARCH: "amd64",
                c.LABEL_WINDOWS_BUILD: build,
            }
            assert "affinity" not in spec
            assert spec["tolerations"] == [*STANDARD_TOLERATIONS, WINDOWS_TOLERATION]
            assert spec["serviceAccountName"] == account
            assert spec["priorityClassName"] == "system-node-critical"
            for container in spec["containers"]:
                # Linux-only security fields are refused for Windows pods.
                assert "securityContext" not in container


def test_windows_ztunnel_uses_the_named_pipe_and_the_istiod_ip() -> None:
    spec = pod(render(), "ztunnel-windows-ltsc2022")
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    variables = env(container)
    assert variables["INPOD_UDS"] == "\\\\.\\pipe\\istio-zds"
    assert variables["INPOD_PORT_REUSE"] == "false"
    assert variables["IPV6_ENABLED"] == "false"
    assert variables["CA_ADDRESS"] == variables["XDS_ADDRESS"] == "10.96.0.20:15012"
    assert (
        variables["ALT_CA_HOSTNAME"] == variables["ALT_XDS_HOSTNAME"] == ("istiod.istio-system.svc")
    )
    (init,) = spec["initContainers"]
    assert env(init) == {"DNS_SUFFIX": ".cluster.local", "DNS_IP": "10.96.0.10"}
    assert "Add-DnsClientNrptRule" in init["args"][0]


def test_windows_istio_cni_gets_the_pipe_and_host_paths_from_its_config_map() -> None:
    result = render(spec={"platforms": {"windows": {"cniConfDir": "D:\\cni\\conf"}}})
    spec = pod(result, "istio-cni-node-windows-ltsc2025")
    (container,) = spec["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": "istio-cni-config-windows-ltsc2025"}}]
    assert "volumes" not in spec  # HostProcess containers see the host's files
    data = obj(result, "ConfigMap", "istio-cni-config-windows-ltsc2025")["data"]
    assert data["ZTUNNEL_UDS_ADDRESS"] == "\\\\.\\pipe\\istio-zds"
    assert data["MOUNTED_CNI_NET_DIR"] == "D:\\cni\\conf"
    assert data["MOUNTED_CNI_BIN_DIR"] == "C:\\k\\azurecni\\bin"
    assert "CNI_NET_DIR" not in data and "CNI_BIN_DIR" not in data  # read by nothing
    assert data["AMBIENT_IPV6"] == data["AMBIENT_DNS_CAPTURE"] == "false"
    linux_data = obj(result, "ConfigMap", "istio-cni-config")["data"]
    assert linux_data["ZTUNNEL_UDS_ADDRESS"] == "/var/run/ztunnel/ztunnel.sock"
    assert "MOUNTED_CNI_BIN_DIR" not in linux_data
    assert all(isinstance(v, str) for v in {**data, **linux_data}.values())


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        ({}, "docker.io/istio/ztunnel-windows:1.31.0"),
        ({"hub": "r.example/i", "tag": "9.9"}, "r.example/i/ztunnel-windows:9.9"),
        # Where `make images` pushed them, tagged with the experiment pair (issue 41).
        (
            {"registry": "r.example:5000/amb", "hub": "r.example/i", "tag": "9.9"},
            "r.example:5000/amb/ztunnel-windows:1.30-exp.e245938e.c4094652",
        ),
        (
            {"registry": "r.example/amb", "ztunnel": {"windows": "r.example/zt:win"}},
            "r.example/zt:win",
        ),
        ({"ztunnel": {"windows": "r.example/zt:win"}}, "r.example/zt:win"),
        (
            {
                "ztunnel": {
                    "windows": "r.example/zt:win",
                    "windowsBuilds": {WS2022: "r.example/zt:2022"},
                }
            },
            "r.example/zt:2022",
        ),
    ],
)
def test_windows_image_precedence(images: dict[str, Any], expected: str) -> None:
    result = render(spec={"images": images})
    assert pod(result, "ztunnel-windows-ltsc2022")["containers"][0]["image"] == expected


def test_the_registry_names_both_windows_agents_and_leaves_linux_to_hub() -> None:
    result = render(spec={"images": {"registry": "r.example:5000/amb"}})
    images = {
        name: pod(result, name)["containers"][0]["image"]
        for name in (
            "ztunnel-windows-ltsc2022",
            "ztunnel-windows-ltsc2025",
            "istio-cni-node-windows-ltsc2022",
            "istio-cni-node-windows-ltsc2025",
            "ztunnel",
            "istio-cni-node",
        )
    }
    assert images == {
        "ztunnel-windows-ltsc2022": "r.example:5000/amb/ztunnel-windows:1.30-exp.e245938e.c4094652",
        "ztunnel-windows-ltsc2025": "r.example:5000/amb/ztunnel-windows:1.30-exp.e245938e.c4094652",
        "istio-cni-node-windows-ltsc2022": (
            "r.example:5000/amb/install-cni-windows:1.30-exp.e245938e.c4094652"
        ),
        "istio-cni-node-windows-ltsc2025": (
            "r.example:5000/amb/install-cni-windows:1.30-exp.e245938e.c4094652"
        ),
        "ztunnel": "docker.io/istio/ztunnel:1.31.0",
        "istio-cni-node": "docker.io/istio/install-cni:1.31.0",
    }
    # Nothing left to warn about: the agents and the redirection-wait image are known.
    assert not [w for w in result.warnings if "make images" in w], result.warnings


def test_unset_or_placeholder_bundled_images_are_warned_about() -> None:
    bare = render(spec={})
    told = [w.split(":")[0] for w in bare.warnings if "make images REGISTRY=<registry>" in w]
    assert told == [
        "spec.images.ztunnel.windows is unset, and so is spec.images.registry",
        "spec.images.istioCni.windows is unset, and so is spec.images.registry",
        "spec.newPodWorkaround.multiBuildImage is unset, and so is spec.images.registry",
    ]
    placeholder = render(
        spec={
            "images": {"registry": "r.example/amb"},
            "newPodWorkaround": {"multiBuildImage": "docker.io/istio/redirection-wait:1.31.0"},
        }
    )
    assert [w for w in placeholder.warnings if "make images" in w] == [
        "spec.newPodWorkaround.multiBuildImage names docker.io/istio/redirection-wait:1.31.0, a "
        "placeholder: Istio does not publish a redirection-wait image: a new Windows pod whose "
        "build is not fixed that may land on Windows Server 2022 (build 10.0.20348) is admitted "
        "without the redirection-wait init container (ImageUnavailable): its containers may "
        "start before istio-cni redirects it, and its traffic then bypasses ztunnel. Build it "
        "with `make images REGISTRY=<registry>` (docs/images.md), then set "
        "spec.images.registry (or the chart's value registry) to that registry, or set "
        "spec.newPodWorkaround.multiBuildImage to an image of your own"
    ]
    # With the workaround off no pod would get the image: nothing to say of it.
    off = render(spec={"newPodWorkaround": {"enabled": False}})
    assert len([w for w in off.warnings if "make images" in w]) == 2  # the agents only
    assert not [w for w in off.warnings if "init container" in w], off.warnings


def test_per_build_image_applies_to_its_build_only() -> None:
    result = render(spec={"images": {"istioCni": {"windowsBuilds": {WS2025: "r.example/c:25"}}}})
    assert pod(result, "istio-cni-node-windows-ltsc2025")["containers"][0]["image"] == (
        "r.example/c:25"
    )
    assert pod(result, "istio-cni-node-windows-ltsc2022")["containers"][0]["image"] == (
        "docker.io/istio/install-cni-windows:1.31.0"
    )
    assert pod(result, "istio-cni-node")["containers"][0]["image"] == (
        "docker.io/istio/install-cni:1.31.0"
    )


def test_revision_and_address_choose_the_istiod_endpoint() -> None:
    result = render(spec={"namespace": "mesh", "istiod": {"revision": "canary"}})
    assert env(pod(result, "ztunnel")["containers"][0])["CA_ADDRESS"] == (
        "istiod-canary.mesh.svc:15012"
    )
    assert env(pod(result, "ztunnel-windows-ltsc2022")["containers"][0])["ALT_CA_HOSTNAME"] == (
        "istiod-canary.mesh.svc"
    )
    result = render(spec={"istiod": {"address": "istiod.example.com:443"}}, istiod_ip=None)
    for name in ("ztunnel", "ztunnel-windows-ltsc2022"):
        variables = env(pod(result, name)["containers"][0])
        assert variables["CA_ADDRESS"] == variables["XDS_ADDRESS"] == "istiod.example.com:443"
        assert "ALT_CA_HOSTNAME" not in variables
    assert not any("istiod" in w for w in result.warnings)


def test_ipv6_istiod_address_is_bracketed() -> None:
    variables = env(pod(render(istiod_ip="fd00::20"), "ztunnel-windows-ltsc2022")["containers"][0])
    assert variables["CA_ADDRESS"] == "[fd00::20]:15012"


@pytest.mark.parametrize("istiod_ip", [None, "None", "not-an-ip"])
def test_unknown_istiod_ip_falls_back_to_the_name_and_warns(istiod_ip: str | None) -> None:
    result = render(spec={"clusterDomain": "corp.example"}, istiod_ip=istiod_ip)
    variables = env(pod(result, "ztunnel-windows-ltsc2022")["containers"][0])
    assert variables["CA_ADDRESS"] == "istiod.istio-system.svc.corp.example:15012"
    assert variables["ALT_CA_HOSTNAME"] == "istiod.istio-system.svc"
    (warning,) = [w for w in result.warnings if "Service IP" in w]
    assert "istiod Service IP unknown" in warning


def test_unknown_dns_ip_skips_the_nrpt_rule_and_warns() -> None:
    result = render(dns_ip=None)
    assert "initContainers" not in pod(result, "ztunnel-windows-ltsc2022")
    (warning,) = [w for w in result.warnings if "Service IP" in w]
    assert "DNS Service IP unknown" in warning


def test_no_windows_agents_means_no_windows_warnings() -> None:
    result = render(nodes=(linux("l1"),), istiod_ip=None, dns_ip=None)
    assert result.warnings == ()


def test_nothing_cluster_specific_is_hard_coded() -> None:
    spec = {
        "namespace": "mesh-x",
        "clusterDomain": "corp.example",
        "trustDomain": "corp.example",
        "istiod": {"serviceName": "control"},
    }
    text = output.to_yaml(render(spec=spec, istiod_ip="192.0.2.7", dns_ip="192.0.2.53").objects)
    assert "cluster.local" not in text
    assert "istio-system" not in text
    assert "istiod." not in text and "istiod-" not in text.replace("istiod-ca-cert", "")
    assert set(re.findall(r"\b\d+\.\d+\.\d+\.\d+\b", text)) == {"192.0.2.7", "192.0.2.53"}
    assert "control.mesh-x.svc" in text


def test_unlabeled_windows_nodes_are_selected_by_name() -> None:
    nodes = (
        windows("w-a", WS2022),
        windows("w-c", WS2022, labeled=False),
        windows("w-b", WS2022, labeled=False),
    )
    result = render(nodes=nodes)
    spec = pod(result, "ztunnel-windows-ltsc2022")
    assert spec["nodeSelector"] == {c.LABEL_OS: "windows", c.LABEL_ARCH: "amd64"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": c.LABEL_WINDOWS_BUILD, "operator": "In", "values": [WS2022]}
            ]
        },
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w-b"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w-c"]}]},
    ]
    assert result.daemonsets[-1].nodes == ("w-a", "w-b", "w-c")


def test_spec_builds_are_rendered_even_without_nodes() -> None:
    result = render(nodes=(linux("l1"),), spec={"platforms": {"windows": {"builds": [WS2025]}}})
    assert [d.name for d in result.daemonsets] == [
        "istio-cni-node",
        "ztunnel",
        "istio-cni-node-windows-ltsc2025",
        "ztunnel-windows-ltsc2025",
    ]
    assert result.daemonsets[-1].nodes == ()


def test_builds_not_listed_get_no_agent() -> None:
    result = render(spec={"platforms": {"windows": {"builds": [WS2022]}}})
    assert "DaemonSet/ztunnel-windows-ltsc2025" not in names(result)
    verdict = next(v for v in result.verdicts if v.node == "w25")
    assert verdict.reason == "WindowsBuildNotEnabled"


def test_windows_disabled_renders_nothing_for_windows() -> None:
    result = render(spec={"platforms": {"windows": {"enabled": False}}})
    assert not any("windows" in n for n in names(result))
    assert {v.node: v.reason for v in result.verdicts if not v.supported} == {
        "w22": "PlatformDisabled",
        "w25": "PlatformDisabled",
    }
    role = obj(result, "ClusterRole", "istio-cni")
    assert role["rules"][-1]["resourceNames"] == ["istio-cni-node"]


def test_linux_disabled_renders_only_windows() -> None:
    result = render(spec={"platforms": {"linux": {"enabled": False}}})
    assert "ServiceAccount/ztunnel" not in names(result)
    assert "DaemonSet/ztunnel" not in names(result)
    assert "DaemonSet/ztunnel-windows-ltsc2022" in names(result)


def test_linux_agents_exist_before_any_linux_node() -> None:
    result = render(nodes=())
    assert [d.name for d in result.daemonsets] == ["istio-cni-node", "ztunnel"]


def test_everything_disabled_renders_nothing() -> None:
    result = render(
        spec={"platforms": {"linux": {"enabled": False}, "windows": {"enabled": False}}}
    )
    assert result.objects == ()
    assert [v.reason for v in result.verdicts] == ["PlatformDisabled"] * len(MIXED)


def test_user_selector_and_tolerations_exclude_nodes() -> None:
    nodes = (
        linux("l-in"),
        NodeFacts(
            "l-tainted",
            "linux",
            "amd64",
            None,
            False,
            {c.LABEL_OS: "linux", c.LABEL_ARCH: "amd64", "pool": "mesh"},
            (Taint("gpu", None, "NoSchedule"),),
        ),
        NodeFacts(
            "l-pool",
            "linux",
            "amd64",
            None,
            False,
            {c.LABEL_OS: "linux", c.LABEL_ARCH: "amd64", "pool": "mesh"},
        ),
    )
    result = render(
        nodes=nodes,
        spec={
            "platforms": {
                "linux": {
                    "nodeSelector": {"pool": "mesh"},
                    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                }
            }
        },
    )
    verdicts = {v.node: v for v in result.verdicts}
    assert verdicts["l-pool"].supported
    assert verdicts["l-in"].reason == "ExcludedBySpec"
    assert "pool=mesh" in (verdicts["l-in"].message or "")
    assert verdicts["l-tainted"].reason == "ExcludedBySpec"
    assert "gpu:NoSchedule" in (verdicts["l-tainted"].message or "")
    spec = pod(result, "ztunnel")
    assert spec["nodeSelector"] == {c.LABEL_OS: "linux", "pool": "mesh"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]


def test_node_affinity_narrows_the_linux_agents_and_the_verdicts_say_why() -> None:
    pool = NodeFacts(
        "l-pool", "linux", "amd64", None, False,
        {c.LABEL_OS: "linux", c.LABEL_ARCH: "amd64", "pool": "mesh"},
    )  # fmt: skip
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mesh"]}]}
    result = render(
        nodes=(pool, linux("l-other")), spec={"platforms": {"linux": {"nodeAffinity": [term]}}}
    )
    verdicts = {v.node: v for v in result.verdicts}
    assert verdicts["l-pool"].supported
    assert (verdicts["l-other"].reason, verdicts["l-other"].message) == (
        "ExcludedBySpec",
        "the node matches none of the terms of spec.platforms.linux.nodeAffinity",
    )
    for name in ("ztunnel", "istio-cni-node"):
        assert pod(result, name)["affinity"] == {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": c.LABEL_ARCH,
                                    "operator": "In",
                                    "values": ["amd64", "arm64"],
                                },
                                {"key": "pool", "operator": "In", "values": ["mesh"]},
                            ]
                        }
                    ]
                }
            }
        }


def test_user_env_never_overrides_what_the_operator_sets() -> None:
    env = {"AMBIENT_ENABLED": "false", "INPOD_UDS": "/tmp/x", "CUSTOM": "1"}
    result = render(spec={"istioCni": {"env": env}, "ztunnel": {"env": env}})
    config = obj(result, "ConfigMap", "istio-cni-config")
    # Written once, the operator's value: a ConfigMap key wins over the user's env.
    assert (config["data"]["AMBIENT_ENABLED"], config["data"]["CUSTOM"]) == ("true", "1")
    cni_env = {
        e["name"]: e.get("value") for e in pod(result, "istio-cni-node")["containers"][0]["env"]
    }
    assert cni_env["CUSTOM"] == "1" and "AMBIENT_ENABLED" not in cni_env
    ztunnel_env = [e["name"] for e in pod(result, "ztunnel")["containers"][0]["env"]]
    assert ztunnel_env.count("INPOD_UDS") == 1 and "CUSTOM" in ztunnel_env
    assert (
        "spec.istioCni.env sets AMBIENT_ENABLED, which the operator sets itself on "
        "istio-cni-node: left out; use the AmbientMesh field that sets it instead"
    ) in result.warnings
    assert (
        "spec.ztunnel.env sets INPOD_UDS, which the operator sets itself on ztunnel: left out; "
        "use the AmbientMesh field that sets it instead"
    ) in result.warnings


def test_rbac_is_least_privilege() -> None:
    result = render()
    role = obj(result, "ClusterRole", "istio-cni")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods", "namespaces", "nodes"],
            "verbs": ["get", "list", "watch"],
        },
        # Repair's Events about the pods it mends.
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            # The one name the agent looks up; the Windows agents skip it.
            "resourceNames": ["istio-cni-node"],
            "verbs": ["get"],
        },
    ]
    binding = obj(result, "ClusterRoleBinding", "istio-cni")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "istio-cni",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "istio-cni", "namespace": "istio-system"}
    ]
    # ztunnel needs no Kubernetes API access at all.
    for name in ("ztunnel", "ztunnel-windows"):
        assert obj(result, "ServiceAccount", name)["automountServiceAccountToken"] is False
    assert "automountServiceAccountToken" not in obj(result, "ServiceAccount", "istio-cni")


def test_inventory_counts_and_examples() -> None:
    nodes = (
        *MIXED,
        *(windows(f"old-{i:02}", c.BUILD_WS2019) for i in range(25)),
        NodeFacts("mystery", "windows", "amd64", None, False, {}),
    )
    inventory = render(nodes=nodes).inventory()
    assert (inventory.total, inventory.linux, inventory.windows) == (30, 2, 28)
    assert (inventory.supported, inventory.unsupported) == (4, 26)
    assert [(b.build, b.release, b.nodes, b.supported) for b in inventory.windows_builds] == [
        (c.BUILD_WS2019, "Windows Server 2019", 25, False),
        (WS2022, "Windows Server 2022", 1, True),
        (WS2025, "Windows Server 2025", 1, True),
        ("unknown", "unknown", 1, False),
    ]
    assert len(inventory.unsupported_nodes) == 20
    assert [(n.name, n.reason) for n in inventory.unsupported_nodes[:2]] == [
        ("mystery", "WindowsBuildUnknown"),
        ("old-00", "WindowsBuildUnsupported"),
    ]


def test_the_verdicts_are_tallied_once_for_every_reader() -> None:
    nodes = (
        *MIXED,
        *(windows(f"old-{i:02}", c.BUILD_WS2019) for i in range(3)),
        NodeFacts("mystery", "windows", "amd64", None, False, {}),
    )
    result = render(nodes=nodes)
    tally = result.tally
    assert result.tally is tally  # the status, the metrics and the problems read one walk
    assert tally.counts == {
        ("linux", None, True): 2,
        ("windows", WS2022, True): 1,
        ("windows", WS2025, True): 1,
        ("windows", c.BUILD_WS2019, False): 3,
        ("windows", None, False): 1,
    }
    assert (tally.nodes(), tally.nodes("linux"), tally.nodes("windows")) == (8, 2, 6)
    assert [v.node for v in tally.unsupported] == ["mystery", "old-00", "old-01", "old-02"]
    assert tally.windows_served == ("w22", "w25")
    assert result.unsupported() == tally.unsupported


def test_sample_inventory_plan() -> None:
    result = render(
        nodes=tuple(load_nodes(REPO / "operator/ambient_operator/samples/nodes-mixed.yaml"))
    )
    assert {d.name: d.nodes for d in result.daemonsets} == {
        "istio-cni-node": ("linux-amd64-1", "linux-amd64-2", "linux-arm64-1"),
        "ztunnel": ("linux-amd64-1", "linux-amd64-2", "linux-arm64-1"),
        "istio-cni-node-windows-ltsc2022": ("win2022-1",),
        "ztunnel-windows-ltsc2022": ("win2022-1",),
        "istio-cni-node-windows-ltsc2025": ("win2025-1",),
        "ztunnel-windows-ltsc2025": ("win2025-1",),
    }
    assert [(v.node, v.reason) for v in result.unsupported()] == [
        ("win2019-1", "WindowsBuildUnsupported")
    ]


def test_unlabeled_inventory_file_renders_name_terms() -> None:
    result = render(nodes=tuple(load_nodes(INVENTORIES / "windows-unlabeled.yaml")))
    terms = pod(result, "ztunnel-windows-ltsc2025")["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[1]["matchFields"][0]["values"] == ["win2025-osimage"]


# -- templates ---------------------------------------------------------------


def test_templates_refuse_undefined_values() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render_object("serviceaccount.yaml.j2", name="x", namespace="y")


def test_a_rendered_object_is_the_callers_own_and_follows_its_values() -> None:
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "x", "namespace": "y", "labels": {"a": "1"}},
        "automountServiceAccountToken": False,
    }
    values = {
        "name": "x",
        "namespace": "y",
        "labels": {"a": "1"},
        "automount": False,
        "pull_secrets": [],
        "annotations": {},
    }
    first = render_object("serviceaccount.yaml.j2", **values)
    assert first == sa
    first["metadata"]["labels"]["a"] = "changed by the caller"
    # Rendered again from the same values (kept since the first): unchanged by the caller.
    assert render_object("serviceaccount.yaml.j2", **values) == sa
    moved = render_object("serviceaccount.yaml.j2", **(values | {"labels": {"a": "2"}}))
    assert moved["metadata"]["labels"] == {"a": "2"}
    assert "automountServiceAccountToken" not in render_object(
        "serviceaccount.yaml.j2", **(values | {"automount": True})
    )
    # Values JSON cannot key (a set) are rendered each time, the same way.
    unkeyed = render_object("serviceaccount.yaml.j2", **(values | {"automount": {"x"}}))
    assert "automountServiceAccountToken" not in unkeyed


@pytest.mark.parametrize("template", MY_TEMPLATES)
def test_templates_fit_on_a_screen(template: str) -> None:
    lines = (REPO / "templates" / template).read_text().splitlines()
    assert len(lines) <= 60
    assert max(len(line) for line in lines) <= 100


def test_values_with_yaml_syntax_stay_strings() -> None:
    # tojson quoting: a tag like "1.30" or "yes" must not turn into a number or bool.
    result = render(spec={"images": {"tag": "1.30"}, "namespace": "yes"})
    data = obj(result, "ConfigMap", "istio-cni-config")
    assert data["data"]["CURRENT_AGENT_VERSION"] == "1.30"
    assert data["metadata"]["namespace"] == "yes"
