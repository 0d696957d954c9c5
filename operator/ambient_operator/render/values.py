"""Values the templates lay out: names, labels, images, istiod and DNS addresses."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, ComponentImage, Resources
from ambient_operator.render.model import Component

ZTUNNEL: Component = "ztunnel"
ISTIO_CNI: Component = "istio-cni"

# Upstream image repository names of the two agents.
IMAGE_NAMES: dict[Component, str] = {ZTUNNEL: "ztunnel", ISTIO_CNI: "install-cni"}
# Istio publishes no Windows images. Its Windows experiment (istio/istio,
# branch experimental-windows-ambient) builds them as these targets of
# tools/docker.yaml, from these Dockerfiles, for HostProcess pods of any build.
WINDOWS_IMAGE_NAMES: dict[Component, str] = {
    ZTUNNEL: "ztunnel-windows",
    ISTIO_CNI: "install-cni-windows",
}
WINDOWS_DOCKERFILES: dict[Component, str] = {
    ZTUNNEL: "pilot/docker/Dockerfile.ztunnel-windows",
    ISTIO_CNI: "cni/deployments/kubernetes/Dockerfile.install-cni-windows",
}
WINDOWS_IMAGE_FIELDS: dict[Component, str] = {
    ZTUNNEL: "spec.images.ztunnel.windows",
    ISTIO_CNI: "spec.images.istioCni.windows",
}

SA_ZTUNNEL = "ztunnel"
SA_ZTUNNEL_WINDOWS = "ztunnel-windows"
SA_ISTIO_CNI = "istio-cni"
CLUSTER_ROLE_ISTIO_CNI = "istio-cni"
CONFIG_MAP_ISTIO_CNI = "istio-cni-config"
# Multus (spec.istioCni.provider multus): named and placed as the chart's. Multus
# lets pods of every namespace refer to attachments in its global namespaces,
# `default` among them.
NETWORK_ATTACHMENT = "istio-cni"
NETWORK_ATTACHMENT_NAMESPACE = "default"
ISTIO_CA_ROOT_CERT = "istio-ca-root-cert"
WINDOWS_RUN_AS = "NT AUTHORITY\\SYSTEM"

# Istio's Go agents know no "trace"; debug is the nearest.
CNI_LOG_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warn",
    "error": "error",
}


def windows_suffix(build: str) -> str:
    """Name suffix of a build's objects: `windows-ltsc2022`."""
    return f"windows-{c.WINDOWS_BUILD_TAGS[build]}"


def daemonset_name(component: Component, platform: str) -> str:
    """Name of the DaemonSet of a component on a platform ("linux" or a build)."""
    base = "ztunnel" if component == ZTUNNEL else "istio-cni-node"
    return base if platform == "linux" else f"{base}-{windows_suffix(platform)}"


def cni_config_map_name(platform: str) -> str:
    """Name of the istio-cni ConfigMap of a platform."""
    if platform == "linux":
        return CONFIG_MAP_ISTIO_CNI
    return f"{CONFIG_MAP_ISTIO_CNI}-{windows_suffix(platform)}"


def labels(component: Component, platform: str) -> dict[str, str]:
    """Labels on every object we render; the operator prunes by them."""
    return {
        c.LABEL_NAME: component,
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_COMPONENT: component,
        c.LABEL_PLATFORM: platform,
    }


def selector(component: Component, platform: str) -> dict[str, str]:
    """Pod selector of a DaemonSet: unique per component and platform, never changed."""
    return {c.LABEL_NAME: component, c.LABEL_PLATFORM: platform}


def _component_image(spec: AmbientMeshSpec, component: Component) -> ComponentImage:
    return spec.images.ztunnel if component == ZTUNNEL else spec.images.istio_cni


def linux_image(spec: AmbientMeshSpec, component: Component) -> str:
    """Image of a component on Linux nodes: <hub>/<name>:<tag>[-<variant>] unless set in full."""
    override = _component_image(spec, component).linux
    if override:
        return override
    variant = f"-{spec.images.variant}" if spec.images.variant else ""
    return f"{spec.images.hub}/{IMAGE_NAMES[component]}:{spec.images.tag}{variant}"


def _windows_override(spec: AmbientMeshSpec, component: Component, build: str) -> str | None:
    image = _component_image(spec, component)
    per_build = {str(key): ref for key, ref in (image.windows_builds or {}).items()}
    return per_build.get(build) or image.windows


def default_windows_image(spec: AmbientMeshSpec, component: Component) -> str:
    """The Windows image when none is set: the experiment's name under hub and tag."""
    return f"{spec.images.hub}/{WINDOWS_IMAGE_NAMES[component]}:{spec.images.tag}"


def windows_image(spec: AmbientMeshSpec, component: Component, build: str) -> str:
    """Image of a component on one Windows build: per-build override, Windows override, default.

    The default is rendered although nobody publishes it: it is the name the
    experiment's own build gives, so an image built and pushed under the
    spec's hub and tag is picked up without another change, and until then
    the pods' pull errors show on the DaemonSet while `windows_image_warning`
    says which field to set. Leaving the agents out instead would report
    nothing on the DaemonSets and still leave the Windows nodes without them.
    """
    return _windows_override(spec, component, build) or default_windows_image(spec, component)


def windows_image_warning(
    spec: AmbientMeshSpec, component: Component, builds: Sequence[str]
) -> str | None:
    """Why the default Windows image of a component will likely not pull, if any build uses it.

    Any registry is a guess, not only Istio's: a mirror of Istio's has no
    Windows images either, so the warning stays until the field is set.
    """
    defaulted = [b for b in builds if _windows_override(spec, component, b) is None]
    if not defaulted:
        return None
    field = WINDOWS_IMAGE_FIELDS[component]
    where = " and ".join(
        f"{c.WINDOWS_BUILD_NAMES.get(b, 'Windows')} (build {b})" for b in sorted(defaulted)
    )
    return (
        f"{field} is unset, so {component} on {where} uses "
        f"{default_windows_image(spec, component)}, which Istio does not publish: build the "
        f"{WINDOWS_IMAGE_NAMES[component]} image of istio/istio's experimental-windows-ambient "
        f"branch ({WINDOWS_DOCKERFILES[component]}), push it, and set {field} to its "
        "reference (even if it is this name)"
    )


def resources(res: Resources) -> dict[str, dict[str, str]]:
    """Container resources with quantities as strings, as the API server returns them."""
    out: dict[str, dict[str, str]] = {}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in sorted(res.requests.items())}
    if res.limits:
        out["limits"] = {k: str(v) for k, v in sorted(res.limits.items())}
    return out


def istiod_host(spec: AmbientMeshSpec) -> str:
    """The istiod Service host name the agents verify istiod's certificate against."""
    return f"{spec.istiod.service()}.{spec.namespace}.svc"


def host_port(host: str, port: int) -> str:
    """host:port, with IPv6 literals bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def valid_ip(text: str | None) -> str | None:
    """The IP in canonical form, or None when unknown (absent, "None" for headless, junk)."""
    if not text:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


@dataclass(frozen=True)
class IstiodEndpoint:
    """How agents dial istiod's CA and XDS, and the TLS name of each when dialled by IP."""

    ca_address: str
    xds_address: str
    ca_hostname: str | None = None
    xds_hostname: str | None = None


def _endpoint(spec: AmbientMeshSpec, found: str, hostname: str | None) -> IstiodEndpoint:
    """The endpoint for the address the agent found; a spec's address is dialled as written."""
    ca = spec.istiod.ca_address or spec.istiod.address
    xds = spec.istiod.xds_address or spec.istiod.address
    return IstiodEndpoint(
        ca or found, xds or found, None if ca else hostname, None if xds else hostname
    )


def linux_istiod(spec: AmbientMeshSpec) -> IstiodEndpoint:
    """Linux agents resolve the Service name through kube-dns."""
    return _endpoint(spec, host_port(istiod_host(spec), c.PORT_ISTIOD_XDS), None)


def windows_istiod(
    spec: AmbientMeshSpec, istiod_ip: str | None
) -> tuple[IstiodEndpoint, str | None]:
    """How Windows HostProcess agents, which cannot use kube-dns, dial istiod.

    Returns the endpoint and a warning when the Service IP is unknown.
    """
    if spec.istiod.dialled_as_written():
        return _endpoint(spec, "", None), None
    host = istiod_host(spec)
    ip = valid_ip(istiod_ip)
    if ip is not None:
        return _endpoint(spec, host_port(ip, c.PORT_ISTIOD_XDS), host), None
    # The fully qualified name falls under the NRPT rule for the cluster
    # domain, so the host can resolve it once that rule is in place.
    fqdn = f"{host}.{spec.cluster_domain}"
    warning = (
        f"istiod Service IP unknown ({spec.namespace}/{spec.istiod.service()} not found or "
        f"headless): Windows agents dial {host_port(fqdn, c.PORT_ISTIOD_XDS)}, which "
        "resolves only through the cluster DNS rule on the node"
    )
    return _endpoint(spec, host_port(fqdn, c.PORT_ISTIOD_XDS), host), warning


def windows_dns(dns_ip: str | None, spec: AmbientMeshSpec) -> tuple[str | None, str | None]:
    """The cluster DNS IP for the NRPT rule, and a warning when it is unknown."""
    ip = valid_ip(dns_ip)
    if ip is not None:
        return ip, None
    return None, (
        f"cluster DNS Service IP unknown: Windows nodes get no name resolution rule for "
        f".{spec.cluster_domain}, so Windows agents cannot resolve cluster names"
    )


def component_args(spec: AmbientMeshSpec) -> dict[str, Any]:
    """Values both OS variants of the agents share."""
    return {
        "cni_log_level": CNI_LOG_LEVELS[spec.istio_cni.log_level or spec.log_level],
        "log_level": spec.ztunnel.log_level or spec.log_level,
        "cluster_domain": spec.cluster_domain,
        "pull_policy": spec.images.pull_policy,
    }
