"""A local Kubernetes control plane for tests and demos, without containers.

The programs are the upstream ones (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) built by
``hack/build-binaries.sh``; see :class:`LocalCluster`. Fake nodes come from an
inventory file via :func:`create_nodes`. What the tests, the benchmarks
and the demo share to run the operator on it (its process, deadline waits,
the audit log, the AmbientMesh) is :mod:`ambient_devcluster.harness`.
"""

from .istio import (
    ISTIO_NAMESPACE,
    IstioControlPlane,
    cluster_dns_service,
    install_istiod_objects,
    istiod_values,
    render_istiod_chart,
)
from .launcher import (
    BINARIES,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_VALUE,
    POD_CIDR,
    SERVICE_CIDR,
    ClusterError,
    LocalCluster,
    Ports,
    api_client_for,
    default_bin_dir,
    wait_processes_gone,
)
from .manifests import (
    ManifestError,
    apply_dirs,
    apply_objects,
    load_manifests,
    wait_crds_established,
)
from .nodes import (
    create_nodes,
    delete_nodes,
    load_inventory,
    node_ready,
    parse_inventory,
    to_kwok_node,
    wait_nodes_ready,
)
from .process import ProcInfo, find_processes, pid_alive

__all__ = [
    "BINARIES",
    "ISTIO_NAMESPACE",
    "KWOK_NODE_ANNOTATION",
    "KWOK_NODE_VALUE",
    "POD_CIDR",
    "SERVICE_CIDR",
    "ClusterError",
    "IstioControlPlane",
    "LocalCluster",
    "ManifestError",
    "Ports",
    "ProcInfo",
    "api_client_for",
    "apply_dirs",
    "apply_objects",
    "cluster_dns_service",
    "create_nodes",
    "default_bin_dir",
    "delete_nodes",
    "find_processes",
    "install_istiod_objects",
    "istiod_values",
    "load_inventory",
    "load_manifests",
    "node_ready",
    "parse_inventory",
    "pid_alive",
    "render_istiod_chart",
    "to_kwok_node",
    "wait_crds_established",
    "wait_nodes_ready",
    "wait_processes_gone",
]
