"""Names, labels and ports of the field (see shared DESIGN §1); one place to change them."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any, Final

API_GROUP: Final = "ambientoperator.io"
API_VERSION: Final = "v1alpha1"
KIND: Final = "AmbientMesh"
PLURAL: Final = "ambientmeshes"
# The AmbientMesh CRD, which the operator watches to tell an old schema.
CRD_NAME: Final = "ambientmeshes.ambientoperator.io"
SINGULAR: Final = "ambientmesh"
SHORT_NAMES: Final = ("amesh",)
MESH_NAME: Final = "default"


@functools.cache
def operator_version() -> str | None:
    """This operator's version, as its installed package says; None in a source tree not
    installed. The API server's audit log sees it in the user agent, and the agents'
    DaemonSets name it as the writer of their template (apply/held.py).

    Read once: the package's metadata does not change under a running process,
    and reading it stats files (6 % of a node pass at 5,000 nodes, where every
    render names the redirection-wait image by it)."""
    try:
        return importlib.metadata.version("ambient-operator")
    except importlib.metadata.PackageNotFoundError:
        return None


# What the operator renders with: its code, its templates and its samples (a
# rebuilt image can change any of them and keep its version string).
CODE_SUFFIXES: Final = (".py", ".j2", ".yaml")


def code_digest(root: Path) -> str:
    """A digest of the files under `root` that the operator renders with (CODE_SUFFIXES),
    by their paths and bytes: the same tree, the same digest, wherever it lies."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


@functools.cache
def operator_build() -> str:
    """This operator's version and the digest of its package (`<version>+<digest>`), once a
    process: what the agents' DaemonSets name as the writer of their template
    (apply/held.py), so that a rebuild under the same version string is told apart."""
    return f"{operator_version() or 'unknown'}+{code_digest(Path(__file__).resolve().parents[1])}"


# The default Istio release of the agents: the release tagged at the commit of
# istio.io/istio pinned in hack/cluster/istio/go.mod, whose charts and istiod
# every test runs (api/releases.py has the fact and its source; a test holds
# the two together).
ISTIO_VERSION: Final = "1.31.0"

# Kubernetes minors the rendered manifests are validated against
# (tests/test_render_validate.py) and docs/installation.md promises.
KUBE_MINORS: Final = (30, 37)

FIELD_MANAGER: Final = "ambient-operator"
MANAGED_BY: Final = "ambient-operator"
PART_OF: Final = "istio-ambient"

LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
# Which Windows build (or "linux") a data-plane object is for; lets the
# operator find and prune per-build objects by label, never by name guessing.
LABEL_PLATFORM: Final = "ambientoperator.io/platform"

LABEL_OS: Final = "kubernetes.io/os"
LABEL_ARCH: Final = "kubernetes.io/arch"
LABEL_HOSTNAME: Final = "kubernetes.io/hostname"
LABEL_WINDOWS_BUILD: Final = "node.kubernetes.io/windows-build"

LABEL_DATAPLANE_MODE: Final = "istio.io/dataplane-mode"
# The Istio revision an object belongs to (label on namespaces, annotation on ztunnel).
LABEL_REVISION: Final = "istio.io/rev"
# The network of a multi-network mesh: istiod reads it from its namespace, and
# writes it on each waypoint.
LABEL_NETWORK: Final = "topology.istio.io/network"
# istiod's and the proxies' cluster name when none is given.
DEFAULT_CLUSTER_ID: Final = "Kubernetes"
ANNOTATION_REDIRECTION: Final = "ambient.istio.io/redirection"
LABEL_USE_WAYPOINT: Final = "istio.io/use-waypoint"
LABEL_USE_WAYPOINT_NAMESPACE: Final = "istio.io/use-waypoint-namespace"
LABEL_WAYPOINT_FOR: Final = "istio.io/waypoint-for"
# istio-cni parses this YAML into its enrollment selectors; an empty value
# parses to none, and a pod no selector matches is never redirected. These are
# the rule of the istio.io API: the pod says ambient, or its namespace does and
# the pod does not say none.
ENABLEMENT_SELECTORS: Final[list[dict[str, Any]]] = [
    {"podSelector": {"matchLabels": {LABEL_DATAPLANE_MODE: "ambient"}}},
    {
        "podSelector": {
            "matchExpressions": [
                {"key": LABEL_DATAPLANE_MODE, "operator": "NotIn", "values": ["none"]}
            ]
        },
        "namespaceSelector": {"matchLabels": {LABEL_DATAPLANE_MODE: "ambient"}},
    },
]

# Windows Server builds by the first three parts of the kernel version.
BUILD_WS2019: Final = "10.0.17763"
BUILD_WS2022: Final = "10.0.20348"
BUILD_WS2025: Final = "10.0.26100"
WINDOWS_BUILD_NAMES: Final = {
    BUILD_WS2019: "Windows Server 2019",
    BUILD_WS2022: "Windows Server 2022",
    BUILD_WS2025: "Windows Server 2025",
}
# Ambient needs HostProcess containers and HNS L4 WFP proxy policies: WS2022+.
SUPPORTED_WINDOWS_BUILDS: Final = (BUILD_WS2022, BUILD_WS2025)
# Builds whose new pods need the redirection-wait init container.
PRE_WS2025_BUILDS: Final = (BUILD_WS2022,)
# Image tag suffix of Windows images per build (process isolation matches the host).
WINDOWS_BUILD_TAGS: Final = {BUILD_WS2022: "ltsc2022", BUILD_WS2025: "ltsc2025"}

ZDS_PIPE: Final = r"\\.\pipe\istio-zds"
ZTUNNEL_UDS: Final = "/var/run/ztunnel/ztunnel.sock"

PORT_ZTUNNEL_OUTBOUND: Final = 15001
PORT_ZTUNNEL_INBOUND_PLAINTEXT: Final = 15006
PORT_HBONE: Final = 15008
PORT_ZTUNNEL_DNS: Final = 15053
PORT_ZTUNNEL_ADMIN: Final = 15000
PORT_READINESS: Final = 15021
PORT_METRICS: Final = 15020
PORT_ISTIOD_XDS: Final = 15012
PORT_CNI_READINESS: Final = 8000
PORT_CNI_METRICS: Final = 15014
PORT_ENVOY_STATS: Final = 15090

# Gateway API and istiod's gateway deployment conventions (waypoints).
GATEWAY_API_VERSION: Final = "gateway.networking.k8s.io/v1"
LABEL_GATEWAY_NAME: Final = "gateway.networking.k8s.io/gateway-name"
LABEL_GATEWAY_CLASS_NAME: Final = "gateway.networking.k8s.io/gateway-class-name"
ANNOTATION_GATEWAY_NAME_OVERRIDE: Final = "gateway.istio.io/name-override"
ANNOTATION_GATEWAY_SERVICE_ACCOUNT: Final = "gateway.istio.io/service-account"
LABEL_DEFAULTS_FOR_CLASS: Final = "gateway.istio.io/defaults-for-class"
ISTIO_WAYPOINT_CLASS: Final = "istio-waypoint"
ISTIO_MESH_CONTROLLER: Final = "istio.io/mesh-controller"
# istiod tells waypoint objects (Service, Deployment, pods) from ordinary ones
# by this label; without it a namespace's use-waypoint binds the waypoint's
# own Service to itself and its pods are indexed as plain workloads.
LABEL_GATEWAY_MANAGED: Final = "gateway.istio.io/managed"
GATEWAY_MANAGED_MESH: Final = "istio.io-mesh-controller"
# A ServiceAccount carrying this (value "true") may be named by a waypoint
# Gateway's service-account annotation (spec.waypoints.policy's default).
LABEL_WAYPOINT_SERVICE_ACCOUNT: Final = "ambientoperator.io/waypoint-service-account"
WAYPOINT_FOR_VALUES: Final = ("service", "workload", "all", "none")
PROTOCOL_HBONE: Final = "HBONE"

# Which controller's prune set an object belongs to: the data plane owned by
# the AmbientMesh, or one waypoint owned by its Gateway.
LABEL_CONTROLLER = "ambientoperator.io/controller"
# LABEL_CONTROLLER's value on the data plane's objects.
DATAPLANE_CONTROLLER: Final = "dataplane"
# On each object taken over from a Helm release: the release (apply/adopt.py).
ADOPTED_FROM: Final = "ambientoperator.io/adopted-from"
