"""render_dataplane: AmbientMesh spec + cluster facts -> desired data-plane objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator import constants as c
from ambient_operator.api.types import is_zero
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, Rollout
from ambient_operator.facts import ClusterFacts, NodeFacts
from ambient_operator.render import placement as pl
from ambient_operator.render import values as v
from ambient_operator.render.model import (
    PLATFORM_ALL,
    PLATFORM_LINUX,
    Component,
    DaemonSetPlan,
    RenderResult,
)
from ambient_operator.render.templating import render_object
from ambient_operator.render.verdicts import assign

# (default maxUnavailable, default maxSurge) per component, as upstream ships them.
ROLLOUT_DEFAULTS: dict[Component, tuple[int, int]] = {v.ZTUNNEL: (0, 1), v.ISTIO_CNI: (1, 0)}
CNI_GRACE_SECONDS = 5
PORTS = {
    "metrics": c.PORT_METRICS,
    "readiness": c.PORT_READINESS,
    "cni_metrics": c.PORT_CNI_METRICS,
    "cni_readiness": c.PORT_CNI_READINESS,
}
# The cluster's own plumbing (DNS, CNI, kube-proxy) must keep working when the mesh does not.
EXCLUDE_NAMESPACES = "kube-system"
LINUX_CNI_NET_DIR = "/etc/cni/net.d"
LINUX_MOUNTED_CNI_NET_DIR = "/host/etc/cni/net.d"


@dataclass(frozen=True)
class _Platform:
    """One platform's DaemonSet pair: "linux" or a Windows build."""

    name: str
    nodes: tuple[NodeFacts, ...]
    # Both agents of a platform go to the same nodes.
    where: pl.Placement

    @property
    def windows(self) -> bool:
        """Whether this is a Windows build."""
        return self.name != PLATFORM_LINUX


def _pod_labels(component: Component, platform: str) -> dict[str, str]:
    extra = {"app": "ztunnel"} if component == v.ZTUNNEL else {"k8s-app": "istio-cni-node"}
    return {
        **v.labels(component, platform),
        **extra,
        # Agents are the data plane; they must never be enrolled in it.
        c.LABEL_DATAPLANE_MODE: "none",
        "sidecar.istio.io/inject": "false",
    }


def _pod_annotations(component: Component) -> dict[str, str]:
    if component == v.ZTUNNEL:
        port, path = c.PORT_METRICS, "/stats/prometheus"
    else:
        port, path = c.PORT_CNI_METRICS, "/metrics"
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": path,
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
        grace = CNI_GRACE_SECONDS
        account = v.SA_ISTIO_CNI
    unavailable, surge = rollout.effective(*ROLLOUT_DEFAULTS[component])
    if _host_network(component, plat):
        unavailable, surge = _without_surge(unavailable, surge)
    return {
        "name": v.daemonset_name(component, plat.name),
        "namespace": spec.namespace,
        "labels": v.labels(component, plat.name),
        "selector": v.selector(component, plat.name),
        "max_unavailable": unavailable,
        "max_surge": surge,
        "pod_labels": _pod_labels(component, plat.name),
        "pod_annotations": _pod_annotations(component),
        "os": "windows" if plat.windows else "linux",
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
        "root_cert": v.ISTIO_CA_ROOT_CERT,
        **v.component_args(spec),
    }


def _ztunnel(spec: AmbientMeshSpec, facts: ClusterFacts, plat: _Platform) -> dict[str, Any]:
    values = _daemonset_values(spec, v.ZTUNNEL, plat)
    if not plat.windows:
        return render_object(
            "daemonset-ztunnel-linux.yaml.j2",
            **values,
            image=v.linux_image(spec, v.ZTUNNEL),
            istiod=v.linux_istiod(spec),
        )
    istiod, _ = v.windows_istiod(spec, facts.istiod_ip)
    dns_ip, _ = v.windows_dns(facts.dns_ip, spec)
    return render_object(
        "daemonset-ztunnel-windows.yaml.j2",
        **values,
        image=v.windows_image(spec, v.ZTUNNEL, plat.name),
        istiod=istiod,
        dns_ip=dns_ip,
    )


def _istio_cni(spec: AmbientMeshSpec, plat: _Platform) -> dict[str, Any]:
    values = _daemonset_values(spec, v.ISTIO_CNI, plat)
    values["config_map"] = v.cni_config_map_name(plat.name)
    if plat.windows:
        image = v.windows_image(spec, v.ISTIO_CNI, plat.name)
        return render_object("daemonset-istio-cni-windows.yaml.j2", **values, image=image)
    image = v.linux_image(spec, v.ISTIO_CNI)
    return render_object("daemonset-istio-cni-linux.yaml.j2", **values, image=image)


def _cni_config(spec: AmbientMeshSpec, plat: _Platform) -> dict[str, Any]:
    dirs: dict[str, str | None]
    if plat.windows:
        win = spec.platforms.windows
        # HostProcess containers see host paths as they are; nothing is mounted.
        dirs = {
            "cni_net_dir": win.cni_conf_dir,
            "mounted_cni_net_dir": win.cni_conf_dir,
            "cni_bin_dir": win.cni_bin_dir,
        }
    else:
        dirs = {
            "cni_net_dir": LINUX_CNI_NET_DIR,
            "mounted_cni_net_dir": LINUX_MOUNTED_CNI_NET_DIR,
            "cni_bin_dir": None,
        }
    return render_object(
        "configmap-istio-cni.yaml.j2",
        name=v.cni_config_map_name(plat.name),
        namespace=spec.namespace,
        labels=v.labels(v.ISTIO_CNI, plat.name),
        version=spec.images.tag,
        # Windows has no DNS proxying and the HNS policies are IPv4 only.
        dns_capture="false" if plat.windows else "true",
        ipv6="false" if plat.windows else "true",
        exclude_namespaces=EXCLUDE_NAMESPACES,
        zds_address=c.ZDS_PIPE if plat.windows else c.ZTUNNEL_UDS,
        **dirs,
    )


def _service_account(spec: AmbientMeshSpec, name: str, component: Component) -> dict[str, Any]:
    return render_object(
        "serviceaccount.yaml.j2",
        name=name,
        namespace=spec.namespace,
        labels=v.labels(component, PLATFORM_ALL),
        automount=component == v.ISTIO_CNI,
    )


def _rbac(spec: AmbientMeshSpec, cni_daemonsets: Sequence[str]) -> list[dict[str, Any]]:
    labels = v.labels(v.ISTIO_CNI, PLATFORM_ALL)
    role = render_object(
        "clusterrole-istio-cni.yaml.j2",
        name=v.CLUSTER_ROLE_ISTIO_CNI,
        labels=labels,
        daemonsets=sorted(cni_daemonsets),
    )
    binding = render_object(
        "clusterrolebinding.yaml.j2",
        name=v.CLUSTER_ROLE_ISTIO_CNI,
        labels=labels,
        role=v.CLUSTER_ROLE_ISTIO_CNI,
        service_accounts=[v.SA_ISTIO_CNI],
        namespace=spec.namespace,
    )
    return [role, binding]


def _platforms(
    spec: AmbientMeshSpec, linux: tuple[NodeFacts, ...], windows: dict[str, tuple[NodeFacts, ...]]
) -> list[_Platform]:
    out: list[_Platform] = []
    if spec.platforms.linux.enabled:
        # Linux agents are rendered even with no Linux node yet: control
        # planes are Linux, and the DaemonSet costs nothing until one joins.
        where = pl.placement(pl.linux_requirements(spec), linux)
        out.append(_Platform(PLATFORM_LINUX, linux, where))
    win = spec.platforms.windows
    if win.enabled:
        builds = sorted(set(win.builds)) if win.builds is not None else sorted(windows)
        for build in builds:
            nodes = windows.get(build, ())
            where = pl.placement(pl.windows_requirements(spec, build), nodes)
            out.append(_Platform(build, nodes, where))
    return out


def render_dataplane(spec: AmbientMeshSpec, facts: ClusterFacts) -> RenderResult:
    """Desired data-plane objects for a spec (defaults applied) and the cluster's facts.

    Pure: no API calls, no clock, no randomness; the node order in the facts
    does not matter. Objects come in apply order: ServiceAccounts, RBAC,
    ConfigMaps, DaemonSets.
    """
    assignment = assign(spec, facts.nodes)
    platforms = _platforms(spec, assignment.linux, dict(assignment.windows))

    warnings: list[str] = []
    if any(p.windows for p in platforms):
        _, istiod_warning = v.windows_istiod(spec, facts.istiod_ip)
        _, dns_warning = v.windows_dns(facts.dns_ip, spec)
        warnings.extend(w for w in (istiod_warning, dns_warning) if w)

    accounts: list[tuple[str, Component]] = []
    if platforms:
        accounts.append((v.SA_ISTIO_CNI, v.ISTIO_CNI))
    if any(not p.windows for p in platforms):
        accounts.append((v.SA_ZTUNNEL, v.ZTUNNEL))
    if any(p.windows for p in platforms):
        accounts.append((v.SA_ZTUNNEL_WINDOWS, v.ZTUNNEL))

    objects: list[dict[str, Any]] = [_service_account(spec, n, comp) for n, comp in accounts]
    plans: list[DaemonSetPlan] = []
    daemonsets: list[dict[str, Any]] = []
    for plat in platforms:
        nodes = tuple(n.name for n in plat.nodes)
        pair: tuple[tuple[Component, dict[str, Any]], ...] = (
            (v.ISTIO_CNI, _istio_cni(spec, plat)),
            (v.ZTUNNEL, _ztunnel(spec, facts, plat)),
        )
        for component, obj in pair:
            daemonsets.append(obj)
            plans.append(DaemonSetPlan(obj["metadata"]["name"], component, plat.name, nodes))
    if platforms:
        cni_names = [p.name for p in plans if p.component == v.ISTIO_CNI]
        objects.extend(_rbac(spec, cni_names))
    objects.extend(_cni_config(spec, plat) for plat in platforms)
    objects.extend(daemonsets)
    return RenderResult(
        objects=tuple(objects),
        verdicts=assignment.verdicts,
        daemonsets=tuple(plans),
        warnings=tuple(warnings),
    )
