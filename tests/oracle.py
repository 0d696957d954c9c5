"""An independent model of what the operator must do, for tests to judge it by.

Written from the facts of the field (shared DESIGN §1), the documentation in
docs/ and Kubernetes' own documented semantics, never from the operator's
code: nothing here imports ambient_operator (its render package, cluster/scheduling.py
and apply/plan.py least of all). Names and labels are spelled out as literals on
purpose. When the oracle and the operator disagree, one of them is wrong:
find out which from the documents, not by copying the operator's answer here.

It covers what the tests ask of it and no more:
- which platform (Linux, or a Windows build) each node belongs to, or the
  documented reason it gets no agent (docs/troubleshooting.md, node reasons);
- which data-plane objects a spec asks for, and which nodes each DaemonSet
  must land on;
- where a pod template may be scheduled, as the scheduler and the DaemonSet
  controller decide it (nodeSelector, required node affinity, taints);
- Events a namespace's labels deserve, the Accepted reason of a waypoint
  Gateway, and whether the API server takes an AmbientMesh spec or a Gateway.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OS_LABEL = "kubernetes.io/os"
ARCH_LABEL = "kubernetes.io/arch"
BUILD_LABEL = "node.kubernetes.io/windows-build"

WS2019, WS2022, WS2025 = "10.0.17763", "10.0.20348", "10.0.26100"
# The image tag suffix, and so the object name suffix, of each supported build.
SUPPORTED_BUILDS = {WS2022: "ltsc2022", WS2025: "ltsc2025"}
RELEASE_NAMES = {
    WS2019: "Windows Server 2019",
    WS2022: "Windows Server 2022",
    WS2025: "Windows Server 2025",
}
LINUX_ARCHES = ("amd64", "arm64")
WINDOWS_ARCHES = ("amd64",)

# Node reasons, docs/troubleshooting.md.
OS_UNKNOWN = "OperatingSystemUnknown"
ARCH_UNSUPPORTED = "ArchitectureUnsupported"
BUILD_UNKNOWN = "WindowsBuildUnknown"
BUILD_UNSUPPORTED = "WindowsBuildUnsupported"
PLATFORM_DISABLED = "PlatformDisabled"
BUILD_NOT_ENABLED = "WindowsBuildNotEnabled"
EXCLUDED = "ExcludedBySpec"
# Left out on purpose by the user: these do not make the mesh Degraded.
INTENDED = frozenset({PLATFORM_DISABLED, BUILD_NOT_ENABLED, EXCLUDED})

LINUX = "linux"

# What the DaemonSet controller adds to every daemon pod (Kubernetes docs,
# "DaemonSet: taints and tolerations"); the last one only with hostNetwork.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}
# The agents' own tolerations when the spec sets none (DESIGN §1: NoSchedule,
# CriticalAddonsOnly and NoExecute, each with Exists): every taint.
DEFAULT_TOLERATIONS = (
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"operator": "Exists", "effect": "NoExecute"},
)
# Windows agents always tolerate the taint mixed clusters put on Windows nodes.
WINDOWS_TAINT_TOLERATION = {
    "key": "os",
    "operator": "Equal",
    "value": "windows",
    "effect": "NoSchedule",
}


# -- nodes ------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _kernel_build(kernel: str | None) -> str | None:
    """`10.0.20348` of `10.0.20348.2762`: Windows kernel versions start with the build."""
    if not kernel:
        return None
    text = kernel.strip()
    match = re.match(r"10\.0\.(\d+)", text)
    if match is None:
        return None
    rest = text[match.end() :]
    if rest and not (rest[0] == "." or rest[0].isspace()):
        return None
    return f"10.0.{match.group(1)}"


@dataclass(frozen=True)
class Node:
    """A node as the data plane's placement must see it."""

    name: str
    labels: Mapping[str, str] = field(hash=False)
    taints: tuple[tuple[str, str | None, str], ...]
    os: str | None
    arch: str | None
    build: str | None

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> Node:
        """From a Node in API JSON form."""
        meta = node.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        info = (node.get("status") or {}).get("nodeInfo") or {}
        taints = tuple(
            (
                str(t.get("key") or ""),
                None if t.get("value") is None else str(t["value"]),
                str(t.get("effect") or ""),
            )
            for t in (node.get("spec") or {}).get("taints") or []
        )
        os_name = labels.get(OS_LABEL) or _text(info.get("operatingSystem"))
        arch = labels.get(ARCH_LABEL) or _text(info.get("architecture"))
        build = None
        if os_name == "windows":
            build = labels.get(BUILD_LABEL) or _kernel_build(_text(info.get("kernelVersion")))
            if build is None:
                image = str(info.get("osImage") or "")
                build = next((b for b, n in RELEASE_NAMES.items() if image.startswith(n)), None)
        return cls(str(meta["name"]), labels, taints, os_name, arch, build)


def _intrinsic(node: Node) -> str | None:
    """Why a node can never run the agents, whatever the spec says."""
    if node.os not in ("linux", "windows"):
        return OS_UNKNOWN
    if node.arch not in (LINUX_ARCHES if node.os == "linux" else WINDOWS_ARCHES):
        return ARCH_UNSUPPORTED
    if node.os == "linux":
        return None
    if node.build is None:
        return BUILD_UNKNOWN
    if node.build in SUPPORTED_BUILDS:
        return None
    number = re.fullmatch(r"10\.0\.(\d+)", node.build)
    older = number is not None and int(number.group(1)) < int(WS2022.rsplit(".", 1)[1])
    return BUILD_UNSUPPORTED if node.build == WS2019 or older else BUILD_UNKNOWN


# -- the spec -------------------------------------------------------------------------------


def _get(spec: Mapping[str, Any], *path: str, default: Any = None) -> Any:
    here: Any = spec
    for part in path:
        if not isinstance(here, Mapping) or part not in here:
            return default
        here = here[part]
    return default if here is None else here


def agents_namespace(spec: Mapping[str, Any]) -> str:
    """spec.namespace, default istio-system."""
    return str(_get(spec, "namespace", default="istio-system"))


# docs/ambientmesh-reference.md: spec.images.tag, spec.logLevel.
DEFAULT_TAG = "1.31.0"


def image_tag(spec: Mapping[str, Any]) -> str:
    """The tag every agent image carries when no image is overridden."""
    return str(_get(spec, "images", "tag", default=DEFAULT_TAG))


# Issue 41 and docs/images.md: `make images REGISTRY=<r>` pushes the Windows
# agents as <r>/ztunnel-windows and <r>/install-cni-windows tagged
# <istio VERSION>-exp.<istio commit[:8]>.<ztunnel commit[:8]> of the
# experiment's pair, and redirection-wait as <r>/redirection-wait:<operator
# version>, the project's version in pyproject.toml. Istio's hub has none of them.
WINDOWS_AGENT_TAG = "1.30-exp.e245938e.c4094652"
OPERATOR_VERSION = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
)["project"]["version"]
UPSTREAM_HUB = "docker.io/istio"


def bundled_registry(spec: Mapping[str, Any], default: str | None = None) -> str | None:
    """spec.images.registry, else the operator's default (the chart's value registry)."""
    return _get(spec, "images", "registry") or default


def redirection_wait_image(spec: Mapping[str, Any], default: str | None = None) -> str | None:
    """The multi-build image a pod whose build is not fixed gets; None: none is known
    (docs/windows-redirection-wait.md), and the pod is admitted without it."""
    explicit = _get(spec, "newPodWorkaround", "multiBuildImage")
    registry = bundled_registry(spec, default)
    image = explicit or (f"{registry}/redirection-wait:{OPERATOR_VERSION}" if registry else None)
    if image is None or image.startswith(f"{UPSTREAM_HUB}/"):
        return None
    return str(image)


def log_level(spec: Mapping[str, Any]) -> str:
    """spec.logLevel, default info."""
    return str(_get(spec, "logLevel", default="info"))


def cni_log_level(level: str) -> str:
    """istio-cni's --log_output_level: Istio's Go agents know no trace, debug is the nearest."""
    return "debug" if level == "trace" else level


def platform_tolerations(spec: Mapping[str, Any], os_name: str) -> list[dict[str, Any]]:
    """What the agents of one OS tolerate once the DaemonSet controller added its own."""
    user = _get(spec, "platforms", os_name, "tolerations")
    tolerations = [dict(t) for t in (DEFAULT_TOLERATIONS if user is None else user)]
    # istio-cni (and every Windows agent) uses the host network, so the
    # DaemonSet controller lets it onto nodes whose network is not ready; the
    # two agents of a node come as a pair, so ztunnel goes there too.
    extra = [HOST_NETWORK_TOLERATION]
    if os_name == "windows":
        extra.append(WINDOWS_TAINT_TOLERATION)
    return [*tolerations, *extra, *DAEMON_TOLERATIONS]


def verdict(node: Node, spec: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(platform, None) for a node that gets agents, else (None, reason)."""
    reason = _intrinsic(node)
    if reason is not None:
        return None, reason
    os_name = str(node.os)
    if not _get(spec, "platforms", os_name, "enabled", default=True):
        return None, PLATFORM_DISABLED
    builds = _get(spec, "platforms", "windows", "builds")
    if os_name == "windows" and builds is not None and node.build not in builds:
        return None, BUILD_NOT_ENABLED
    selector = _get(spec, "platforms", os_name, "nodeSelector", default={})
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return None, EXCLUDED
    if not tolerates_all(platform_tolerations(spec, os_name), node.taints):
        return None, EXCLUDED
    return (LINUX if os_name == "linux" else str(node.build)), None


def daemonset_names(platform: str) -> tuple[str, str]:
    """(istio-cni, ztunnel) DaemonSet names of a platform."""
    if platform == LINUX:
        return "istio-cni-node", "ztunnel"
    suffix = f"windows-{SUPPORTED_BUILDS[platform]}"
    return f"istio-cni-node-{suffix}", f"ztunnel-{suffix}"


def platforms(spec: Mapping[str, Any], nodes: Iterable[Node]) -> list[str]:
    """The platforms that get a DaemonSet pair: Linux even without Linux nodes (control
    planes are Linux), and the listed builds, or else the builds of nodes that get agents."""
    out = []
    if _get(spec, "platforms", "linux", "enabled", default=True):
        out.append(LINUX)
    if _get(spec, "platforms", "windows", "enabled", default=True):
        listed = _get(spec, "platforms", "windows", "builds")
        if listed is not None:
            out += sorted(set(listed))
        else:
            served = {verdict(n, spec)[0] for n in nodes}
            out += sorted(p for p in served if p not in (None, LINUX))  # type: ignore[misc]
    return out


def placement(spec: Mapping[str, Any], nodes: Iterable[Node]) -> dict[str, frozenset[str]]:
    """DaemonSet name -> the nodes it must run on."""
    nodes = list(nodes)
    served: dict[str, set[str]] = {p: set() for p in platforms(spec, nodes)}
    for node in nodes:
        platform, _ = verdict(node, spec)
        if platform is not None and platform in served:
            served[platform].add(node.name)
    return {
        name: frozenset(names) for platform, names in served.items()
        for name in daemonset_names(platform)
    }  # fmt: skip


def objects(spec: Mapping[str, Any], nodes: Iterable[Node]) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every data-plane object the spec asks for."""
    chosen = platforms(spec, nodes)
    ns = agents_namespace(spec)
    out: set[tuple[str, str, str]] = set()
    if not chosen:
        return out
    out |= {("ServiceAccount", ns, "istio-cni"), ("ClusterRole", "", "istio-cni")}
    out.add(("ClusterRoleBinding", "", "istio-cni"))
    for platform in chosen:
        if platform == LINUX:
            out |= {("ServiceAccount", ns, "ztunnel"), ("ConfigMap", ns, "istio-cni-config")}
        else:
            out.add(("ServiceAccount", ns, "ztunnel-windows"))
            out.add(("ConfigMap", ns, f"istio-cni-config-windows-{SUPPORTED_BUILDS[platform]}"))
        out |= {("DaemonSet", ns, name) for name in daemonset_names(platform)}
    # Multus's attachment for Linux pods, where Istio's chart puts it
    # (docs/platforms.md), when the cluster serves the kind.
    if LINUX in chosen and _get(spec, "istioCni", "provider") == "multus":
        out.add(("NetworkAttachmentDefinition", "default", "istio-cni"))
    return out


def degrading_reasons(spec: Mapping[str, Any], nodes: Iterable[Node]) -> list[str]:
    """Node reasons that make the mesh Degraded (UnsupportedNodes), one per such node."""
    out = []
    for node in nodes:
        _, reason = verdict(node, spec)
        if reason is not None and reason not in INTENDED:
            out.append(reason)
    return out


# -- scheduling ----------------------------------------------------------------------------


def toleration_matches(toleration: Mapping[str, Any], taint: tuple[str, str | None, str]) -> bool:
    """core/v1 semantics: an empty effect or key matches all; Exists ignores the value."""
    key, value, effect = taint
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    operator = toleration.get("operator") or "Equal"
    if toleration.get("key"):
        if toleration["key"] != key:
            return False
    elif operator != "Exists":
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (value or "")


def tolerates_all(
    tolerations: Sequence[Mapping[str, Any]], taints: Iterable[tuple[str, str | None, str]]
) -> bool:
    """Every NoSchedule and NoExecute taint is tolerated (PreferNoSchedule never blocks)."""
    return all(
        any(toleration_matches(t, taint) for t in tolerations)
        for taint in taints
        if taint[2] in ("NoSchedule", "NoExecute")
    )


def _requirement(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _field(expr: Mapping[str, Any], node: Node) -> bool:
    values = list(expr.get("values") or [])
    if expr.get("key") != "metadata.name" or len(values) != 1:
        return False
    if expr.get("operator") == "In":
        return node.name == values[0]
    return expr.get("operator") == "NotIn" and node.name != values[0]


def selects(pod_spec: Mapping[str, Any], node: Node) -> bool:
    """nodeName, nodeSelector and required node affinity admit the node."""
    if pod_spec.get("nodeName") and pod_spec["nodeName"] != node.name:
        return False
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    for term in required.get("nodeSelectorTerms") or []:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue  # an empty term selects nothing
        if all(_requirement(e, node.labels) for e in exprs) and all(
            _field(f, node) for f in fields
        ):
            return True
    return False


def daemon_pod_lands(pod_spec: Mapping[str, Any], node: Node) -> bool:
    """Whether the DaemonSet controller runs a pod of this template on the node."""
    tolerations = [*(pod_spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
    if pod_spec.get("hostNetwork"):
        tolerations.append(HOST_NETWORK_TOLERATION)
    return selects(pod_spec, node) and tolerates_all(tolerations, node.taints)


# -- namespaces and Gateways ----------------------------------------------------------------------


def namespace_events(labels: Mapping[str, str], gateways: Mapping[str, bool]) -> set[str]:
    """Warning reasons a namespace's labels deserve (docs/troubleshooting.md).

    `gateways` maps the names of Gateways in the namespace the labels point
    at to whether each is a waypoint (an HBONE listener on 15008).
    """
    out = set()

    def looks_like(key: str, squashed: str) -> bool:
        # Case, dashes, underscores, dots and slashes aside, with or without istio's prefix.
        flat = re.sub(r"[-_./]", "", key.lower())
        return flat in (squashed, "istio" + squashed, "istioio" + squashed)

    mode = labels.get("istio.io/dataplane-mode")
    misspelt_mode = mode is None and any(looks_like(k, "dataplanemode") for k in labels)
    if misspelt_mode:
        out.add("MisspelledDataplaneMode")
    if mode is not None and mode not in ("ambient", "none"):
        out.add("InvalidDataplaneMode")
    sidecar = labels.get("istio-injection") == "enabled" or "istio.io/rev" in labels
    if mode == "ambient" and sidecar:
        out.add("SidecarAndAmbient")
    waypoint = labels.get("istio.io/use-waypoint")
    if waypoint is None and any(looks_like(k, "usewaypoint") for k in labels):
        out.add("MisspelledUseWaypoint")
    if waypoint and waypoint != "none":
        if mode in (None, "none") and not misspelt_mode:
            out.add("WaypointWithoutAmbient")
        switch = {"true", "yes", "on", "enabled", "enable", "1"}
        switch |= {"false", "no", "off", "disabled", "disable", "0"}
        if waypoint not in gateways:
            out.add("WaypointNameExpected" if waypoint.lower() in switch else "WaypointNotFound")
        elif not gateways[waypoint]:
            out.add("NotAWaypoint")
    return out


_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def gateway_rejected(listeners: Sequence[Mapping[str, Any]]) -> bool:
    """Whether Gateway API's schema refuses these listeners (standard channel).

    At least one listener; ports 1-65535; a protocol that is a plain token or
    `domain/Name`; no two listeners with the same port, protocol and hostname.
    """
    if not listeners:
        return True
    protocol = re.compile(
        r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
        r"|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]+"
    )
    seen = set()
    for listener in listeners:
        port, proto = listener["port"], str(listener["protocol"])
        if not 1 <= int(port) <= 65535 or not protocol.fullmatch(proto):
            return True
        if (port, proto) in seen:
            return True
        seen.add((port, proto))
    return False


# docs/waypoints.md, spec.waypoints.policy.serviceAccountLabels: its default.
_WAYPOINT_ACCOUNT_LABELS = {"ambientoperator.io/waypoint-service-account": "true"}


def waypoint_accepted_reasons(
    gateway: Mapping[str, Any], accounts: Mapping[str, Mapping[str, str]] | None = None
) -> set[str]:
    """The Accepted reasons a Gateway of the operator's class may get (docs/waypoints.md).

    {"Accepted"} when nothing is wrong; otherwise every documented False
    reason that applies (the documents give no order among them).
    `accounts` are the labels of each ServiceAccount of the Gateway's
    namespace that existed before it, under the default policy.
    """
    meta = gateway.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    # An empty override names nothing, so the Gateway's own name stands.
    base = annotations.get("gateway.istio.io/name-override") or meta["name"]
    named = annotations.get("gateway.istio.io/service-account")
    account = named or base
    out = set()
    held = (accounts or {}).get(named) if named else None
    if held is not None and any(held.get(k) != v for k, v in _WAYPOINT_ACCOUNT_LABELS.items()):
        # "names a ServiceAccount that already exists and is not the Gateway's
        # own": it may run as it only with the policy's labels; a violation is
        # `InvalidParameters`. A Gateway just created owns nothing yet.
        out.add("InvalidParameters")
    if len(base) > 63 or not _DNS1035.fullmatch(base):
        out.add("Invalid")  # it must name a Service
    if len(account) > 253 or not _SUBDOMAIN.fullmatch(account):
        # A name unusable for an object it needs is `Invalid`; the annotation that
        # names the account is also a parameter of the Gateway's (`InvalidParameters`).
        # The documents do not say which of the two this is.
        out |= {"Invalid", "InvalidParameters"}
    if (gateway.get("spec") or {}).get("addresses"):
        out.add("UnsupportedAddress")
    listeners = (gateway.get("spec") or {}).get("listeners") or []
    if not any(x.get("port") == 15008 and x.get("protocol") == "HBONE" for x in listeners):
        out.add("ListenersNotValid")
    return out or {"Accepted"}


# -- AmbientMesh specs -------------------------------------------------------------------------


_LOG_LEVELS = ("trace", "debug", "info", "warn", "error")
_NAMESPACE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
# docs/ambientmesh-reference.md: "an image repository (registry/path)",
# "an image tag"; the fuzzed values are plainly one or the other.
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REPOSITORY = re.compile(r"([A-Za-z0-9.-]+(:[0-9]+)?/)?[a-z0-9._-]+(/[a-z0-9._-]+)*")
_ADDRESS = re.compile(r"[A-Za-z0-9.-]+:[0-9]{1,5}")
_ROLLOUT_DEFAULTS = {"ztunnel": (0, 1), "istioCni": (1, 0)}


def _count_or_percent(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and re.fullmatch(r"[0-9]+%?", value) is not None


def _zero(value: Any) -> bool:
    return str(value).rstrip("%").lstrip("0") == ""


# docs/ambientmesh-reference.md's rules for the fields Istio's chart values become.
_MESH_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_DNS_POLICIES = ("ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")


def _chart_value_fields_rejected(spec: Mapping[str, Any]) -> bool:
    def name_ok(value: Any) -> bool:
        return (
            isinstance(value, str) and len(value) <= 253 and _MESH_NAME.fullmatch(value) is not None
        )

    cluster = _get(spec, "multiCluster", "clusterName")
    if cluster is not None and not name_ok(cluster):
        return True
    # The network is a label value of the waypoints too.
    network = _get(spec, "network")
    if network is not None and not (name_ok(network) and len(network) <= 63):
        return True
    if (policy := _get(spec, "images", "pullPolicy")) is not None and policy not in _PULL_POLICIES:
        return True
    secrets = _get(spec, "images", "pullSecrets") or []
    if any(len(s) > 253 or not _SUBDOMAIN.fullmatch(s) for s in secrets) or len(secrets) > 16:
        return True
    namespaces = _get(spec, "istioCni", "excludeNamespaces") or []
    if any(len(n) > 63 or not _NAMESPACE.fullmatch(n) for n in namespaces):
        return True
    for component in ("ztunnel", "istioCni"):
        for flag in ("logAsJson", "nativeNftables"):
            value = _get(spec, component, flag)
            if value is not None and not isinstance(value, bool):
                return True
        env = _get(spec, component, "env") or {}
        if any(not _ENV_NAME.fullmatch(k) for k in env):
            return True
    policy = _get(spec, "ztunnel", "dnsPolicy")
    if policy is not None and policy not in _DNS_POLICIES:
        return True
    # Kubernetes refuses a pod whose dnsPolicy None names no nameserver.
    if policy == "None" and not _get(spec, "ztunnel", "dnsConfig", "nameservers"):
        return True
    mode = _get(spec, "istioCni", "repairMode")
    if mode is not None and mode not in ("Repair", "Delete", "Label"):
        return True
    provider = _get(spec, "istioCni", "provider")
    if provider is not None and provider not in ("default", "multus"):
        return True
    address = _get(spec, "istiod", "caAddress")
    return address is not None and not _ADDRESS.fullmatch(address)


def spec_rejected(spec: Mapping[str, Any]) -> bool:
    """Whether the API server refuses the spec, by docs/ambientmesh-reference.md.

    Covers the fields the fuzz tests vary; unknown fields are pruned, not refused.
    """
    checks = [
        ("logLevel", lambda v: v in _LOG_LEVELS),
        ("namespace", lambda v: len(v) <= 63 and _NAMESPACE.fullmatch(v) is not None),
    ]
    for key, ok in checks:
        if key in spec and not ok(spec[key]):
            return True
    images = spec.get("images") or {}
    if "tag" in images and not _TAG.fullmatch(images["tag"]):
        return True
    if "hub" in images and not _REPOSITORY.fullmatch(images["hub"]):
        return True
    address = _get(spec, "istiod", "address")
    if address is not None and not _ADDRESS.fullmatch(address):
        return True
    builds = _get(spec, "platforms", "windows", "builds")
    if builds is not None and any(b not in SUPPORTED_BUILDS for b in builds):
        return True
    grace = _get(spec, "ztunnel", "terminationGracePeriodSeconds")
    if grace is not None and not 1 <= grace <= 3600:
        return True
    if _chart_value_fields_rejected(spec):
        return True
    timeout = _get(spec, "newPodWorkaround", "timeoutSeconds")
    if timeout is not None and not 1 <= timeout <= 3600:
        return True
    for component, (unavailable, surge) in _ROLLOUT_DEFAULTS.items():
        rollout = _get(spec, component, "rollout")
        if rollout is None:
            continue
        values = [rollout.get("maxUnavailable", unavailable), rollout.get("maxSurge", surge)]
        if not all(_count_or_percent(v) for v in values):
            return True
        zeros = [_zero(v) for v in values]
        if all(zeros) or not any(zeros):
            return True  # both zero, or a surge next to an unavailability budget
    return False
