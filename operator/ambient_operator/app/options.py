"""Settings of `ambient-operator run`, from flags or environment variables."""

from __future__ import annotations

from dataclasses import dataclass, field

from ambient_operator.webhook.config import WebhookOptions

# Kept by the operator only with --cni-rbac=operator; the chart ships them, and
# then the operator neither writes nor watches RBAC objects.
CNI_RBAC_API_KINDS = [
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
]
OWNED_API_KINDS = [
    ("apps/v1", "DaemonSet"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    # GKE's quotas for the agents' system-node-critical pods (render/platforms.py).
    ("v1", "ResourceQuota"),
    # The agents' NetworkPolicies, when spec.networkPolicy.enabled asks for them.
    ("networking.k8s.io/v1", "NetworkPolicy"),
    *CNI_RBAC_API_KINDS,
]
# Multus's, written only when granted (--network-attachments): a watch of a kind
# the operator may not list would be refused.
NETWORK_ATTACHMENT_KIND = ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")
CNI_RBAC_BY_OPERATOR = "operator"
CNI_RBAC_BY_CHART = "chart"


@dataclass(frozen=True)
class Options:
    """Settings of `run`, from flags or environment variables."""

    kubeconfig: str | None = None
    metrics_port: int = 9090
    health_port: int = 8080
    log_format: str = "text"
    log_level: str = "info"
    leader_election: bool = False
    lease_namespace: str = "istio-system"
    lease_name: str = "ambient-operator"
    lease_seconds: float = 15.0
    debounce_seconds: float = 0.2
    # A change reaching an idle operator is handled at once: the pass starts
    # as soon as the events already handed over are in the caches. Waiting
    # even 5 ms for companions cost every isolated change those 5 ms
    # (bench/reaction_latency.py); what arrives during a pass makes one more,
    # and a longer stream is folded by the spacing of passes.
    idle_debounce_seconds: float = 0.0
    max_delay_seconds: float = 1.0
    # Pod and rollout progress only changes status: batch it more.
    status_delay_seconds: float = 3.0
    resync_seconds: float = 300.0
    identity: str = ""
    webhook: WebhookOptions = field(default_factory=WebhookOptions)
    # Namespaces spec.namespace may name (empty: any); the chart's Roles are there.
    agents_namespaces: tuple[str, ...] = ()
    # Who keeps the istio-cni ClusterRole and binding: the operator or the chart.
    cni_rbac: str = CNI_RBAC_BY_OPERATOR
    # Whether istio-cni may be granted pod delete (repairMode Delete): by the
    # chart, or by the operator, which then holds it.
    istio_cni_may_delete_pods: bool = False

    # Whether the operator may write (and so watches) Multus's
    # NetworkAttachmentDefinitions; the chart grants them with multus.enabled.
    network_attachments: bool = False
    # spec.images.registry of an AmbientMesh that names none: where `make images`
    # pushed the bundled images (the chart's value registry).
    default_registry: str | None = None

    @property
    def owned_kinds(self) -> list[tuple[str, str]]:
        """(apiVersion, kind) of every object kind the data plane writes."""
        kinds = list(OWNED_API_KINDS)
        if self.cni_rbac != CNI_RBAC_BY_OPERATOR:
            kinds = [kind for kind in kinds if kind not in CNI_RBAC_API_KINDS]
        if self.network_attachments:
            kinds.append(NETWORK_ATTACHMENT_KIND)
        return kinds
