"""What each Kubernetes platform changes in the agents: host paths, quotas, policies.

The Linux settings are those of upstream's platform profiles
(manifests/helm-profiles/platform-*.yaml of istio/istio, applied to the
istio-cni and ztunnel charts with `global.platform`);
tests/test_upstream_conformance.py renders the charts with each profile and
compares. The Windows CNI directories are each platform's own CNI's
(docs/platforms.md names the sources); Istio's Windows experiment was only
tried on AKS, so those of the other platforms are unverified.
"""

from __future__ import annotations

from dataclasses import dataclass

# Azure CNI's directories on AKS Windows nodes, where the experiment ran.
AZURE_CNI_CONF_DIR = r"C:\k\azurecni\netconf"
AZURE_CNI_BIN_DIR = r"C:\k\azurecni\bin"


@dataclass(frozen=True)
class PlatformProfile:
    """The settings one platform needs; the defaults are upstream's charts without one."""

    # Linux host paths istio-cni mounts: the CNI folders at /host/opt/cni/bin and
    # /host/etc/cni/net.d, where install-cni looks whatever the host's are; the
    # netns folder at /host followed by its host path (netns_mount_path).
    cni_bin_dir: str = "/opt/cni/bin"
    cni_conf_dir: str = "/etc/cni/net.d"
    cni_netns_dir: str = "/var/run/netns"
    # Chained: istio-cni adds itself to the primary plugin's conflist;
    # unchained, it writes a file of its own (named `cni_conf_name`) that
    # Multus runs.
    chained: bool = True
    cni_conf_name: str | None = None
    # SELinux type of the Linux agents' containers (OpenShift's spc_t lets a
    # container act on the host).
    selinux_type: str | None = None
    # A ResourceQuota per agent for system-node-critical pods: GKE admits
    # pods of that priority class outside kube-system only where one exists.
    resource_quotas: bool = False
    # OpenShift admits the agents' pods only under an SCC their accounts may
    # `use`: the privileged one.
    privileged_scc: bool = False
    windows_cni_conf_dir: str = AZURE_CNI_CONF_DIR
    windows_cni_bin_dir: str = AZURE_CNI_BIN_DIR

    @property
    def netns_mount_path(self) -> str:
        """Where istio-cni's container sees the netns folder: /host followed by its
        host path. The agent opens a new pod's namespace at /host plus the path
        the runtime gave the CNI plugin (istio.io/istio cni/pkg/nodeagent
        pod_cache.go, openNetnsInRoot); upstream's fixed /host/var/run/netns finds
        only namespaces under /var/run/netns."""
        return "/host" + self.cni_netns_dir


# The pods a quota admits: upstream's charts' resourceQuotas.pods (5000), as
# the API server stores the quantity. Written as 5000, the live quota would
# read 5k, differ from what is asked, and be rewritten by every pass.
RESOURCE_QUOTA_PODS = "5k"
# The Windows fallback is Azure CNI's because the experiment knows no other;
# generic, kind, k3s and the others ship no Windows nodes of their own.
GENERIC = PlatformProfile()

PROFILES: dict[str, PlatformProfile] = {
    "generic": GENERIC,
    "kind": GENERIC,
    "aks": GENERIC,
    # The Amazon VPC CNI for Windows: its configuration is written by the
    # node's bootstrap, its binaries ship with the EKS-optimized AMI.
    "eks": PlatformProfile(
        windows_cni_conf_dir=r"C:\ProgramData\Amazon\EKS\cni\config",
        windows_cni_bin_dir=r"C:\Program Files\Amazon\EKS\cni",
    ),
    # GKE keeps CNI binaries in /home/kubernetes/bin (upstream's chart finds
    # it from a "-gke" Kubernetes version); for its Windows nodes, Kubernetes'
    # GCE scripts' layout (C:\etc\kubernetes\cni) is assumed.
    "gke": PlatformProfile(
        cni_bin_dir="/home/kubernetes/bin",
        resource_quotas=True,
        windows_cni_conf_dir=r"C:\etc\kubernetes\cni\config",
        windows_cni_bin_dir=r"C:\etc\kubernetes\cni",
    ),
    # Multus runs the plugins; the Windows Machine Config Operator lays out
    # its nodes' CNI under C:\k\cni.
    "openshift": PlatformProfile(
        cni_bin_dir="/var/lib/cni/bin",
        cni_conf_dir="/etc/cni/multus/net.d",
        chained=False,
        cni_conf_name="istio-cni.conf",
        selinux_type="spc_t",
        privileged_scc=True,
        windows_cni_conf_dir=r"C:\k\cni\config",
        windows_cni_bin_dir=r"C:\k\cni",
    ),
    "k3s": PlatformProfile(
        cni_bin_dir="/var/lib/rancher/k3s/data/cni",
        cni_conf_dir="/var/lib/rancher/k3s/agent/etc/cni/net.d",
    ),
    "k3d": PlatformProfile(
        cni_bin_dir="/bin", cni_conf_dir="/var/lib/rancher/k3s/agent/etc/cni/net.d"
    ),
    "microk8s": PlatformProfile(
        cni_bin_dir="/var/snap/microk8s/current/opt/cni/bin",
        cni_conf_dir="/var/snap/microk8s/current/args/cni-network",
    ),
    "minikube": PlatformProfile(cni_netns_dir="/var/run/docker/netns"),
}


def profile(platform: str) -> PlatformProfile:
    """The profile of a platform name; an unknown name gets upstream's defaults."""
    return PROFILES.get(platform, GENERIC)
