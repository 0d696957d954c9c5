"""Istio's `ztunnel` and `istio-cni` chart values, and the AmbientMesh fields they become.

Every value of the pinned charts (each leaf of their values.yaml, and each
value their templates read) is one entry here: either carried to an
AmbientMesh field, or fixed, with the reason the operator renders only what
the chart's default renders. `import_values` reads values files with them,
as `helm template --set profile=ambient -f FILE` would, and
tests/test_helm_values.py holds every entry to what upstream's chart
renders with it, through the real `helm`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ambient_operator.api import bundled
from ambient_operator.api import constants as c

Chart = Literal["ztunnel", "istio-cni"]
CHARTS: tuple[Chart, ...] = ("ztunnel", "istio-cni")
Builder = Callable[[Mapping[str, Any], dict[str, Any]], None]

# What the charts' `ambient` profile (files/profile-ambient.yaml) sets, as the
# charts merge it: istio-cni takes its `cni:` block as top-level values, and
# both take its `global:` block as top-level values as well.
AMBIENT_PROFILE: dict[Chart, dict[str, Any]] = {
    "ztunnel": {
        "meshConfig.defaultConfig.proxyMetadata": {"ISTIO_META_ENABLE_HBONE": "true"},
        "variant": "distroless",
    },
    "istio-cni": {"ambient.enabled": True, "variant": "distroless", "global.variant": "distroless"},
}
# Env the operator sets on ztunnel itself with this value: a proxyMetadata
# entry equal to it adds nothing.
_ZTUNNEL_OWN_ENV = {"ISTIO_META_ENABLE_HBONE": "true"}


class RefusedValueError(ValueError):
    """A value that cannot be carried over, with its chart and dotted path."""

    def __init__(self, chart: str, path: str, reason: str) -> None:
        super().__init__(f"{chart}: {path}: {reason}")
        self.chart, self.path, self.reason = chart, path, reason


@dataclass(frozen=True)
class Carried:
    """A value that becomes an AmbientMesh field."""

    field: str
    windows: str
    build: Builder
    kind: type | tuple[type, ...] = str
    # What a user should know beyond the field, said in docs/coming-from-helm.md.
    note: str = ""


@dataclass(frozen=True)
class Fixed:
    """A value the operator does not take: only what the chart's default renders is rendered."""

    reason: str
    # Values that render what the operator renders; the chart's default when empty.
    accepts: tuple[Any, ...] = ()
    any_value: bool = field(default=False)


Entry = Carried | Fixed
# Stands for the release namespace in Fixed.accepts.
RELEASE_NAMESPACE = "(the release namespace)"


def _put(spec: dict[str, Any], path: str, value: Any) -> None:
    node = spec
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def _to(path: str, convert: Callable[[Any], Any] = lambda x: x) -> Builder:
    """A builder that sets one spec path from the entry's own value."""

    def build(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
        value = convert(values["_self"])
        # The charts' empty defaults ("", {}) mean unset.
        if value is not None:
            _put(spec, path, value)

    return build


def _given_or_none(value: Any) -> Any:
    return value or None


def _node_affinity(value: Any) -> list[Any] | None:
    """The required node affinity terms of a chart's affinity, which is all the operator takes.

    A daemon pod's node is chosen before it is scheduled, so pod (anti-)affinity
    and preferences cannot move it; they could only keep it off its node.
    """
    if not value:
        return None
    node = value.get("nodeAffinity") if isinstance(value, dict) else None
    if set(value) != {"nodeAffinity"} or not isinstance(node, dict):
        raise ValueError(
            "only affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution is "
            "carried: a daemon pod's node is fixed before scheduling, so pod (anti-)affinity "
            "cannot move it"
        )
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if set(node) != {"requiredDuringSchedulingIgnoredDuringExecution"} or not required:
        raise ValueError("preferred node affinity cannot move a daemon pod: give required terms")
    terms = required.get("nodeSelectorTerms") or []
    if any(set(t) != {"matchExpressions"} for t in terms):
        raise ValueError("only terms of matchExpressions are carried (no matchFields)")
    return list(terms)


def _bool(value: Any) -> bool:
    return bool(value)


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}


# --- ztunnel -----------------------------------------------------------------

_WIN_ENV = "applied: the Windows experiment's ztunnel reads the same variable (src/config.rs)"
_WIN_POD = "applied to the Windows agents' pods and containers too"


def _ztunnel_resources(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
    requests = {
        k: values[f"resources.requests.{k}"]
        for k in ("cpu", "memory")
        if values[f"resources.requests.{k}"]
    }
    limits = {k: v for k, v in (values["resources.limits"] or {}).items() if v}
    _put(
        spec,
        "ztunnel.resources",
        {**({"requests": requests} if requests else {}), **({"limits": limits} if limits else {})},
    )


def _proxy_metadata(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
    extra = {k: v for k, v in _str_map(values["_self"]).items() if _ZTUNNEL_OWN_ENV.get(k) != v}
    if extra:
        env = spec.setdefault("ztunnel", {}).setdefault("env", {})
        for name in extra:
            if name in env:
                raise ValueError(f"{name} is set in env as well; the chart would render it twice")
        env.update(extra)


def _env(component: str) -> Builder:
    def build(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
        env = spec.setdefault(component, {}).setdefault("env", {})
        env.update(_str_map(values["_self"]))

    return build


def _rollout(component: str, key: str) -> Builder:
    return _to(f"{component}.rollout.{key}")


_HELM_NAMES = "names the objects of a Helm install; the operator's objects have fixed names"
_SCOPE = (
    "splits a Helm install between cluster and namespace administrators; the operator writes both"
)
_NETWORK_POLICY = (
    "not applied: Windows agents are HostProcess pods on the host network, where "
    "NetworkPolicies do not apply; each policy selects its agent's Linux pods only"
)
_WIN_OBJECTS = "applied to the Windows DaemonSets and ServiceAccount too"
_WIN_TOLERATIONS = "not applied: Windows agents take spec.platforms.windows.tolerations"
_QUOTAS = "applied: one quota per agent serves every OS"
_NO_SELINUX = "not applied: Windows has no SELinux"
_WIN_PLACEMENT = "not applied: Windows agents take spec.platforms.windows' placement"
_PAIR = (
    "Both Linux agents take it: a node with one agent of the pair breaks its pods, and the "
    "nodes it leaves out are reported as ExcludedBySpec."
)
_HOST_FILES = "not applied: Windows HostProcess pods see the host's file system"
_HOST_DNS = "not applied: Windows HostProcess pods resolve with the host"
_WIN_OWNED = "not applied: the Windows ConfigMaps chain to the node's own CNI file"
_PROFILE = "profiles are Helm's way to set values; give the values themselves"

_VARIANT = Carried(
    "spec.images.variant", "not applied: the Windows images have no variants", _to("images.variant")
)
_PULL_POLICY = Carried("spec.images.pullPolicy", _WIN_POD, _to("images.pullPolicy"))

# What both charts read alike.
_BOTH: dict[str, Entry] = {
    "variant": _VARIANT,
    "global.networkPolicy.enabled": Carried(
        "spec.networkPolicy.enabled", _NETWORK_POLICY, _to("networkPolicy.enabled", _bool), bool
    ),
    "tolerations": Carried(
        "spec.platforms.linux.tolerations",
        _WIN_TOLERATIONS,
        _to("platforms.linux.tolerations", list),
        list,
    ),
    "resourceQuotas.enabled": Carried(
        "spec.resourceQuotas.enabled", _QUOTAS, _to("resourceQuotas.enabled", _bool), bool
    ),
    "resourceQuotas.pods": Carried(
        "spec.resourceQuotas.pods", _QUOTAS, _to("resourceQuotas.pods", int), int
    ),
    "updateStrategy.type": Fixed(
        "the agents always roll (RollingUpdate)", accepts=("RollingUpdate",)
    ),
    "ownerName": Fixed("names an IstioOperator resource; none owns these objects", any_value=True),
    "platform": Carried(
        "spec.platform", "applied: the platform's Windows CNI paths", _to("platform")
    ),
    "global.platform": Carried(
        "spec.platform", "applied: the platform's Windows CNI paths", _to("platform")
    ),
    "profile": Fixed(_PROFILE, accepts=("ambient",)),
    "global.profile": Fixed(_PROFILE, accepts=("ambient",)),
    "compatibilityVersion": Fixed(
        "compatibility profiles restore older releases' defaults; not carried", accepts=("", None)
    ),
    "defaults": Fixed("the charts refuse it themselves", accepts=(None,)),
    "_internal_defaults_do_not_set": Fixed("the charts' own defaults; never set", accepts=(None,)),
    "affinity": Carried(
        "spec.platforms.linux.nodeAffinity",
        _WIN_PLACEMENT,
        _to("platforms.linux.nodeAffinity", _node_affinity),
        dict,
        note=_PAIR,
    ),
}


def _windows_images(name: str) -> str:
    return (
        "applied only without spec.images.registry: Windows images are then "
        f"<hub>/{name}:<tag>, which Istio does not publish"
    )


_ZTUNNEL_IMAGES = _windows_images(bundled.ZTUNNEL_WINDOWS)

ZTUNNEL: dict[str, Entry] = {
    **_BOTH,
    "hub": Carried(
        "spec.images.hub",
        _ZTUNNEL_IMAGES,
        _to("images.hub"),
    ),
    "tag": Carried(
        "spec.images.tag",
        _ZTUNNEL_IMAGES,
        _to("images.tag"),
    ),
    "image": Carried(
        "spec.images.ztunnel.linux",
        "not applied: set spec.images.ztunnel.windows",
        _to("images.ztunnel.linux"),
    ),
    "network": Carried("spec.network", _WIN_ENV, _to("network")),
    "resourceName": Fixed(_HELM_NAMES, accepts=("", "ztunnel")),
    "labels": Carried("spec.ztunnel.labels", _WIN_OBJECTS, _to("ztunnel.labels", _str_map), dict),
    "annotations": Carried(
        "spec.ztunnel.annotations", _WIN_OBJECTS, _to("ztunnel.annotations", _str_map), dict
    ),
    "volumeMounts": Carried(
        "spec.ztunnel.volumeMounts", _HOST_FILES, _to("ztunnel.volumeMounts", _given_or_none), list
    ),
    "volumes": Carried(
        "spec.ztunnel.volumes", _HOST_FILES, _to("ztunnel.volumes", _given_or_none), list
    ),
    "podAnnotations": Carried(
        "spec.ztunnel.podAnnotations", _WIN_POD, _to("ztunnel.podAnnotations", _str_map), dict
    ),
    "podLabels": Carried(
        "spec.ztunnel.podLabels", _WIN_POD, _to("ztunnel.podLabels", _str_map), dict
    ),
    "resources.requests.cpu": Carried(
        "spec.ztunnel.resources", _WIN_POD, _ztunnel_resources, (str, int)
    ),
    "resources.requests.memory": Carried(
        "spec.ztunnel.resources", _WIN_POD, _ztunnel_resources, (str, int)
    ),
    "resources.limits": Carried("spec.ztunnel.resources", _WIN_POD, _ztunnel_resources, dict),
    "peerCaCrl.enabled": Carried(
        "spec.ztunnel.peerCaCrl",
        "not applied: the Windows experiment's ztunnel reads no CRL_PATH",
        _to("ztunnel.peerCaCrl", _bool),
        bool,
    ),
    "imagePullSecrets": Carried(
        "spec.images.pullSecrets",
        "applied: on the Windows ServiceAccount too",
        _to("images.pullSecrets", list),
        list,
    ),
    "env": Carried(
        "spec.ztunnel.env", "applied to the Windows container too", _env("ztunnel"), dict
    ),
    "imagePullPolicy": _PULL_POLICY,
    "multiCluster.clusterName": Carried(
        "spec.multiCluster.clusterName", _WIN_ENV, _to("multiCluster.clusterName")
    ),
    "meshConfig.defaultConfig.proxyMetadata": Carried(
        "spec.ztunnel.env", "applied to the Windows container too", _proxy_metadata, dict
    ),
    "terminationGracePeriodSeconds": Carried(
        "spec.ztunnel.terminationGracePeriodSeconds",
        _WIN_POD,
        _to("ztunnel.terminationGracePeriodSeconds", int),
        int,
    ),
    "revision": Carried(
        "spec.istiod.revision",
        "applied: Windows agents dial istiod-<revision> by its Service IP",
        _to("istiod.revision"),
    ),
    "caAddress": Carried("spec.istiod.caAddress", _WIN_ENV, _to("istiod.caAddress")),
    "xdsAddress": Carried("spec.istiod.xdsAddress", _WIN_ENV, _to("istiod.xdsAddress")),
    "istioNamespace": Fixed(
        "the operator finds istiod in the agents' namespace (the release namespace, "
        "--namespace); to dial an istiod elsewhere, set spec.istiod.address",
        accepts=(RELEASE_NAMESPACE,),
    ),
    "logLevel": Carried("spec.ztunnel.logLevel", _WIN_ENV, _to("ztunnel.logLevel")),
    "logAsJson": Carried("spec.ztunnel.logAsJson", _WIN_ENV, _to("ztunnel.logAsJson", _bool), bool),
    "seLinuxOptions": Carried(
        "spec.ztunnel.seLinuxOptions",
        _NO_SELINUX,
        _to("ztunnel.seLinuxOptions", _given_or_none),
        dict,
    ),
    "resourceScope": Fixed(_SCOPE, accepts=("all",)),
    "updateStrategy.rollingUpdate.maxSurge": Carried(
        "spec.ztunnel.rollout.maxSurge",
        "applied as maxUnavailable: on the host network a surge pod cannot start beside "
        "the old one",
        _rollout("ztunnel", "maxSurge"),
        (int, str),
    ),
    "updateStrategy.rollingUpdate.maxUnavailable": Carried(
        "spec.ztunnel.rollout.maxUnavailable",
        _WIN_POD,
        _rollout("ztunnel", "maxUnavailable"),
        (int, str),
    ),
    "dnsPolicy": Carried(
        "spec.ztunnel.dnsPolicy", _HOST_DNS, _to("ztunnel.dnsPolicy", _given_or_none)
    ),
    "dnsConfig": Carried(
        "spec.ztunnel.dnsConfig", _HOST_DNS, _to("ztunnel.dnsConfig", _given_or_none), dict
    ),
    # Read by the templates, not in values.yaml.
    "nodeSelector": Carried(
        "spec.platforms.linux.nodeSelector",
        _WIN_PLACEMENT,
        _to("platforms.linux.nodeSelector", _given_or_none),
        dict,
        note=_PAIR,
    ),
    "trustBundleName": Fixed(
        "ztunnel reads istiod's root certificate from ConfigMap istio-ca-root-cert",
        accepts=("", None, "istio-ca-root-cert"),
    ),
}


# --- istio-cni ---------------------------------------------------------------

_WIN_CNI = "applied: the Windows experiment's istio-cni reads the same key (cni/pkg/cmd/root.go)"


def _cni_resources(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
    requests = {
        k: values[f"resources.requests.{k}"]
        for k in ("cpu", "memory")
        if values[f"resources.requests.{k}"]
    }
    _put(spec, "istioCni.resources", {"requests": requests} if requests else {})


_NO_WINDOWS_REPAIR = "not applied: the Windows experiment implements no repair"
# istio-cni's repair modes, in the order it takes the first one set.
_REPAIR_MODES = (
    ("repair.repairPods", "Repair"),
    ("repair.deletePods", "Delete"),
    ("repair.labelPods", "Label"),
)


def _repair_mode(values: Mapping[str, Any], spec: dict[str, Any]) -> None:
    """The mode istio-cni runs: the first of repairPods, deletePods, labelPods set.

    A later one set beside it would do nothing, and three unset would leave
    repair on but idle: both are refused, as what the user meant is unclear.
    """
    chosen = [mode for path, mode in _REPAIR_MODES if values[path]]
    if not chosen:
        raise ValueError(
            "repairPods, deletePods and labelPods all false leave repair doing nothing; "
            "set repair.enabled: false instead"
        )
    if len(chosen) > 1:
        raise ValueError(
            f"istio-cni runs only the first mode set (repairPods, deletePods, labelPods): "
            f"{chosen[1]} would do nothing beside {chosen[0]}; set the other ones false"
        )
    _put(spec, "istioCni.repairMode", chosen[0])


_DEFAULT_RESOURCES = (
    "the chart uses it only where resources is empty, which its own default never is; set resources"
)
_SELECTORS = (
    "the enrollment rule of the istio.io API is fixed: the operator reports enrollment by the "
    "same rule istio-cni applies"
)

_CNI_IMAGES = _windows_images(bundled.INSTALL_CNI_WINDOWS)
_CNI_HUB = Carried("spec.images.hub", _CNI_IMAGES, _to("images.hub"))
_CNI_TAG = Carried("spec.images.tag", _CNI_IMAGES, _to("images.tag"))
_CNI_LOG_LEVEL = Carried(
    "spec.istioCni.logLevel", "applied: the same flag on Windows", _to("istioCni.logLevel")
)
_WIN_DIRS = "not applied: Windows agents take spec.platforms.windows' directories"


def _linux_dir(field: str) -> Carried:
    return Carried(
        f"spec.platforms.linux.{field}", _WIN_DIRS, _to(f"platforms.linux.{field}", _given_or_none)
    )


_REPAIR_MODE = Carried(
    "spec.istioCni.repairMode",
    _NO_WINDOWS_REPAIR,
    _repair_mode,
    bool,
    note="The Delete mode needs istio-cni to hold delete on every pod: the operator chart's "
    "value istioCniRepair.deletePods grants it.",
)

ISTIO_CNI: dict[str, Entry] = {
    **_BOTH,
    "hub": _CNI_HUB,
    "tag": _CNI_TAG,
    "image": Carried(
        "spec.images.istioCni.linux",
        "not applied: set spec.images.istioCni.windows",
        _to("images.istioCni.linux"),
    ),
    "pullPolicy": _PULL_POLICY,
    "logging.level": _CNI_LOG_LEVEL,
    "cniBinDir": _linux_dir("cniBinDir"),
    "cniConfDir": _linux_dir("cniConfDir"),
    "cniConfFileName": Carried(
        "spec.istioCni.cniConfFileName",
        "applied: CNI_CONF_NAME in the Windows ConfigMaps too",
        _to("istioCni.cniConfFileName", _given_or_none),
    ),
    "cniNetnsDir": _linux_dir("cniNetnsDir"),
    "istioOwnedCNIConfigFileName": Carried(
        "spec.istioCni.istioOwnedCniConfigFileName",
        _WIN_OWNED,
        _to("istioCni.istioOwnedCniConfigFileName", _given_or_none),
    ),
    "istioOwnedCNIConfig": Carried(
        "spec.istioCni.istioOwnedCniConfig",
        _WIN_OWNED,
        _to("istioCni.istioOwnedCniConfig", _bool),
        bool,
    ),
    "excludeNamespaces": Carried(
        "spec.istioCni.excludeNamespaces", _WIN_CNI, _to("istioCni.excludeNamespaces", list), list
    ),
    "daemonSetLabels": Carried(
        "spec.istioCni.labels",
        "applied to the Windows DaemonSets too",
        _to("istioCni.labels", _str_map),
        dict,
    ),
    "podAnnotations": Carried(
        "spec.istioCni.podAnnotations", _WIN_POD, _to("istioCni.podAnnotations", _str_map), dict
    ),
    "podLabels": Carried(
        "spec.istioCni.podLabels", _WIN_POD, _to("istioCni.podLabels", _str_map), dict
    ),
    "chained": Carried(
        "spec.istioCni.chained",
        "not applied: Windows always chains",
        _to("istioCni.chained", _bool),
        bool,
    ),
    "provider": Carried(
        "spec.istioCni.provider",
        "not applied: Multus attaches Linux pods only; the NetworkAttachmentDefinition serves them",
        _to("istioCni.provider"),
        note="Needs Multus installed and the operator chart's value multus.enabled, which lets "
        "the operator write the NetworkAttachmentDefinition.",
    ),
    "ambient.enabled": Fixed("the operator runs istio-cni for ambient only", accepts=(True,)),
    "ambient.enablementSelectors": Fixed(_SELECTORS, accepts=(c.ENABLEMENT_SELECTORS,)),
    "ambient.configDir": Fixed("istio-cni's default ambient config directory", accepts=("",)),
    "ambient.dnsCapture": Carried(
        "spec.istioCni.dnsCapture",
        "not applied: Windows has no DNS proxying",
        _to("istioCni.dnsCapture", _bool),
        bool,
    ),
    "ambient.ipv6": Carried(
        "spec.istioCni.ipv6",
        "not applied: Windows HNS policies are IPv4 only",
        _to("istioCni.ipv6", _bool),
        bool,
    ),
    "ambient.reconcileIptablesOnStartup": Carried(
        "spec.istioCni.reconcileIptablesOnStartup",
        "not applied: Windows has no iptables",
        _to("istioCni.reconcileIptablesOnStartup", _bool),
        bool,
    ),
    "ambient.shareHostNetworkNamespace": Fixed(
        "the operator runs istio-cni on the host network already", accepts=(False,)
    ),
    "ambient.enableAmbientDetectionRetry": Carried(
        "spec.istioCni.enableAmbientDetectionRetry",
        _WIN_CNI,
        _to("istioCni.enableAmbientDetectionRetry", _bool),
        bool,
    ),
    "repair.enabled": Carried(
        "spec.istioCni.repair",
        _NO_WINDOWS_REPAIR,
        _to("istioCni.repair", _bool),
        bool,
    ),
    "repair.hub": Fixed("repair runs inside istio-cni; no image of its own", any_value=True),
    "repair.tag": Fixed("repair runs inside istio-cni; no image of its own", any_value=True),
    "repair.labelPods": _REPAIR_MODE,
    "repair.deletePods": _REPAIR_MODE,
    "repair.repairPods": _REPAIR_MODE,
    "repair.initContainerName": Carried(
        "spec.istioCni.repairInitContainerName",
        _NO_WINDOWS_REPAIR,
        _to("istioCni.repairInitContainerName"),
    ),
    "repair.brokenPodLabelKey": Carried(
        "spec.istioCni.brokenPodLabel.key", _NO_WINDOWS_REPAIR, _to("istioCni.brokenPodLabel.key")
    ),
    "repair.brokenPodLabelValue": Carried(
        "spec.istioCni.brokenPodLabel.value",
        _NO_WINDOWS_REPAIR,
        _to("istioCni.brokenPodLabel.value"),
    ),
    "seccompProfile": Carried(
        "spec.istioCni.seccompProfile",
        "not applied: Windows has no seccomp",
        _to("istioCni.seccompProfile", _given_or_none),
        dict,
    ),
    "seLinuxOptions": Carried(
        "spec.istioCni.seLinuxOptions",
        _NO_SELINUX,
        _to("istioCni.seLinuxOptions", _given_or_none),
        dict,
    ),
    "useAppArmorAnnotation": Fixed(
        "the operator sets the AppArmor profile in the securityContext (Kubernetes 1.30+), "
        "which is what the annotation asks for",
        accepts=(True, False),
    ),
    "resources.requests.cpu": Carried(
        "spec.istioCni.resources", _WIN_POD, _cni_resources, (str, int)
    ),
    "resources.requests.memory": Carried(
        "spec.istioCni.resources", _WIN_POD, _cni_resources, (str, int)
    ),
    "updateStrategy.rollingUpdate.maxUnavailable": Carried(
        "spec.istioCni.rollout.maxUnavailable",
        _WIN_POD,
        _rollout("istioCni", "maxUnavailable"),
        (int, str),
    ),
    "terminationGracePeriodSeconds": Carried(
        "spec.istioCni.terminationGracePeriodSeconds",
        "not applied: Windows keeps 5 s (docs/upstream-differences.md)",
        _to("istioCni.terminationGracePeriodSeconds", int),
        int,
    ),
    "revision": Fixed(
        "labels istio-cni's objects with a revision it does not use in ambient; istio-cni serves "
        "every revision",
        any_value=True,
    ),
    "global.hub": _CNI_HUB,
    "global.tag": _CNI_TAG,
    "global.variant": _VARIANT,
    "global.imagePullPolicy": _PULL_POLICY,
    "global.logging.level": _CNI_LOG_LEVEL,
    "global.logAsJson": Carried(
        "spec.istioCni.logAsJson",
        "applied: the same flag on Windows",
        _to("istioCni.logAsJson", _bool),
        bool,
    ),
    "global.imagePullSecrets": Carried(
        "spec.images.pullSecrets",
        "applied: the ServiceAccount is shared",
        _to("images.pullSecrets", list),
        list,
    ),
    "global.defaultResources.requests.cpu": Fixed(_DEFAULT_RESOURCES, any_value=True),
    "global.defaultResources.requests.memory": Fixed(_DEFAULT_RESOURCES, any_value=True),
    "global.nativeNftables": Carried(
        "spec.istioCni.nativeNftables",
        "not applied: Windows uses HNS",
        _to("istioCni.nativeNftables", _bool),
        bool,
    ),
    "global.resourceScope": Fixed(_SCOPE, accepts=("all",)),
    "env": Carried(
        "spec.istioCni.env",
        "applied to the Windows container and ConfigMap too",
        _env("istioCni"),
        dict,
    ),
}

ENTRIES: dict[Chart, dict[str, Entry]] = {"ztunnel": ZTUNNEL, "istio-cni": ISTIO_CNI}

# Values the builders combine, as each chart's values.yaml has them (a test
# holds them to the pinned charts).
CHART_DEFAULTS: dict[Chart, dict[str, Any]] = {
    "ztunnel": {
        "resources.requests.cpu": "200m",
        "resources.requests.memory": "512Mi",
        "resources.limits": None,
    },
    "istio-cni": {
        "resources.requests.cpu": "100m",
        "resources.requests.memory": "100Mi",
        "repair.repairPods": True,
        "repair.deletePods": False,
        "repair.labelPods": False,
    },
}


def _given(chart: Chart, values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries a values file sets, by path, with the charts' precedence applied.

    Top-level values beat `global.*` ones, which the charts also read as
    top-level values; both beat the ambient profile. istio-cni reads a legacy
    `cni:` block as top-level values.
    """
    entries = ENTRIES[chart]
    values = dict(values)
    if chart == "istio-cni" and isinstance(values.get("cni"), dict):
        legacy = values.pop("cni")
        values = _merged(values, legacy)
    top: dict[str, Any] = {}
    flattened: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in entries:
                top[path] = value
            elif path.startswith("global.") and path.removeprefix("global.") in entries:
                flattened[path.removeprefix("global.")] = value
            elif isinstance(value, dict):
                walk(value, path + ".")
            else:
                raise RefusedValueError(chart, path, "not a value of the chart")

    walk(values, "")
    return {**AMBIENT_PROFILE[chart], **flattened, **top}


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _wrong_type(expected: str, value: Any) -> str:
    return f"expected {expected}, got {type(value).__name__} {value!r}"


def _typed(chart: Chart, path: str, entry: Carried, value: Any) -> None:
    kinds = entry.kind if isinstance(entry.kind, tuple) else (entry.kind,)
    # YAML's true is no count, though Python's bool is an int.
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        raise RefusedValueError(chart, path, _wrong_type(names, value))


def chart_spec(
    chart: Chart, values: Mapping[str, Any], namespace: str = "istio-system"
) -> dict[str, Any]:
    """The AmbientMesh spec fields one chart's values file sets (camelCase, nested).

    Raises RefusedValueError for an unknown key, a value of the wrong type, or a value
    the operator cannot honour.
    """
    if not isinstance(values, Mapping):
        raise RefusedValueError(chart, "(file)", "expected a mapping of values")
    given = _given(chart, values)
    spec: dict[str, Any] = {}
    # global.* first: a top-level value of the same field is written after, and wins.
    for path in sorted(given, key=lambda p: (not p.startswith("global."), p)):
        entry, value = ENTRIES[chart][path], given[path]
        if isinstance(entry, Fixed):
            accepts = [namespace if a == RELEASE_NAMESPACE else a for a in entry.accepts]
            if not entry.any_value and value not in accepts:
                shown = " or ".join(repr(a) for a in accepts)
                raise RefusedValueError(chart, path, f"{entry.reason} (only {shown} is honoured)")
            continue
        _typed(chart, path, entry, value)
        # A builder that combines several values (resources) reads them all, so
        # it writes the same whichever of them it runs for.
        merged = {**CHART_DEFAULTS[chart], **given, "_self": value}
        try:
            entry.build(merged, spec)
        except ValueError as exc:
            raise RefusedValueError(chart, path, str(exc)) from exc
    return spec


def _combine(parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One spec from each file's part; the same field set differently by two files is refused."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}

    def walk(node: Mapping[str, Any], target: dict[str, Any], prefix: str, source: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and isinstance(target.get(key, {}), dict):
                walk(value, target.setdefault(key, {}), path + ".", source)
            elif key in target and target[key] != value:
                raise RefusedValueError(
                    source,
                    f"spec.{path}",
                    f"is {value!r} here but {target[key]!r} in {origin[path]}; the operator "
                    "takes one value for both agents",
                )
            else:
                target[key] = value
                origin[path] = source

    for source, part in parts:
        walk(part, out, "", source)
    return out


def istiod_spec(values: Mapping[str, Any]) -> dict[str, Any]:
    """What the agents must agree with in istiod's values: only these keys are read."""
    if not isinstance(values, Mapping):
        raise RefusedValueError("istiod", "(file)", "expected a mapping of values")

    def get(path: str) -> Any:
        node: Any = values
        for key in path.split("."):
            if not isinstance(node, Mapping) or key not in node:
                return None
            node = node[key]
        return node

    spec: dict[str, Any] = {}
    reads = {
        "revision": "istiod.revision",
        "global.istioNamespace": "namespace",
        "meshConfig.trustDomain": "trustDomain",
        "global.proxy.clusterDomain": "clusterDomain",
        "global.multiCluster.clusterName": "multiCluster.clusterName",
        "global.network": "network",
    }
    for path, target in reads.items():
        value = get(path)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise RefusedValueError("istiod", path, _wrong_type("str", value))
        _put(spec, target, value)
    trusted = get("trustedZtunnelName")
    if trusted not in (None, "", "ztunnel"):
        raise RefusedValueError(
            "istiod",
            "trustedZtunnelName",
            "the operator's ztunnel ServiceAccounts are ztunnel and ztunnel-windows",
        )
    namespace = get("trustedZtunnelNamespace")
    own = spec.get("namespace", "istio-system")
    if namespace not in (None, "", own):
        raise RefusedValueError(
            "istiod",
            "trustedZtunnelNamespace",
            f"istiod trusts ztunnel in {namespace!r} but the agents run in {own!r}",
        )
    return spec


def import_values(
    ztunnel: Mapping[str, Any] | None = None,
    istio_cni: Mapping[str, Any] | None = None,
    istiod: Mapping[str, Any] | None = None,
    namespace: str = "istio-system",
) -> dict[str, Any]:
    """The AmbientMesh `default` that renders what the charts render with these values.

    Each file is read as `helm template --set profile=ambient -f FILE --namespace
    NAMESPACE` reads it. Raises RefusedValueError (chart, dotted path, reason) for
    anything that cannot be carried over; the spec is then validated as the API
    server would.
    """
    parts: list[tuple[str, dict[str, Any]]] = []
    if namespace != "istio-system":
        parts.append(("--namespace", {"namespace": namespace}))
    if ztunnel is not None:
        parts.append(("ztunnel", chart_spec("ztunnel", ztunnel, namespace)))
    if istio_cni is not None:
        parts.append(("istio-cni", chart_spec("istio-cni", istio_cni, namespace)))
    if istiod is not None:
        parts.append(("istiod", istiod_spec(istiod)))
    spec = _combine(parts)
    # Imported here: the API models import nothing of this module.
    from pydantic import ValidationError

    from ambient_operator.api.v1alpha1 import AmbientMesh

    mesh = {
        "apiVersion": "ambientoperator.io/v1alpha1",
        "kind": "AmbientMesh",
        "metadata": {"name": "default"},
        "spec": spec,
    }
    try:
        AmbientMesh.model_validate(mesh)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RefusedValueError("AmbientMesh", where, first["msg"]) from exc
    return mesh
