"""render_dataplane: AmbientMesh spec + cluster facts -> desired data-plane objects."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshReason, Problem
from ambient_operator.api.types import ApiModel, is_zero
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, IstioCni, Resources, Rollout, Ztunnel
from ambient_operator.cluster.facts import (
    NETWORK_ATTACHMENTS_NOT_GRANTED,
    NETWORK_ATTACHMENTS_SERVED,
    ClusterFacts,
)
from ambient_operator.cluster.revisions import at_revision
from ambient_operator.render import placement as pl
from ambient_operator.render import values as v
from ambient_operator.render.model import (
    PLATFORM_ALL,
    PLATFORM_LINUX,
    Component,
    DaemonSetPlan,
    PlatformRollout,
    RenderResult,
)
from ambient_operator.render.platforms import RESOURCE_QUOTA_PODS, PlatformProfile, profile
from ambient_operator.render.rollout import decide
from ambient_operator.render.templating import render_object
from ambient_operator.render.verdicts import Assignment, Placed, VerdictMemo, assign

# (default maxUnavailable, default maxSurge) per component, as upstream ships them.
ROLLOUT_DEFAULTS: dict[Component, tuple[int, int]] = {v.ZTUNNEL: (0, 1), v.ISTIO_CNI: (1, 0)}
# Windows keeps the value it had until its own comparison with upstream decides.
WINDOWS_CNI_GRACE_SECONDS = 5
PORTS = {
    "metrics": c.PORT_METRICS,
    "readiness": c.PORT_READINESS,
    "cni_metrics": c.PORT_CNI_METRICS,
    "cni_readiness": c.PORT_CNI_READINESS,
}
# The setting of each repair mode (spec.istioCni.repairMode), in the chart's
# order. All three are written: install-cni reads an absent REPAIR_REPAIR_PODS
# as false, unlike the chart's default, and the ConfigMap says what the agent does.
REPAIR_MODE_SETTINGS = {
    "Label": "REPAIR_LABEL_PODS",
    "Delete": "REPAIR_DELETE_PODS",
    "Repair": "REPAIR_REPAIR_PODS",
}
# Where the chart's peerCaCrl has ztunnel read the plugged-in CA's revocation list.
CRL_PATH = "/var/run/secrets/istio/crl/ca-crl.pem"


@dataclass(frozen=True)
class _Platform:
    """One platform's DaemonSet pair: "linux" or a Windows build."""

    name: str
    # Both agents of a platform go to the same nodes.
    where: pl.Placement
    # What the cluster's Kubernetes platform (AKS, GKE, OpenShift...) needs.
    profile: PlatformProfile

    @property
    def windows(self) -> bool:
        """Whether this is a Windows build."""
        return self.name != PLATFORM_LINUX


def _agent(spec: AmbientMeshSpec, component: Component) -> Ztunnel | IstioCni:
    return spec.ztunnel if component == v.ZTUNNEL else spec.istio_cni


def _dns(spec: AmbientMeshSpec, component: Component, plat: _Platform) -> dict[str, Any]:
    """ztunnel's DNS policy and config on Linux; HostProcess pods resolve with the host."""
    if component != v.ZTUNNEL or plat.windows:
        return {"dns_policy": None, "dns_config": None}
    config = spec.ztunnel.dns_config
    return {
        "dns_policy": spec.ztunnel.dns_policy,
        "dns_config": _dump(config),
    }


def _dump(model: ApiModel | None) -> dict[str, Any] | None:
    """An API model as the objects' JSON: camelCase, unset fields left out."""
    return model.model_dump(by_alias=True, exclude_none=True) if model is not None else None


def _dumped(models: Sequence[ApiModel] | None) -> list[dict[str, Any]]:
    return [d for m in models or [] if (d := _dump(m)) is not None]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _object_labels(spec: AmbientMeshSpec, component: Component, platform: str) -> dict[str, str]:
    """Labels of an agent's DaemonSets (and ztunnel's ServiceAccounts): the user's, then ours."""
    return {**(_agent(spec, component).labels or {}), **v.labels(component, platform)}


def _shared_object_labels(spec: AmbientMeshSpec, component: Component) -> dict[str, str]:
    """Labels of an agent's objects that serve every OS: the chart labels ztunnel's, not
    istio-cni's (its daemonSetLabels are for DaemonSets alone)."""
    if component == v.ZTUNNEL:
        return _object_labels(spec, component, PLATFORM_ALL)
    return v.labels(component, PLATFORM_ALL)


def _object_annotations(spec: AmbientMeshSpec, component: Component) -> dict[str, str]:
    """Annotations of ztunnel's DaemonSets and ServiceAccounts, as the chart has them."""
    if component != v.ZTUNNEL:
        return {}
    return {**(spec.ztunnel.annotations or {}), **_revision(spec, component)}


def _security_extras(
    spec: AmbientMeshSpec, component: Component, plat: _Platform
) -> dict[str, Any]:
    """SELinux and seccomp of a Linux agent's container: the platform's, then the user's."""
    if plat.windows:
        return {"se_linux": None, "seccomp": None}
    given = _agent(spec, component).se_linux_options
    user = _dump(given) or {}
    selinux = plat.profile.selinux_type
    # istio-cni's chart merges spc_t under any options given, ztunnel's does not.
    if user and component == v.ISTIO_CNI:
        selinux = selinux or "spc_t"
    se_linux = {**({"type": selinux} if selinux else {}), **user}
    seccomp = spec.istio_cni.seccomp_profile if component == v.ISTIO_CNI else None
    return {
        "se_linux": se_linux or None,
        "seccomp": _dump(seccomp),
    }


def _revision(spec: AmbientMeshSpec, component: Component) -> dict[str, str]:
    """ztunnel says which istiod revision it serves, as the chart annotates it; istio-cni
    serves every revision and says none."""
    if component != v.ZTUNNEL or not spec.istiod.revision:
        return {}
    return {c.LABEL_REVISION: spec.istiod.revision}


def _pod_labels(spec: AmbientMeshSpec, component: Component, platform: str) -> dict[str, str]:
    extra = {"app": "ztunnel"} if component == v.ZTUNNEL else {"k8s-app": "istio-cni-node"}
    return {
        # The user's first: the operator's own labels select the pods and must win.
        **(_agent(spec, component).pod_labels or {}),
        **v.labels(component, platform),
        **extra,
        # Agents are the data plane; they must never be enrolled in it.
        c.LABEL_DATAPLANE_MODE: "none",
        "sidecar.istio.io/inject": "false",
    }


def _pod_annotations(
    spec: AmbientMeshSpec, component: Component, plat: _Platform
) -> dict[str, str]:
    annotations = {"prometheus.io/scrape": "true", "sidecar.istio.io/inject": "false"}
    if component == v.ISTIO_CNI:
        annotations["prometheus.io/port"] = str(c.PORT_CNI_METRICS)
        annotations["prometheus.io/path"] = "/metrics"
    else:
        annotations["prometheus.io/port"] = str(c.PORT_METRICS)
        # Linux ztunnel is scraped at Prometheus's default path, /metrics, as
        # upstream's chart has it; Windows keeps its path until its own
        # comparison with upstream decides.
        if plat.windows:
            annotations["prometheus.io/path"] = "/stats/prometheus"
    # The user's win, as the charts' podAnnotations do, but for the one that
    # keeps a sidecar out of the agent itself.
    return {
        **annotations,
        **_revision(spec, component),
        **(_agent(spec, component).pod_annotations or {}),
        "sidecar.istio.io/inject": "false",
    }


def _host_network(component: Component, plat: _Platform) -> bool:
    """Whether the agent's pods use the node's network (the templates say the same)."""
    return plat.windows or component == v.ISTIO_CNI


def _without_surge(unavailable: int | str, surge: int | str) -> tuple[int | str, int | str]:
    """Rollout for host-network pods: replace, never surge.

    A surge pod would need the ports its predecessor still holds on the
    node, so the scheduler would leave it Pending and the rollout would
    stall; the surge budget becomes the unavailability budget instead.
    """
    if is_zero(surge):
        return unavailable, surge
    return surge, 0


def _daemonset_values(
    spec: AmbientMeshSpec, component: Component, plat: _Platform
) -> dict[str, Any]:
    """Values of the shared DaemonSet skeleton (identity, rollout, placement)."""
    rollout: Rollout
    if component == v.ZTUNNEL:
        rollout, resources = spec.ztunnel.rollout, spec.ztunnel.resources
        grace = spec.ztunnel.termination_grace_period_seconds
        account = v.SA_ZTUNNEL_WINDOWS if plat.windows else v.SA_ZTUNNEL
    else:
        rollout, resources = spec.istio_cni.rollout, spec.istio_cni.resources
        grace = (
            WINDOWS_CNI_GRACE_SECONDS
            if plat.windows
            else spec.istio_cni.termination_grace_period_seconds
        )
        account = v.SA_ISTIO_CNI
    unavailable, surge = rollout.effective(*ROLLOUT_DEFAULTS[component])
    if _host_network(component, plat):
        unavailable, surge = _without_surge(unavailable, surge)
    return {
        "name": v.daemonset_name(component, plat.name),
        "namespace": spec.namespace,
        "labels": _object_labels(spec, component, plat.name),
        "annotations": _object_annotations(spec, component),
        "selector": v.selector(component, plat.name),
        "max_unavailable": unavailable,
        "max_surge": surge,
        "pod_labels": _pod_labels(spec, component, plat.name),
        "pod_annotations": _pod_annotations(spec, component, plat),
        "os": plat.where.os,
        "service_account": account,
        "priority_class": spec.priority_class_name,
        "grace_seconds": grace,
        "node_selector": plat.where.node_selector,
        "affinity": plat.where.affinity,
        "tolerations": pl.tolerations(spec, plat.name),
        "resources": v.resources(resources),
        "ports": PORTS,
        "zds_address": c.ZDS_PIPE if plat.windows else c.ZTUNNEL_UDS,
        "run_as": v.WINDOWS_RUN_AS,
        "profile": plat.profile,
        "root_cert": v.ISTIO_CA_ROOT_CERT,
        "log_as_json": _agent(spec, component).log_as_json,
        **_dns(spec, component, plat),
        **_security_extras(spec, component, plat),
        **v.component_args(spec),
    }


def _taken_env(
    spec: AmbientMeshSpec, component: Component, rendered: dict[str, Any], also: set[str]
) -> list[str]:
    """Names of spec.<agent>.env the operator sets itself (in the rendered DaemonSet, or in
    `also`: the ConfigMap the container takes with envFrom), which are left out.

    An env list with one name twice is taken by the API server, and the agent
    then reads whichever its runtime finds first; an env entry beats envFrom.
    The operator's own values (addresses, identity, the pipe) must be what it reads.
    """
    ours = {
        e["name"]
        for cont in rendered["spec"]["template"]["spec"]["containers"]
        for e in cont.get("env", [])
    } | also
    return sorted(set(_agent(spec, component).env or {}) & ours)


def _extra_env(
    spec: AmbientMeshSpec, component: Component, taken: set[str]
) -> list[dict[str, str]]:
    """The user's env entries, in name order (as Helm ranges over a map), less names we set."""
    return [
        {"name": name, "value": value}
        for name, value in sorted((_agent(spec, component).env or {}).items())
        if name not in taken
    ]


def _cpu_env(resources: Resources) -> list[dict[str, Any]]:
    """ztunnel's view of its own CPU budget, as upstream passes it.

    ZTUNNEL_CPU_LIMIT is always set (node capacity without a limit): ztunnel
    sizes its worker threads from it. The other two tell it which of the
    bounds were asked for, so only those present are set.
    """

    def field(name: str, resource: str) -> dict[str, Any]:
        ref = {"resource": resource, "divisor": "1"}
        return {"name": name, "valueFrom": {"resourceFieldRef": ref}}

    env = [field("ZTUNNEL_CPU_LIMIT", "limits.cpu")]
    if "cpu" in (resources.limits or {}):
        env.append(field("ZTUNNEL_RESOURCE_CPU_LIMIT", "limits.cpu"))
    if "cpu" in (resources.requests or {}):
        env.append(field("ZTUNNEL_RESOURCE_CPU_REQUEST", "requests.cpu"))
    return env


def _with_extra_env(
    spec: AmbientMeshSpec,
    component: Component,
    template: str,
    values: dict[str, Any],
    own: list[dict[str, Any]],
    warnings: list[str],
    config_keys: set[str],
) -> dict[str, Any]:
    """Render a DaemonSet with the operator's optional env, then the user's less names it sets."""
    bare = render_object(template, **values, extra_env=own)
    if not _agent(spec, component).env:
        return bare
    taken = _taken_env(spec, component, bare, config_keys)
    if taken:
        field = "spec.ztunnel.env" if component == v.ZTUNNEL else "spec.istioCni.env"
        warnings.append(
            f"{field} sets {', '.join(taken)}, which the operator sets itself on "
            f"{values['name']}: left out; use the AmbientMesh field that sets it instead"
        )
    extra = _extra_env(spec, component, set(taken))
    return render_object(template, **values, extra_env=own + extra)


def _ztunnel_env(spec: AmbientMeshSpec, plat: _Platform) -> list[dict[str, Any]]:
    """ztunnel's env that depends on the spec: identity in a multi-cluster mesh, logs, CRL."""
    env: list[dict[str, Any]] = []
    # The Linux template says the cluster itself; on Windows it is said here, as
    # the experiment's own manifest does.
    if plat.windows:
        cluster = spec.multi_cluster.cluster_name or c.DEFAULT_CLUSTER_ID
        env.append({"name": "ISTIO_META_CLUSTER_ID", "value": cluster})
    if spec.network:
        env.append({"name": "NETWORK", "value": spec.network})
    if spec.ztunnel.log_as_json:
        env.append({"name": "LOG_FORMAT", "value": "json"})
    # The Windows experiment's ztunnel reads no CRL_PATH.
    if spec.ztunnel.peer_ca_crl and not plat.windows:
        env.append({"name": "CRL_PATH", "value": CRL_PATH})
    return env


def _ztunnel(
    spec: AmbientMeshSpec,
    plat: _Platform,
    image: str,
    warnings: list[str],
    addresses: tuple[str | None, str | None],
) -> dict[str, Any]:
    """ztunnel's DaemonSet; `addresses` are istiod's and the cluster DNS's IPs (Windows only)."""
    values = _daemonset_values(spec, v.ZTUNNEL, plat)
    values["image"] = image
    own = _ztunnel_env(spec, plat)
    template = (
        "daemonset-ztunnel-windows.yaml.j2" if plat.windows else "daemonset-ztunnel-linux.yaml.j2"
    )
    if not plat.windows:
        values["istiod"] = v.linux_istiod(spec)
        values["cluster_id"] = spec.multi_cluster.cluster_name or c.DEFAULT_CLUSTER_ID
        values["cpu_env"] = _cpu_env(spec.ztunnel.resources)
        values["peer_ca_crl"] = spec.ztunnel.peer_ca_crl
        values["volumes"] = _dumped(spec.ztunnel.volumes)
        values["volume_mounts"] = _dumped(spec.ztunnel.volume_mounts)
    else:
        istiod_ip, dns_ip = addresses
        values["istiod"], _ = v.windows_istiod(spec, istiod_ip)
        values["dns_ip"], _ = v.windows_dns(dns_ip, spec)
    return _with_extra_env(spec, v.ZTUNNEL, template, values, own, warnings, set())


def _istio_cni(
    spec: AmbientMeshSpec,
    plat: _Platform,
    image: str,
    warnings: list[str],
    config_keys: set[str],
) -> dict[str, Any]:
    values = _daemonset_values(spec, v.ISTIO_CNI, plat)
    values["config_map"] = v.cni_config_map_name(plat.name)
    values["image"] = image
    template = (
        "daemonset-istio-cni-windows.yaml.j2"
        if plat.windows
        else "daemonset-istio-cni-linux.yaml.j2"
    )
    return _with_extra_env(spec, v.ISTIO_CNI, template, values, [], warnings, config_keys)


def _wanted_images(spec: AmbientMeshSpec, plat: _Platform) -> dict[Component, str]:
    """The images the spec asks for on a platform, per component."""
    if plat.windows:
        return {comp: v.windows_image(spec, comp, plat.name) for comp in (v.ISTIO_CNI, v.ZTUNNEL)}
    return {comp: v.linux_image(spec, comp) for comp in (v.ISTIO_CNI, v.ZTUNNEL)}


@functools.cache
def _enablement_selector() -> str:
    # The text upstream's chart renders (Helm's toYaml: sorted keys, block style).
    # Kept: PyYAML's emitter is pure Python, and this was a seventh of a node
    # pass's CPU (bench/profile_passes.py) for a constant.
    text: str = yaml.safe_dump(c.ENABLEMENT_SELECTORS, sort_keys=True, default_flow_style=False)
    return text.rstrip("\n")


def _cni_platform_settings(spec: AmbientMeshSpec, plat: _Platform) -> dict[str, str]:
    """The ConfigMap keys that differ between Linux and Windows, in their order."""
    cni = spec.istio_cni
    if plat.windows:
        win = spec.platforms.windows
        return {
            "AMBIENT_ENABLEMENT_SELECTOR": _enablement_selector(),
            # Only when asked for: the agent's default is off.
            **(
                {"ENABLE_AMBIENT_DETECTION_RETRY": "true"}
                if cni.enable_ambient_detection_retry
                else {}
            ),
            # On shutdown the agent gets the DaemonSet "istio-cni-node" (a name
            # it builds itself, with no override) to tell an upgrade from a
            # removal. Ours are named per build, so it would find the Linux one,
            # whose node affinity (the agent ignores nodeSelector) admits amd64
            # Windows nodes too, and keep its plugin
            # after its own DaemonSet is gone: every new pod's CNI ADD on the
            # node would then fail. Without the lookup it always removes the
            # plugin, which costs little: redirected pods keep their HNS
            # policies, and the next agent redirects the pods started meanwhile.
            "AMBIENT_DISABLE_SAFE_UPGRADE": "true",
            # HostProcess containers see host paths as they are; nothing is
            # mounted. The agent reads these names, not CNI_NET_DIR/CNI_BIN_DIR.
            "MOUNTED_CNI_NET_DIR": win.cni_conf_dir or plat.profile.windows_cni_conf_dir,
            "MOUNTED_CNI_BIN_DIR": win.cni_bin_dir or plat.profile.windows_cni_bin_dir,
            # Only when asked for: the agent otherwise takes the first file it finds.
            **({"CNI_CONF_NAME": cni.cni_conf_file_name} if cni.cni_conf_file_name else {}),
        }
    # The CNI directories are mounted where install-cni looks by default;
    # unchained (Multus), the plugin's own file needs its name.
    name = cni.cni_conf_file_name or plat.profile.cni_conf_name
    # The chart writes the file name only with an Istio-owned file, and then even empty.
    owned = (
        {"ISTIO_OWNED_CNI_CONF_FILENAME": cni.istio_owned_cni_config_file_name or ""}
        if cni.istio_owned_cni_config
        else {}
    )
    return {
        "AMBIENT_ENABLEMENT_SELECTOR": _enablement_selector(),
        **({"CNI_CONF_NAME": name} if name else {}),
        # install-cni reads an absent key as false, unlike the chart's default.
        "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP": _bool(cni.reconcile_iptables_on_startup),
        "ENABLE_AMBIENT_DETECTION_RETRY": _bool(cni.enable_ambient_detection_retry),
        "ISTIO_OWNED_CNI_CONFIG": _bool(cni.istio_owned_cni_config),
        **owned,
        "NATIVE_NFTABLES": _bool(cni.native_nftables),
        **{key: _bool(mode == cni.repair_mode) for mode, key in REPAIR_MODE_SETTINGS.items()},
        "REPAIR_INIT_CONTAINER_NAME": cni.repair_init_container_name,
        "REPAIR_BROKEN_POD_LABEL_KEY": cni.broken_pod_label.key,
        "REPAIR_BROKEN_POD_LABEL_VALUE": cni.broken_pod_label.value,
    }


def _cni_config(spec: AmbientMeshSpec, plat: _Platform) -> tuple[dict[str, Any], set[str]]:
    """The istio-cni ConfigMap of a platform, and the keys the operator writes in it.

    The chart writes the user's env there as well as in the container; the
    operator's keys stay its own.
    """
    values = _cni_config_values(spec, plat)
    config = render_object("configmap-istio-cni.yaml.j2", **values, extra={})
    own = set(config["data"])
    extra = {k: val for k, val in sorted((spec.istio_cni.env or {}).items()) if k not in own}
    if not extra:
        return config, own
    return render_object("configmap-istio-cni.yaml.j2", **values, extra=extra), own


def _cni_config_values(spec: AmbientMeshSpec, plat: _Platform) -> dict[str, Any]:
    cni = spec.istio_cni
    return dict(
        name=v.cni_config_map_name(plat.name),
        namespace=spec.namespace,
        labels=v.labels(v.ISTIO_CNI, plat.name),
        # A Windows image is one the user built; the tag would misstate it.
        version=None if plat.windows else spec.images.tag,
        # Windows has no DNS proxying and the HNS policies are IPv4 only.
        dns_capture="false" if plat.windows else _bool(cni.dns_capture),
        ipv6="false" if plat.windows else _bool(cni.ipv6),
        # Repair mends sidecar pods, which Windows has none of; the
        # experiment's Windows repair is not implemented.
        repair="false" if plat.windows else _bool(cni.repair),
        exclude_namespaces=",".join(cni.exclude_namespaces),
        zds_address=c.ZDS_PIPE if plat.windows else c.ZTUNNEL_UDS,
        # Multus runs istio-cni as a plugin of its own on OpenShift's Linux
        # nodes; Windows nodes chain it to their CNI whatever the platform.
        chained=_bool(plat.windows or _chained(spec, plat.profile)),
        settings=_cni_platform_settings(spec, plat),
    )


def _chained(spec: AmbientMeshSpec, prof: PlatformProfile) -> bool:
    """Whether Linux istio-cni chains its plugin: the spec's word, else the platform's."""
    chained = spec.istio_cni.chained
    return prof.chained if chained is None else chained


def _resource_quotas(spec: AmbientMeshSpec) -> list[dict[str, Any]]:
    """One quota per agent for system-node-critical pods, named as upstream's charts name them.

    Where the API server limits a priority class to namespaces with a
    matching quota (GKE does so for system-node-critical outside
    kube-system), the agents' pods are admitted only with one.
    """
    names: tuple[tuple[Component, str], ...] = (
        (v.ISTIO_CNI, "istio-cni-resource-quota"),
        (v.ZTUNNEL, "ztunnel"),
    )
    return [
        render_object(
            "resourcequota.yaml.j2",
            name=name,
            namespace=spec.namespace,
            labels=_shared_object_labels(spec, component),
            pods=str(spec.resource_quotas.pods or RESOURCE_QUOTA_PODS),
            priority_class=spec.priority_class_name,
        )
        for component, name in names
    ]


# Each agent's NetworkPolicy admits what upstream's charts' admit, rule by rule
# and in their order: ztunnel's readiness, metrics, admin, HBONE, outbound,
# inbound plaintext and DNS ports; istio-cni's metrics and readiness ports.
NETWORK_POLICY_INGRESS: dict[Component, tuple[tuple[tuple[str, int], ...], ...]] = {
    v.ZTUNNEL: (
        (("TCP", c.PORT_READINESS),),
        (("TCP", c.PORT_METRICS),),
        (("TCP", c.PORT_ZTUNNEL_ADMIN),),
        (("TCP", c.PORT_HBONE),),
        (("TCP", c.PORT_ZTUNNEL_OUTBOUND),),
        (("TCP", c.PORT_ZTUNNEL_INBOUND_PLAINTEXT),),
        (("TCP", c.PORT_ZTUNNEL_DNS), ("UDP", c.PORT_ZTUNNEL_DNS)),
    ),
    v.ISTIO_CNI: ((("TCP", c.PORT_CNI_METRICS),), (("TCP", c.PORT_CNI_READINESS),)),
}
# Named as upstream's charts name them.
NETWORK_POLICY_NAMES: dict[Component, str] = {v.ZTUNNEL: "ztunnel", v.ISTIO_CNI: "istio-cni"}


def _network_policies(spec: AmbientMeshSpec) -> list[dict[str, Any]]:
    """One NetworkPolicy per agent, selecting its Linux pods by the DaemonSet's selector.

    Only Linux ztunnel has a pod network of its own for a policy to act on;
    istio-cni (like upstream's) is selected although it runs on the host
    network, where most network plugins do not apply policies. Windows agents
    are HostProcess pods on the host network: no policy selects them.
    """
    return [
        render_object(
            "networkpolicy.yaml.j2",
            name=NETWORK_POLICY_NAMES[component],
            namespace=spec.namespace,
            labels=v.labels(component, PLATFORM_LINUX),
            selector=v.selector(component, PLATFORM_LINUX),
            ingress=NETWORK_POLICY_INGRESS[component],
        )
        for component in (v.ISTIO_CNI, v.ZTUNNEL)
    ]


def _network_attachment(
    spec: AmbientMeshSpec, served: str
) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Multus's NetworkAttachmentDefinition for istio-cni, or why it cannot be written.

    `served` is ClusterFacts.network_attachments.
    """
    if spec.istio_cni.provider != "multus":
        return [], []
    if served == NETWORK_ATTACHMENTS_SERVED:
        attachment = render_object(
            "networkattachmentdefinition.yaml.j2",
            name=v.NETWORK_ATTACHMENT,
            namespace=v.NETWORK_ATTACHMENT_NAMESPACE,
            labels=v.labels(v.ISTIO_CNI, PLATFORM_LINUX),
        )
        return [attachment], []
    where = f"NetworkAttachmentDefinition {v.NETWORK_ATTACHMENT_NAMESPACE}/{v.NETWORK_ATTACHMENT}"
    if served == NETWORK_ATTACHMENTS_NOT_GRANTED:
        why = (
            "the operator may not write NetworkAttachmentDefinitions. Set the chart value "
            "multus.enabled=true (helm upgrade ... --reset-then-reuse-values "
            "--set multus.enabled=true; "
            "without the chart, run it with --network-attachments)"
        )
    else:
        why = (
            "this cluster does not serve NetworkAttachmentDefinition (k8s.cni.cncf.io/v1): "
            "Multus is not installed. Install Multus"
        )
    message = (
        f"spec.istioCni.provider is multus, but {where} was not written: {why}, or unset "
        "spec.istioCni.provider. The rest of the agents are applied"
    )
    return [], [Problem(MeshReason.MULTUS_NOT_AVAILABLE, message)]


def _scc_rbac(
    spec: AmbientMeshSpec, moving_from: Sequence[str], accounts: Sequence[str]
) -> list[dict[str, Any]]:
    """OpenShift: the ztunnel accounts may use the privileged SCC (istio-cni's role has it)."""
    labels = v.labels(v.ZTUNNEL, PLATFORM_ALL)
    role = render_object("clusterrole-ztunnel-scc.yaml.j2", name=v.SA_ZTUNNEL, labels=labels)
    binding = render_object(
        "clusterrolebinding.yaml.j2",
        name=v.SA_ZTUNNEL,
        labels=labels,
        role=v.SA_ZTUNNEL,
        service_accounts=list(accounts),
        namespaces=_bound_namespaces(spec, moving_from),
    )
    return [role, binding]


def _service_account(spec: AmbientMeshSpec, name: str, component: Component) -> dict[str, Any]:
    return render_object(
        "serviceaccount.yaml.j2",
        name=name,
        namespace=spec.namespace,
        labels=_shared_object_labels(spec, component),
        annotations=_object_annotations(spec, component),
        automount=component == v.ISTIO_CNI,
        # Kubelet pulls a pod's images with its ServiceAccount's secrets, as the charts set them.
        pull_secrets=[{"name": n} for n in spec.images.pull_secrets or []],
    )


def deletes_pods(spec: AmbientMeshSpec) -> bool:
    """Whether istio-cni needs `delete` on every pod: repair on, in its Delete mode.

    The Label mode needs nothing more: it labels through pods/status, which
    istio-cni holds anyway for the redirection annotation.
    """
    return spec.istio_cni.repair and spec.istio_cni.repair_mode == "Delete"


def _bound_namespaces(spec: AmbientMeshSpec, moving_from: Sequence[str]) -> list[str]:
    """Where the agents' accounts are bound: spec.namespace, and those being moved away from."""
    return [spec.namespace, *sorted(set(moving_from) - {spec.namespace})]


def _rbac(
    spec: AmbientMeshSpec,
    prof: PlatformProfile,
    moving_from: Sequence[str],
    cni_daemonsets: Sequence[str],
) -> list[dict[str, Any]]:
    labels = v.labels(v.ISTIO_CNI, PLATFORM_ALL)
    role = render_object(
        "clusterrole-istio-cni.yaml.j2",
        name=v.CLUSTER_ROLE_ISTIO_CNI,
        labels=labels,
        daemonsets=sorted(cni_daemonsets),
        repair=spec.istio_cni.repair,
        delete_pods=deletes_pods(spec),
        privileged_scc=prof.privileged_scc,
    )
    binding = render_object(
        "clusterrolebinding.yaml.j2",
        name=v.CLUSTER_ROLE_ISTIO_CNI,
        labels=labels,
        role=v.CLUSTER_ROLE_ISTIO_CNI,
        service_accounts=[v.SA_ISTIO_CNI],
        # During a move the agents of both namespaces run: the old ones keep
        # working until the new ones are Ready, and the new ones need the
        # grant to become Ready at all.
        namespaces=_bound_namespaces(spec, moving_from),
    )
    return [role, binding]


def _platforms(
    spec: AmbientMeshSpec, assignment: Assignment, prof: PlatformProfile
) -> list[tuple[_Platform, Placed]]:
    """Each platform the spec enables, with the nodes its DaemonSets are for."""
    out: list[tuple[_Platform, Placed]] = []
    linux_spec = spec.platforms.linux
    if linux_spec.enabled:
        # The spec's directories win over the platform's.
        prof = dataclasses.replace(
            prof,
            cni_bin_dir=linux_spec.cni_bin_dir or prof.cni_bin_dir,
            cni_conf_dir=linux_spec.cni_conf_dir or prof.cni_conf_dir,
            cni_netns_dir=linux_spec.cni_netns_dir or prof.cni_netns_dir,
        )
        # Linux agents are rendered even with no Linux node yet: control
        # planes are Linux, and the DaemonSet costs nothing until one joins.
        linux = assignment.nodes_of(PLATFORM_LINUX)
        where = pl.with_node_affinity(
            pl.placement(pl.linux_requirements(spec), linux.missing, linux.unlabeled),
            linux_spec.node_affinity,
        )
        out.append((_Platform(PLATFORM_LINUX, where, prof), linux))
    win = spec.platforms.windows
    if win.enabled:
        builds = sorted(
            set(win.builds)
            if win.builds is not None
            else {p for p in assignment.placed if p != PLATFORM_LINUX}
        )
        for build in builds:
            nodes = assignment.nodes_of(build)
            where = pl.placement(
                pl.windows_requirements(spec, build), nodes.missing, nodes.unlabeled
            )
            out.append((_Platform(build, where, prof), nodes))
    return out


@dataclass(frozen=True)
class _PlatformInputs:
    """Everything one platform's objects (its istio-cni ConfigMap and DaemonSets) depend on.

    `_platform_objects` reads nothing else, so equal inputs give equal
    objects, and `RenderMemo` keys a platform's last render by them. The
    platform's nodes are not among them: they reach the objects only through
    `platform.where`, the placement they make.
    """

    spec: AmbientMeshSpec
    platform: _Platform
    # Per component, the image this pass gives it (render/rollout.py), and the
    # istiod revision its ztunnel serves.
    images: tuple[tuple[Component, str], ...]
    revision: str | None
    # Windows only (None on Linux, which dials by name): the IPs of istiod's
    # Service at that revision and of the cluster DNS, which HostProcess agents dial.
    istiod_ip: str | None
    dns_ip: str | None


@dataclass(frozen=True)
class _PlatformObjects:
    """One platform's rendered objects, and the warnings rendering them gave."""

    config: dict[str, Any]
    daemonsets: tuple[tuple[Component, dict[str, Any]], ...]
    warnings: tuple[str, ...]


def _platform_inputs(
    spec: AmbientMeshSpec, facts: ClusterFacts, plat: _Platform, rollout: PlatformRollout
) -> _PlatformInputs:
    istiod_ip = dns_ip = None
    if plat.windows:
        # A platform kept at another revision dials that revision's Service.
        served = at_revision(spec, rollout.revision).istiod.service()
        istiod_ip, dns_ip = facts.istiod_ips.get(served, facts.istiod_ip), facts.dns_ip
    images = tuple((comp, rollout.images[comp]) for comp in (v.ISTIO_CNI, v.ZTUNNEL))
    return _PlatformInputs(spec, plat, images, rollout.revision, istiod_ip, dns_ip)


def _platform_objects(inputs: _PlatformInputs) -> _PlatformObjects:
    spec, plat, images = inputs.spec, inputs.platform, dict(inputs.images)
    warnings: list[str] = []
    config, config_keys = _cni_config(spec, plat)
    cni = _istio_cni(spec, plat, images[v.ISTIO_CNI], warnings, config_keys)
    ztunnel = _ztunnel(
        at_revision(spec, inputs.revision),
        plat,
        images[v.ZTUNNEL],
        warnings,
        (inputs.istiod_ip, inputs.dns_ip),
    )
    return _PlatformObjects(config, ((v.ISTIO_CNI, cni), (v.ZTUNNEL, ztunnel)), tuple(warnings))


@dataclass(frozen=True)
class _SharedInputs:
    """Everything the objects every platform shares depend on (see `_shared_objects`)."""

    spec: AmbientMeshSpec
    # The ServiceAccounts the platforms use, and whether any platform is Linux.
    accounts: tuple[tuple[str, Component], ...]
    linux: bool
    # The Linux istio-cni DaemonSet names its ClusterRole lets it read.
    cni_daemonsets: tuple[str, ...]
    profile: PlatformProfile
    moving_from: tuple[str, ...]
    network_attachments: str
    cni_rbac: bool


@dataclass(frozen=True)
class _SharedObjects:
    """The shared objects in apply order around the platforms' ConfigMaps, and their problems."""

    before_configs: tuple[dict[str, Any], ...]
    after_configs: tuple[dict[str, Any], ...]
    problems: tuple[Problem, ...]


def _shared_objects(inputs: _SharedInputs) -> _SharedObjects:
    """ServiceAccounts, RBAC and ResourceQuotas; then NetworkPolicies and Multus's attachment.

    None of them names a node: a node changes them only by adding or
    removing a platform (which accounts exist, which DaemonSets istio-cni reads).
    """
    spec, prof = inputs.spec, inputs.profile
    before = [_service_account(spec, n, comp) for n, comp in inputs.accounts]
    after: list[dict[str, Any]] = []
    problems: list[Problem] = []
    if inputs.accounts and inputs.cni_rbac:
        before.extend(_rbac(spec, prof, inputs.moving_from, inputs.cni_daemonsets))
        if prof.privileged_scc:
            ztunnels = [n for n, comp in inputs.accounts if comp == v.ZTUNNEL]
            before.extend(_scc_rbac(spec, inputs.moving_from, ztunnels))
    quotas = spec.resource_quotas.enabled
    if inputs.accounts and (prof.resource_quotas if quotas is None else quotas):
        # Before the DaemonSets: their pods are refused until the quotas exist.
        before.extend(_resource_quotas(spec))
    if spec.network_policy.enabled and inputs.linux:
        after.extend(_network_policies(spec))
    if inputs.linux:
        # Multus attaches Linux pods only.
        attachments, problems = _network_attachment(spec, inputs.network_attachments)
        after.extend(attachments)
    return _SharedObjects(tuple(before), tuple(after), tuple(problems))


class RenderMemo:
    """The last render of each platform's objects and of the shared ones, by their inputs.

    Rendering is pure, so equal inputs give equal objects: a pass renders
    again only what its inputs changed. A node that joins, leaves or changes
    renders its own platform's objects again when it changes their placement,
    and no other platform's; the shared objects only when the set of
    platforms changes. Callers must not change what they are handed (the
    next pass may be handed it again), as with apply/plan.py's PassMemo. It
    holds one pass's renders: a platform not rendered in a pass is forgotten.
    """

    def __init__(self) -> None:
        self._platforms: dict[str, tuple[_PlatformInputs, _PlatformObjects]] = {}
        self._shared: tuple[_SharedInputs, _SharedObjects] | None = None
        # Each node's verdict (render/verdicts.py): a node event judges that node alone.
        self.verdicts = VerdictMemo()

    def platforms(self, wanted: Sequence[_PlatformInputs]) -> list[_PlatformObjects]:
        """Each platform's objects: the last render's where its inputs are equal."""
        kept: dict[str, tuple[_PlatformInputs, _PlatformObjects]] = {}
        for inputs in wanted:
            held = self._platforms.get(inputs.platform.name)
            if held is None or held[0] != inputs:
                held = (inputs, _platform_objects(inputs))
            kept[inputs.platform.name] = held
        self._platforms = kept
        return [objects for _, objects in kept.values()]

    def shared(self, inputs: _SharedInputs) -> _SharedObjects:
        """The shared objects: the last render's when its inputs are equal."""
        if self._shared is None or self._shared[0] != inputs:
            self._shared = (inputs, _shared_objects(inputs))
        return self._shared[1]


def render_dataplane(
    spec: AmbientMeshSpec,
    facts: ClusterFacts,
    *,
    cni_rbac: bool = True,
    memo: RenderMemo | None = None,
) -> RenderResult:
    """Desired data-plane objects for a spec (defaults applied) and the cluster's facts.

    Pure: no API calls, no clock, no randomness; the node order in the facts
    does not matter. Objects come in apply order: ServiceAccounts, RBAC,
    ResourceQuotas (where the platform needs them), ConfigMaps, NetworkPolicies and
    Multus's NetworkAttachmentDefinition (when asked for), DaemonSets.
    `cni_rbac=False` leaves out the istio-cni
    ClusterRole and its binding, for installs that ship them (the chart):
    the operator then needs neither the agent's permissions nor RBAC writes.
    `memo`, the last pass's (`RenderMemo`), spares rendering again what did
    not change; the result is the same with or without it.
    """
    memo = memo if memo is not None else RenderMemo()
    assignment = assign(spec, facts.nodes, memo.verdicts)
    prof = profile(facts.platform)
    platforms = _platforms(spec, assignment, prof)

    warnings: list[str] = [facts.platform_warning] if facts.platform_warning else []
    if any(p.windows for p, _ in platforms):
        _, istiod_warning = v.windows_istiod(spec, facts.istiod_ip)
        _, dns_warning = v.windows_dns(facts.dns_ip, spec)
        warnings.extend(w for w in (istiod_warning, dns_warning) if w)
        builds = [p.name for p, _ in platforms if p.windows]
        for component in (v.ZTUNNEL, v.ISTIO_CNI):
            image_warning = v.windows_image_warning(spec, component, builds)
            if image_warning:
                warnings.append(image_warning)
        wait_warning = v.redirection_wait_warning(spec, builds)
        if wait_warning:
            warnings.append(wait_warning)

    accounts: list[tuple[str, Component]] = []
    if platforms:
        accounts.append((v.SA_ISTIO_CNI, v.ISTIO_CNI))
    linux = any(not p.windows for p, _ in platforms)
    if linux:
        accounts.append((v.SA_ZTUNNEL, v.ZTUNNEL))
    if any(p.windows for p, _ in platforms):
        accounts.append((v.SA_ZTUNNEL_WINDOWS, v.ZTUNNEL))

    # _platforms lists Linux first, then the Windows builds oldest first: the
    # order a change of the agents' images (a new version) takes.
    rollout = decide(
        [p.name for p, _ in platforms],
        {p.name: _wanted_images(spec, p) for p, _ in platforms},
        facts.agents,
        spec.istiod.revision,
    )
    rendered = memo.platforms(
        [
            _platform_inputs(spec, facts, plat, turn)
            for (plat, _), turn in zip(platforms, rollout.platforms, strict=True)
        ]
    )
    plans: list[DaemonSetPlan] = []
    daemonsets: list[dict[str, Any]] = []
    for (plat, nodes), done in zip(platforms, rendered, strict=True):
        for component, obj in done.daemonsets:
            daemonsets.append(obj)
            plans.append(DaemonSetPlan(obj["metadata"]["name"], component, plat.name, nodes.names))
        warnings.extend(done.warnings)
    # Only the Linux agent looks its DaemonSet up, by the one name the agent
    # knows (istio-cni-node); the Windows agents skip the lookup.
    cni_names = tuple(
        p.name for p in plans if p.component == v.ISTIO_CNI and p.platform == PLATFORM_LINUX
    )
    shared = memo.shared(
        _SharedInputs(
            spec,
            tuple(accounts),
            linux,
            cni_names,
            prof,
            facts.moving_from,
            facts.network_attachments,
            cni_rbac,
        )
    )
    objects = [
        *shared.before_configs,
        *(done.config for done in rendered),
        *shared.after_configs,
        *daemonsets,
    ]
    return RenderResult(
        objects=tuple(objects),
        verdicts=assignment.verdicts,
        counted=assignment.tally,
        daemonsets=tuple(plans),
        warnings=tuple(warnings),
        rollout=rollout,
        problems=shared.problems,
    )
