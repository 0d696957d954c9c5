"""The Windows agents against Istio's Windows experiment.

The reference is the `experimental-windows-ambient` branch of istio/istio
(e245938ea60, 2026-08-14) and of istio/ztunnel (c4094652, 2026-03-30). The
tables below were read from those branches by hand and are literal data: which
environment variables each agent reads and where, what the agents cannot work
without, and what the branch's one Windows manifest (ztunnel's
daemonset-windows.yaml) sets. The objects come from rendering the sample mixed
inventory; tests/data/upstream-differences/windows.yaml explains each key we
set, and these tests keep the two in step.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cli.main import main
from ambient_operator.cli.render import load_nodes
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.render import RenderResult, render_dataplane
from render_cases import DNS_IP, ISTIOD_IP, REPO, SAMPLE_NODES
from upstream_diff import generator

ISTIO = "istio/istio@experimental-windows-ambient:"
ZTUNNEL = "istio/ztunnel@experimental-windows-ambient:"
TABLE = REPO / "tests" / "data" / "upstream-differences" / "windows.yaml"
PIPE = "\\\\.\\pipe\\istio-zds"
ABSENT = "(absent)"

# What install-cni.exe reads. cni/pkg/cmd/root.go reads its settings through
# viper with AutomaticEnv (env name = flag name of cni/pkg/constants, upper
# case, dashes to underscores); the node agent registers a few of its own.
CNI_READS = {
    name: ISTIO + "cni/pkg/cmd/root.go"
    for name in (
        "AMBIENT_DISABLE_SAFE_UPGRADE",
        "AMBIENT_DNS_CAPTURE",
        "AMBIENT_ENABLED",
        "AMBIENT_ENABLEMENT_SELECTOR",
        "AMBIENT_IPV6",
        "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
        "CHAINED_CNI_PLUGIN",
        "CNI_AGENT_RUN_DIR",
        "CNI_CONF_GROUP_READ",
        "CNI_CONF_NAME",
        "ENABLE_AMBIENT_DETECTION_RETRY",
        "EXCLUDE_NAMESPACES",
        "FORCE_IPTABLES_BINARY",
        "ISTIO_OWNED_CNI_CONFIG",
        "ISTIO_OWNED_CNI_CONFIG_FILENAME",
        "KUBE_CA_FILE",
        "KUBECONFIG_MODE",
        "KUBERNETES_NODE_NAME",
        "MONITORING_PORT",
        "MOUNTED_CNI_BIN_DIR",
        "MOUNTED_CNI_NET_DIR",
        "NATIVE_NFTABLES",
        "POD_NAMESPACE",
        "REPAIR_DELETE_PODS",
        "REPAIR_ENABLED",
        "REPAIR_LABEL_PODS",
        "REPAIR_NODE_NAME",
        "REPAIR_REPAIR_PODS",
        "SKIP_TLS_VERIFY",
        "ZTUNNEL_UDS_ADDRESS",
    )
} | {
    name: ISTIO + "cni/pkg/nodeagent/options.go"
    for name in ("NODE_NAME", "POD_NAME", "REVISION", "SYSTEM_NAMESPACE")
}
# What ztunnel.exe reads.
ZTUNNEL_READS = {
    name: ZTUNNEL + "src/config.rs"
    for name in (
        "ALT_CA_HOSTNAME",
        "ALT_XDS_HOSTNAME",
        "CA_ADDRESS",
        "CLUSTER_DOMAIN",
        "CLUSTER_ID",
        "INPOD_PORT_REUSE",
        "INPOD_UDS",
        "IPV6_ENABLED",
        "ISTIO_META_CLUSTER_ID",
        "NETWORK",
        "NODE_NAME",
        "POD_NAME",
        "POD_NAMESPACE",
        "REVISION",
        "SERVICE_ACCOUNT",
        "TERMINATION_GRACE_PERIOD_SECONDS",
        "TRUST_DOMAIN",
        "USE_ENV_FOR_DEFAULT_ISTIOD_ADDR",
        "XDS_ADDRESS",
        "ZTUNNEL_CPU_LIMIT",
        "ZTUNNEL_WORKER_THREADS",
    )
} | {
    "INSTANCE_IP": ZTUNNEL + "src/xds/client.rs",
    "RUST_LOG": ZTUNNEL + "src/telemetry.rs",
    "LOG_FORMAT": ZTUNNEL + "src/telemetry.rs",
}
# Read by the language runtime rather than the branch's code; the branch's
# manifests set them.
RUNTIME_READS = {
    "GOMEMLIMIT": ISTIO + "manifests/charts/istio-cni/templates/daemonset.yaml",
    "GOMAXPROCS": ISTIO + "manifests/charts/istio-cni/templates/daemonset.yaml",
    "RUST_BACKTRACE": ZTUNNEL + "daemonset-windows.yaml",
}

# Settings the agents cannot work without on Windows, with the value they need.
CNI_REQUIRED_DATA = {
    "AMBIENT_ENABLED": "true",  # else no node agent at all
    "ZTUNNEL_UDS_ADDRESS": PIPE,  # default: a Unix socket path
    "MOUNTED_CNI_BIN_DIR": "C:\\k\\azurecni\\bin",  # default /host/opt/cni/bin
    "MOUNTED_CNI_NET_DIR": "C:\\k\\azurecni\\netconf",  # default /host/etc/cni/net.d
}
CNI_REQUIRED_ENV = {
    "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},  # informers.go
    "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
}
# The chart's default enablementSelectors (manifests/charts/istio-cni/values.yaml).
ENABLEMENT_SELECTORS = [
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
ZTUNNEL_REQUIRED_ENV = {
    "INPOD_UDS": PIPE,
    "INPOD_PORT_REUSE": "false",  # src/inpod/windows/config.rs refuses true, the default
    "IPV6_ENABLED": "false",
    "CA_ADDRESS": f"{ISTIOD_IP}:15012",  # the default name is unresolvable from the host
    "XDS_ADDRESS": f"{ISTIOD_IP}:15012",
    "ALT_CA_HOSTNAME": "istiod.istio-system.svc",
    "ALT_XDS_HOSTNAME": "istiod.istio-system.svc",
}
# ztunnel's own identity needs all three (src/config.rs), or it has none.
ZTUNNEL_IDENTITY_ENV = ("POD_NAME", "POD_NAMESPACE", "SERVICE_ACCOUNT")

# Everything ztunnel@experimental-windows-ambient:daemonset-windows.yaml sets in
# its container: env values (fieldRefs as "fieldRef <path>") and mount paths.
BRANCH_ZTUNNEL_ENV = {
    "ALT_XDS_HOSTNAME": "istiod-1-25-0.istio-system.svc",
    "ALT_CA_HOSTNAME": "istiod-1-25-0.istio-system.svc",
    "USE_ENV_FOR_DEFAULT_ISTIOD_ADDR": "true",
    "REVISION": "1-25-0",
    "RUST_LOG": "trace",
    "RUST_BACKTRACE": "1",
    "ISTIO_META_CLUSTER_ID": "Kubernetes",
    "INPOD_ENABLED": "true",
    "INPOD_UDS": PIPE,
    "INPOD_PORT_REUSE": "false",
    "TERMINATION_GRACE_PERIOD_SECONDS": "30",
    "IPV6_ENABLED": "false",
    "POD_NAME": "fieldRef metadata.name",
    "POD_NAMESPACE": "fieldRef metadata.namespace",
    "NODE_NAME": "fieldRef spec.nodeName",
    "INSTANCE_IP": "fieldRef status.podIP",
    "SERVICE_ACCOUNT": "fieldRef spec.serviceAccountName",
}
BRANCH_ZTUNNEL_MOUNTS = (
    "/var/run/secrets/istio",
    "/var/run/secrets/tokens",
    "/var/run/ztunnel",
    "/tmp",
)
# ztunnel reads ./var/run/secrets/istio/root-cert.pem and
# ./var/run/secrets/tokens/istio-token, relative to the HostProcess working folder.
ZTUNNEL_ROOT_CERT_DIR = "/var/run/secrets/istio"
ZTUNNEL_TOKEN_DIR, ZTUNNEL_TOKEN_FILE = "/var/run/secrets/tokens", "istio-token"

# On shutdown the agent gets the DaemonSet "istio-cni" + "-node" of its
# namespace (cni/pkg/cmd/root.go, cni/pkg/nodeagent/server.go); no other name.
CNI_SELF_DAEMONSET = "istio-cni-node"

# Image names the branch's build gives (tools/docker.yaml) and their Dockerfiles.
DEFAULT_ZTUNNEL_IMAGE = "docker.io/istio/ztunnel-windows:1.31.0"
DEFAULT_CNI_IMAGE = "docker.io/istio/install-cni-windows:1.31.0"
# What builds them (issue 41): the warning names the command and the field to set.
BUILD_THEM = "Build it with `make images REGISTRY=<registry>` (docs/images.md)"

BUILDS = {"ltsc2022": "10.0.20348", "ltsc2025": "10.0.26100"}


def cm_name(tag: str) -> str:
    return f"istio-cni-config-windows-{tag}"


def cni_name(tag: str) -> str:
    return f"istio-cni-node-windows-{tag}"


def ztunnel_name(tag: str) -> str:
    return f"ztunnel-windows-{tag}"


def render(spec: dict[str, Any] | None = None) -> RenderResult:
    facts = ClusterFacts(tuple(load_nodes(SAMPLE_NODES)), ISTIOD_IP, DNS_IP)
    return render_dataplane(AmbientMeshSpec.model_validate(spec or {}), facts)


@pytest.fixture(scope="module")
def rendered() -> RenderResult:
    return render()


def find(result: RenderResult, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in result.objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name} rendered {len(found)} times"
    return found[0]


def pod_spec(result: RenderResult, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(result, "DaemonSet", name)["spec"]["template"]["spec"]
    return spec


def main_container(result: RenderResult, name: str) -> dict[str, Any]:
    (container,) = pod_spec(result, name)["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def show(value: Any) -> str:
    """An env value as the table writes it."""
    if isinstance(value, str):
        return value
    (kind, ref), *_ = value.items()
    return f"{kind} {ref.get('fieldPath', ref.get('resource'))}"


def fields(obj: dict[str, Any]) -> dict[str, str | None]:
    """The keys an object of ours sets, as the table names them, with their value."""
    if obj["kind"] == "ConfigMap":
        return {f"data.{k}": v for k, v in obj["data"].items()}
    spec = obj["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    out: dict[str, str | None] = {"image": container["image"]}
    if "command" in container:
        out["command"] = " ".join(container["command"])
    if "args" in container:
        out["args"] = " ".join(container["args"])
    out |= {f"env.{k}": show(v) for k, v in env_of(container).items()}
    out |= {f"volumeMounts.{m['mountPath']}": None for m in container.get("volumeMounts", [])}
    for init in spec.get("initContainers", []):
        prefix = f"initContainers.{init['name']}"
        out[f"{prefix}.image"] = init["image"]
        out[f"{prefix}.command"] = " ".join(init["command"])
        out |= {f"{prefix}.env.{k}": show(v) for k, v in env_of(init).items()}
    return out


def resolve(obj: dict[str, Any], path: str) -> Any:
    """The value at a dotted path, or ABSENT."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


@pytest.fixture(scope="module")
def rows() -> list[Any]:
    # The generator's loader checks the shape (keys, reasons, no repeats).
    entries: list[Any] = generator().load_table(TABLE)
    return entries


def windows_objects(result: RenderResult, tag: str) -> list[dict[str, Any]]:
    return [
        find(result, "ConfigMap", cm_name(tag)),
        find(result, "DaemonSet", cni_name(tag)),
        find(result, "DaemonSet", ztunnel_name(tag)),
    ]


# -- what the agents read --------------------------------------------------


@pytest.mark.parametrize("tag", BUILDS)
def test_every_istio_cni_setting_is_one_the_agent_reads(rendered: RenderResult, tag: str) -> None:
    data = find(rendered, "ConfigMap", cm_name(tag))["data"]
    variables = env_of(main_container(rendered, cni_name(tag)))
    known = CNI_READS | RUNTIME_READS
    assert sorted(set(data) - set(known)) == []
    assert sorted(set(variables) - set(known)) == []
    assert not set(data) & set(variables), "a setting is given twice"


@pytest.mark.parametrize("tag", BUILDS)
def test_every_ztunnel_variable_is_one_ztunnel_reads(rendered: RenderResult, tag: str) -> None:
    variables = env_of(main_container(rendered, ztunnel_name(tag)))
    assert sorted(set(variables) - set(ZTUNNEL_READS | RUNTIME_READS)) == []


@pytest.mark.parametrize("tag", BUILDS)
def test_istio_cni_gets_what_it_cannot_work_without(rendered: RenderResult, tag: str) -> None:
    data = find(rendered, "ConfigMap", cm_name(tag))["data"]
    for key, value in CNI_REQUIRED_DATA.items():
        assert data.get(key) == value, key
    # The agent parses it with sigs.k8s.io/yaml (cni/pkg/cmd/root.go).
    assert yaml.safe_load(data["AMBIENT_ENABLEMENT_SELECTOR"]) == ENABLEMENT_SELECTORS
    variables = env_of(main_container(rendered, cni_name(tag)))
    for name, value in CNI_REQUIRED_ENV.items():
        assert variables.get(name) == value, name


@pytest.mark.parametrize("tag", BUILDS)
def test_ztunnel_gets_what_it_cannot_work_without(rendered: RenderResult, tag: str) -> None:
    spec = pod_spec(rendered, ztunnel_name(tag))
    variables = env_of(main_container(rendered, ztunnel_name(tag)))
    for name, value in ZTUNNEL_REQUIRED_ENV.items():
        assert variables.get(name) == value, name
    assert all(name in variables for name in ZTUNNEL_IDENTITY_ENV)
    grace = variables["TERMINATION_GRACE_PERIOD_SECONDS"]
    assert grace == str(spec["terminationGracePeriodSeconds"])


@pytest.mark.parametrize("tag", BUILDS)
def test_ztunnel_finds_its_root_cert_and_token(rendered: RenderResult, tag: str) -> None:
    spec = pod_spec(rendered, ztunnel_name(tag))
    mounts = {
        m["mountPath"]: m["name"]
        for m in main_container(rendered, ztunnel_name(tag))["volumeMounts"]
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[ZTUNNEL_ROOT_CERT_DIR]]["configMap"] == {"name": "istio-ca-root-cert"}
    (source,) = volumes[mounts[ZTUNNEL_TOKEN_DIR]]["projected"]["sources"]
    assert source["serviceAccountToken"]["path"] == ZTUNNEL_TOKEN_FILE
    assert source["serviceAccountToken"]["audience"] == "istio-ca"


@pytest.mark.parametrize("tag", BUILDS)
def test_entry_points_are_the_images_own(rendered: RenderResult, tag: str) -> None:
    ztunnel = main_container(rendered, ztunnel_name(tag))
    assert "command" not in ztunnel  # ENTRYPOINT ztunnel.exe
    assert ztunnel["args"] == ["proxy", "ztunnel"]
    cni = main_container(rendered, cni_name(tag))
    assert "command" not in cni  # ENTRYPOINT /install-cni.exe
    assert cni["args"] == ["--log_output_level=info"]  # spec.logLevel's default
    assert "volumes" not in pod_spec(rendered, cni_name(tag))


@pytest.mark.parametrize("tag", BUILDS)
def test_the_cluster_dns_rule_reads_its_variables(rendered: RenderResult, tag: str) -> None:
    (init,) = pod_spec(rendered, ztunnel_name(tag))["initContainers"]
    script = " ".join(init["args"])
    assert env_of(init) == {"DNS_SUFFIX": ".cluster.local", "DNS_IP": DNS_IP}
    assert "$env:DNS_SUFFIX" in script and "$env:DNS_IP" in script


# -- the shutdown lookup (issue 13, item 8b) -------------------------------


@pytest.mark.parametrize("tag", BUILDS)
def test_windows_agents_never_depend_on_a_daemonset_they_cannot_find(
    rendered: RenderResult, tag: str
) -> None:
    # The agent looks up istio-cni-node, which is not its DaemonSet; safe
    # upgrade off makes it remove its plugin on every shutdown instead.
    assert cni_name(tag) != CNI_SELF_DAEMONSET
    data = find(rendered, "ConfigMap", cm_name(tag))["data"]
    assert data["AMBIENT_DISABLE_SAFE_UPGRADE"] == "true"


def _daemonset_rule(result: RenderResult) -> list[str] | None:
    role = find(result, "ClusterRole", "istio-cni")
    rules = [r for r in role["rules"] if "daemonsets" in r["resources"]]
    if not rules:
        return None
    (rule,) = rules
    assert rule["verbs"] == ["get"]
    names: list[str] = rule["resourceNames"]
    return names


def test_istio_cni_may_get_only_the_daemonset_the_agent_asks_for(rendered: RenderResult) -> None:
    assert _daemonset_rule(rendered) == [CNI_SELF_DAEMONSET]
    windows_only = render({"platforms": {"linux": {"enabled": False}}})
    assert _daemonset_rule(windows_only) is None


# -- images (issue 13, item 9) ---------------------------------------------


def test_default_images_are_the_branch_names_with_a_warning(rendered: RenderResult) -> None:
    for tag in BUILDS:
        assert main_container(rendered, ztunnel_name(tag))["image"] == DEFAULT_ZTUNNEL_IMAGE
        assert main_container(rendered, cni_name(tag))["image"] == DEFAULT_CNI_IMAGE
    (ztunnel,) = [w for w in rendered.warnings if DEFAULT_ZTUNNEL_IMAGE in w]
    assert "spec.images.ztunnel.windows" in ztunnel and BUILD_THEM in ztunnel
    (cni,) = [w for w in rendered.warnings if DEFAULT_CNI_IMAGE in w]
    assert "spec.images.istioCni.windows" in cni and BUILD_THEM in cni


def test_setting_the_windows_images_silences_the_warning() -> None:
    images = {
        "ztunnel": {"windows": "registry.example.com/zt:win"},
        "istioCni": {"windows": "registry.example.com/cni:win"},
    }
    result = render({"images": images})
    assert (
        main_container(result, ztunnel_name("ltsc2025"))["image"] == "registry.example.com/zt:win"
    )
    assert not [w for w in result.warnings if ".windows" in w]
    # The redirection-wait image is another matter: no registry names it.
    assert [w.split(":")[0] for w in result.warnings if "images" in w] == [
        "spec.newPodWorkaround.multiBuildImage is unset, and so is spec.images.registry"
    ]


def test_a_build_left_out_of_windows_builds_still_warns() -> None:
    images = {"ztunnel": {"windowsBuilds": {"10.0.26100": "registry.example.com/zt:25"}}}
    result = render({"images": images})
    (warning,) = [w for w in result.warnings if DEFAULT_ZTUNNEL_IMAGE in w]
    assert "10.0.20348" in warning and "10.0.26100" not in warning


def test_render_prints_the_image_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["render", "--nodes", str(SAMPLE_NODES), "--istiod-ip", ISTIOD_IP, "--dns-ip", DNS_IP]
    )
    _, err = capsys.readouterr()
    assert code == 0
    assert f"warning: {DEFAULT_ZTUNNEL_IMAGE}" not in err  # the field leads, not the name
    assert "spec.images.ztunnel.windows" in err and "spec.images.istioCni.windows" in err


# -- the table of differences -----------------------------------------------


@pytest.mark.parametrize("tag", ["ltsc2025"])
def test_both_builds_set_the_same_keys(rendered: RenderResult, tag: str) -> None:
    for ours, reference in zip(
        windows_objects(rendered, tag), windows_objects(rendered, "ltsc2022"), strict=True
    ):
        assert sorted(fields(ours)) == sorted(fields(reference))


def test_the_table_has_a_row_for_every_key_we_set(rendered: RenderResult, rows: list[Any]) -> None:
    named = {(r.object, r.field) for r in rows}
    missing = [
        f"{o['kind']}/{o['metadata']['name']} {field}"
        for o in windows_objects(rendered, "ltsc2022")
        for field in fields(o)
        if (f"{o['kind']}/{o['metadata']['name']}", field) not in named
    ]
    assert missing == []


def test_every_row_matches_what_we_render(rendered: RenderResult, rows: list[Any]) -> None:
    objects = {
        f"{o['kind']}/{o['metadata']['name']}": o for o in windows_objects(rendered, "ltsc2022")
    }
    wrong: list[str] = []
    for row in rows:
        if row.object == "ClusterRole/istio-cni":
            assert row.field == "rules.daemonsets.resourceNames"
            if row.ours != ", ".join(_daemonset_rule(rendered) or [ABSENT]):
                wrong.append(f"{row.object} {row.field}: ours is {_daemonset_rule(rendered)}")
            continue
        assert row.object in objects, f"{row.object}: not a Windows object we render"
        obj = objects[row.object]
        keys = fields(obj)
        if row.field.split(".")[0] in ("metadata", "spec"):
            present = resolve(obj, row.field) != ABSENT
        else:
            present = row.field in keys
        if present != (row.ours != ABSENT):
            state = "set" if present else "not set"
            wrong.append(f"{row.object} {row.field}: {state}, the row says {row.ours!r}")
        elif present and row.ours is not None and keys.get(row.field) not in (None, row.ours):
            wrong.append(
                f"{row.object} {row.field}: {keys[row.field]!r}, the row says {row.ours!r}"
            )
    assert wrong == []


def test_every_row_names_a_branch_file_and_a_setting_that_is_read(rows: list[Any]) -> None:
    for row in rows:
        assert row.source and row.source.startswith((ISTIO, ZTUNNEL)), row
        kind, _, name = row.field.partition(".")
        if kind not in ("env", "data") or row.ours == ABSENT:
            continue
        reads = ZTUNNEL_READS if row.object.startswith("DaemonSet/ztunnel") else CNI_READS
        assert name in reads or name in RUNTIME_READS, row


def test_every_setting_of_the_branch_manifest_has_a_row(rows: list[Any]) -> None:
    ztunnel = f"DaemonSet/{ztunnel_name('ltsc2022')}"
    named = {r.field for r in rows if r.object == ztunnel}
    wanted = [f"env.{name}" for name in BRANCH_ZTUNNEL_ENV]
    wanted += [f"volumeMounts.{path}" for path in BRANCH_ZTUNNEL_MOUNTS]
    assert [field for field in wanted if field not in named] == []
