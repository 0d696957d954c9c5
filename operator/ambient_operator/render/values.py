"""Values the templates lay out: names, labels, images, istiod and DNS addresses."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import bundled
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, ComponentImage, Resources
from ambient_operator.render.model import Component

ZTUNNEL: Component = "ztunnel"
ISTIO_CNI: Component = "istio-cni"

# Upstream image repository names of the two agents.
IMAGE_NAMES: dict[Component, str] = {ZTUNNEL: "ztunnel", ISTIO_CNI: "install-cni"}
# Istio publishes no Windows images. Its Windows experiment (istio/istio,
# branch experimental-windows-ambient) names them so in tools/docker.yaml, and
# `make images` builds them under the same names, for HostProcess pods of any build.
WINDOWS_IMAGE_NAMES: dict[Component, str] = {
    ZTUNNEL: bundled.ZTUNNEL_WINDOWS,
    ISTIO_CNI: bundled.INSTALL_CNI_WINDOWS,
}
WINDOWS_IMAGE_FIELDS: dict[Component, str] = {
    ZTUNNEL: "spec.images.ztunnel.windows",
    ISTIO_CNI: "spec.images.istioCni.windows",
}
MULTI_BUILD_IMAGE_FIELD = "spec.newPodWorkaround.multiBuildImage"

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
    """The Windows image when none is set in full: the one `make images` pushed under
    spec.images.registry; with no registry, the experiment's name under hub and tag."""
    registry = spec.images.registry
    if registry:
        return bundled.reference(
            registry, WINDOWS_IMAGE_NAMES[component], bundled.WINDOWS_AGENT_TAG
        )
    return f"{spec.images.hub}/{WINDOWS_IMAGE_NAMES[component]}:{spec.images.tag}"


def windows_image(spec: AmbientMeshSpec, component: Component, build: str) -> str:
    """Image of a component on one Windows build: per-build override, Windows override, default.

    With no registry the default is rendered although nobody publishes it: it is
    the name the experiment's own build gives, so an image built and pushed under
    the spec's hub and tag is picked up without another change, and until then
    the pods' pull errors show on the DaemonSet while `windows_image_warning`
    says what to build and set. Leaving the agents out instead would report
    nothing on the DaemonSets and still leave the Windows nodes without them.
    """
    return _windows_override(spec, component, build) or default_windows_image(spec, component)


def _where(builds: Sequence[str]) -> str:
    return " and ".join(
        f"{c.WINDOWS_BUILD_NAMES.get(b, 'Windows')} (build {b})" for b in sorted(builds)
    )


def _build_it(field: str) -> str:
    return (
        f"Build it with `{bundled.BUILD_COMMAND}` (docs/images.md), then set "
        f"{bundled.REGISTRY_FIELD} (or the chart's value {bundled.CHART_REGISTRY_VALUE}) to that "
        f"registry, or set {field} to an image of your own"
    )


def windows_image_warning(
    spec: AmbientMeshSpec, component: Component, builds: Sequence[str]
) -> str | None:
    """Why the Windows image of a component will not pull, if any build uses one that won't.

    Unset with no registry, any hub is a guess, not only Istio's: a mirror of
    Istio's has no Windows images either, so the warning stays until a
    registry or the field is set. Set to a name under Istio's own hub, it is a
    placeholder: that hub has none.
    """
    field = WINDOWS_IMAGE_FIELDS[component]
    unset = [
        b
        for b in builds
        if _windows_override(spec, component, b) is None and not spec.images.registry
    ]
    if unset:
        return (
            f"{field} is unset, and so is {bundled.REGISTRY_FIELD}: {component} on "
            f"{_where(unset)} uses {default_windows_image(spec, component)}, which Istio does "
            f"not publish. {_build_it(field)}"
        )
    placeholders = {b: windows_image(spec, component, b) for b in builds}
    placeholders = {b: i for b, i in placeholders.items() if bundled.is_placeholder(i)}
    if not placeholders:
        return None
    images = ", ".join(sorted(set(placeholders.values())))
    return (
        f"{component} on {_where(list(placeholders))} uses {images}, a placeholder: Istio "
        f"does not publish Windows images under {bundled.UPSTREAM_HUB}. {_build_it(field)}"
    )


def _usable(image: str) -> str | None:
    return None if bundled.is_placeholder(image) else image


def redirection_wait_image(spec: AmbientMeshSpec) -> str | None:
    """The multi-build redirection-wait image: spec.newPodWorkaround.multiBuildImage, else
    the index `make images` pushed under spec.images.registry.

    None when neither is set, or it is a placeholder under Istio's hub: that
    image is known not to exist, and the webhook hands no pod an image that
    cannot be pulled (ImageUnavailable, docs/windows-redirection-wait.md).
    """
    explicit = spec.new_pod_workaround.multi_build_image
    if explicit:
        return _usable(explicit)
    registry = spec.images.registry
    if not registry:
        return None
    return _usable(bundled.reference(registry, bundled.REDIRECTION_WAIT, bundled.operator_tag()))


def build_wait_image(spec: AmbientMeshSpec, build: str) -> str | None:
    """The redirection-wait image of one pre-WS2025 build (newPodWorkaround.images), else
    the multi-build image; None when the one it comes to is unavailable."""
    per_build = {str(k): ref for k, ref in spec.new_pod_workaround.images.items()}.get(build)
    return _usable(per_build) if per_build else redirection_wait_image(spec)


def redirection_wait_warning(spec: AmbientMeshSpec, builds: Sequence[str]) -> str | None:
    """Why new Windows pods on the pre-WS2025 builds among `builds` get no redirection-wait
    init container, if the image they would get is unavailable."""
    workaround = spec.new_pod_workaround
    pre = [b for b in builds if b in c.PRE_WS2025_BUILDS]
    if not workaround.enabled or not pre or redirection_wait_image(spec) is not None:
        return None
    explicit = workaround.multi_build_image
    why = (
        f"{MULTI_BUILD_IMAGE_FIELD} names {explicit}, a placeholder: Istio does not publish "
        f"a {bundled.REDIRECTION_WAIT} image"
        if explicit
        else f"{MULTI_BUILD_IMAGE_FIELD} is unset, and so is {bundled.REGISTRY_FIELD}"
    )
    unpinned = [b for b in pre if build_wait_image(spec, b) is None]
    who = "every new Windows pod" if unpinned else "a new Windows pod whose build is not fixed"
    return (
        f"{why}: {who} that may land on {_where(pre)} is admitted without the "
        f"{bundled.REDIRECTION_WAIT} init container (ImageUnavailable): its containers may "
        "start before istio-cni redirects it, and its traffic then bypasses ztunnel. "
        f"{_build_it(MULTI_BUILD_IMAGE_FIELD)}"
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
