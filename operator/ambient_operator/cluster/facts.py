"""What the renderer needs to know about the cluster, read from API objects.

Facts are plain frozen values; gathering them (list Nodes, read Services) is
the caller's job, so rendering stays a pure function of spec and facts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.cluster.versions import RunningAgent

_KERNEL_BUILD = re.compile(r"^(10\.0\.[0-9]+)(?:[.\s]|$)")
# osImage is the last resort for Windows nodes whose kernelVersion is empty
# (some managed offerings blank it); the release year names the build.
_OS_IMAGE_BUILDS = {name: build for build, name in c.WINDOWS_BUILD_NAMES.items()}
# Whether the operator can write NetworkAttachmentDefinitions (spec.istioCni.provider multus).
NETWORK_ATTACHMENTS_SERVED = "served"
# The kind is not served: Multus (its CRD) is not installed.
NETWORK_ATTACHMENTS_NOT_SERVED = "not served"
# The operator is not allowed to write them (--network-attachments off; the chart's multus.enabled).
NETWORK_ATTACHMENTS_NOT_GRANTED = "not granted"


@dataclass(frozen=True)
class Taint:
    """A node taint as core/v1 has it (value may be absent)."""

    key: str
    value: str | None
    effect: str

    @classmethod
    def from_dict(cls, taint: Mapping[str, Any]) -> Taint:
        """Taint from its API JSON form."""
        value = taint.get("value")
        return cls(
            key=str(taint.get("key") or ""),
            value=None if value is None else str(value),
            effect=str(taint.get("effect") or ""),
        )


def windows_build(kernel_version: str | None) -> str | None:
    """The Windows build (`10.0.20348`) named by a kernel version like `10.0.20348.2762`."""
    if not kernel_version:
        return None
    match = _KERNEL_BUILD.match(kernel_version.strip())
    return match.group(1) if match else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class NodeFacts:
    """One node as placement sees it: OS, architecture, Windows build, labels, taints."""

    name: str
    os: str | None
    arch: str | None
    build: str | None
    build_from_label: bool
    # Mappings are not hashable; equality still compares them.
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    taints: tuple[Taint, ...] = ()

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeFacts:
        """Facts of a Node given in its API JSON form (as `kubectl get -o json` prints it).

        Raises ValueError naming the field when the Node is malformed.
        """
        metadata = _mapping(node.get("metadata"), "metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("metadata.name: a Node needs a name")
        raw_labels = _mapping(metadata.get("labels"), "metadata.labels")
        labels = {str(k): str(v) for k, v in raw_labels.items()}
        spec = _mapping(node.get("spec"), "spec")
        status = _mapping(node.get("status"), "status")
        info = _mapping(status.get("nodeInfo"), "status.nodeInfo")

        raw_taints = spec.get("taints") or []
        if not isinstance(raw_taints, list):
            raise ValueError("spec.taints: expected a list")
        taints = tuple(
            Taint.from_dict(_mapping(t, f"spec.taints[{i}]")) for i, t in enumerate(raw_taints)
        )

        os_name = node_os(node)
        arch = labels.get(c.LABEL_ARCH) or _str_or_none(info.get("architecture"))
        build: str | None = None
        from_label = False
        if os_name == "windows":
            label = labels.get(c.LABEL_WINDOWS_BUILD)
            if label:
                # The label is what the DaemonSets select on, so it wins even
                # over a kernel version that disagrees with it.
                build, from_label = label, True
            else:
                build = windows_build(_str_or_none(info.get("kernelVersion")))
                if build is None:
                    image = _str_or_none(info.get("osImage")) or ""
                    build = next(
                        (b for prefix, b in _OS_IMAGE_BUILDS.items() if image.startswith(prefix)),
                        None,
                    )
        return cls(
            name=name,
            os=os_name,
            arch=arch,
            build=build,
            build_from_label=from_label,
            labels=labels,
            taints=taints,
        )


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class ClusterFacts:
    """Everything about the cluster that rendering depends on."""

    nodes: tuple[NodeFacts, ...]
    # ClusterIP of the istiod Service; Windows HostProcess agents dial it directly.
    istiod_ip: str | None = None
    # ClusterIP of the cluster DNS Service, for the NRPT rule on Windows nodes.
    dns_ip: str | None = None
    kube_version: str = "1.37"
    # Namespaces other than spec.namespace where agents of this mesh still run:
    # a move of spec.namespace is under way, and their istio-cni accounts stay
    # bound until the operator prunes them.
    moving_from: tuple[str, ...] = ()
    # Our agent DaemonSets in spec.namespace as they run now, by (platform,
    # component): where a change of their images (a new version) stands.
    agents: Mapping[tuple[str, str], RunningAgent] = field(default_factory=dict, hash=False)
    # The platform the agents are rendered for (cluster/platform.py decides:
    # detected from the Nodes, or spec.platform).
    platform: str = "generic"
    # What the status must say about that choice (nodes that disagree), if anything.
    platform_warning: str | None = None
    # Whether NetworkAttachmentDefinitions (Multus) can be written: granted to
    # the operator and served by the API server (NETWORK_ATTACHMENTS_*).
    network_attachments: str = NETWORK_ATTACHMENTS_SERVED
    # ClusterIPs of every istiod Service in spec.namespace by name: a platform
    # still at another revision during a rollout dials its own.
    istiod_ips: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def from_nodes(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        *,
        istiod_ip: str | None = None,
        dns_ip: str | None = None,
        kube_version: str = "1.37",
    ) -> ClusterFacts:
        """Facts from Nodes in API JSON form plus the two Service IPs."""
        return cls(
            nodes=tuple(NodeFacts.from_node(n) for n in nodes),
            istiod_ip=istiod_ip,
            dns_ip=dns_ip,
            kube_version=kube_version,
        )


def node_os(node: Mapping[str, Any] | None) -> str | None:
    """A Node's OS: its kubernetes.io/os label, else what its kubelet reports; None if neither.

    The one reading of a Node's OS, for render's facts, the waypoints' check
    for Windows nodes and the enrollment counts alike. Never raises: a
    malformed Node has no OS.
    """
    if not isinstance(node, Mapping):
        return None
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    label = labels.get(c.LABEL_OS) if isinstance(labels, Mapping) else None
    if isinstance(label, str) and label:
        return label
    status = node.get("status")
    info = status.get("nodeInfo") if isinstance(status, Mapping) else None
    reported = info.get("operatingSystem") if isinstance(info, Mapping) else None
    return reported if isinstance(reported, str) and reported else None
