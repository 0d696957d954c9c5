"""AmbientMesh v1alpha1: the single source of the CRD schema and the operator's view.

Defaults live here and are applied by the operator when it reads an object;
they are not written into the CRD, so a new operator release can change a
default (an image tag, say) without rewriting stored objects.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, Strict, model_validator

from ambient_operator.api import constants as c
from ambient_operator.api.types import (
    WINDOWS_BUILD_PATTERN,
    ApiModel,
    ImageRef,
    ImageTag,
    IntOrPercent,
    LabelMap,
    Quantity,
    Repository,
    is_zero,
)

SupportedBuild = Literal["10.0.20348", "10.0.26100"]
PreWs2025Build = Literal["10.0.20348"]
LogLevel = Literal["trace", "debug", "info", "warn", "error"]
ConditionStatus = Literal["True", "False", "Unknown"]


# Helm's values and the Kubernetes names they end up as.
# Gateway API's (and Kubernetes') pattern for an object name.
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An environment variable name as the API server accepts it (C identifiers and more).
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Istio's cluster and network names are free text in its charts; these keep
# them to what a label value and an env value can both carry.
_MESH_NAME = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
# A boolean as the API server takes it: "yes" or "on" in a file is refused, not read as true.
Flag = Annotated[bool, Strict()]
EnvMap = Annotated[
    dict[
        Annotated[str, Field(max_length=253, pattern=_ENV_NAME)],
        Annotated[str, Field(max_length=4096)],
    ],
    Field(max_length=64),
]
AnnotationMap = Annotated[
    dict[Annotated[str, Field(max_length=316)], Annotated[str, Field(max_length=4096)]],
    Field(max_length=64),
]
PullSecrets = Annotated[
    list[Annotated[str, Field(max_length=253, pattern=_SUBDOMAIN)]], Field(max_length=16)
]
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A file name: no folder, nothing hidden.
_FILE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
NamespaceName = Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")]
# A label (or taint) key as core/v1 validates it: an optional DNS-subdomain prefix and a name.
_LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# A label value as core/v1 validates it (empty allowed).
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class Toleration(ApiModel):
    """A pod toleration, as in core/v1."""

    key: Annotated[str, Field(max_length=316)] | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: Annotated[str, Field(max_length=63)] | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


Tolerations = Annotated[list[Toleration], Field(max_length=32)]
QuantityMap = Annotated[dict[str, Quantity], Field(max_length=16)]


class Resources(ApiModel):
    """Compute resources of one container; quantities must be non-negative."""

    requests: QuantityMap | None = None
    limits: QuantityMap | None = None


_SHORT = Annotated[str, Field(max_length=253)]


class SELinuxOptions(ApiModel):
    """seLinuxOptions of a container, as in core/v1."""

    user: _SHORT | None = None
    role: _SHORT | None = None
    type: _SHORT | None = None
    level: _SHORT | None = None


class SeccompProfile(ApiModel):
    """seccompProfile of a container, as in core/v1."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"]
    localhost_profile: _SHORT | None = None


class DnsOption(ApiModel):
    """One resolver option, as in core/v1."""

    name: _SHORT
    value: _SHORT | None = None


class DnsConfig(ApiModel):
    """dnsConfig of a pod, as in core/v1 (the API server's limits)."""

    nameservers: Annotated[list[_SHORT], Field(max_length=3)] | None = None
    searches: Annotated[list[_SHORT], Field(max_length=32)] | None = None
    options: Annotated[list[DnsOption], Field(max_length=16)] | None = None


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret volume, as in core/v1."""

    key: _SHORT
    path: Annotated[str, Field(max_length=253, pattern=r"^[^/].*$")]


class ConfigMapVolume(ApiModel):
    """A ConfigMap volume, as in core/v1."""

    name: Annotated[str, Field(max_length=253, pattern=_SUBDOMAIN)]
    items: Annotated[list[KeyToPath], Field(max_length=32)] | None = None
    optional: Flag | None = None


class SecretVolume(ApiModel):
    """A Secret volume, as in core/v1."""

    secret_name: Annotated[str, Field(max_length=253, pattern=_SUBDOMAIN)]
    items: Annotated[list[KeyToPath], Field(max_length=32)] | None = None
    optional: Flag | None = None


class HostPathVolume(ApiModel):
    """A hostPath volume, as in core/v1."""

    path: Annotated[str, Field(max_length=255, pattern=r"^/[^\s]*$")]
    type: (
        Literal[
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ]
        | None
    ) = None


class EmptyDirVolume(ApiModel):
    """An emptyDir volume, as in core/v1."""

    medium: Literal["", "Memory"] | None = None
    size_limit: Quantity | None = None


_VOLUME_SOURCES = ("configMap", "secret", "hostPath", "emptyDir")


class Volume(ApiModel):
    """An extra volume of an agent's pods: one of the kinds the charts' users mount."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "["
                    + ", ".join(f"has(self.{k})" for k in _VOLUME_SOURCES)
                    + "].filter(x, x).size() == 1",
                    "message": "exactly one of configMap, secret, hostPath, emptyDir",
                }
            ]
        }
    )

    name: Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    config_map: ConfigMapVolume | None = None
    secret: SecretVolume | None = None
    host_path: HostPathVolume | None = None
    empty_dir: EmptyDirVolume | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        given = [self.config_map, self.secret, self.host_path, self.empty_dir]
        if sum(source is not None for source in given) != 1:
            raise ValueError("exactly one of configMap, secret, hostPath, emptyDir")
        return self


class VolumeMount(ApiModel):
    """A mount of an extra volume into the agent's container, as in core/v1."""

    name: Annotated[str, Field(max_length=63)]
    mount_path: Annotated[str, Field(max_length=255, pattern=r"^/[^\s]*$")]
    read_only: Flag | None = None
    sub_path: Annotated[str, Field(max_length=253, pattern=r"^[^/].*$")] | None = None
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = None


# ztunnel's own volumes and where it mounts them: a user's may take neither.
ZTUNNEL_VOLUMES = ["istio-token", "istiod-ca-cert", "cni-ztunnel-sock-dir", "tmp", "crl-volume"]
ZTUNNEL_MOUNT_PATHS = [
    "/var/run/secrets/tokens",
    "/var/run/secrets/istio",
    "/var/run/ztunnel",
    "/tmp",
    "/var/run/secrets/istio/crl",
]


# Kubernetes' own rule for a pod: dnsPolicy None takes its resolver from dnsConfig alone.
_DNS_NONE_MESSAGE = "dnsPolicy None needs dnsConfig with at least one nameserver"


def _ztunnel_rules() -> list[dict[str, str]]:
    ours = ", ".join(f"'{n}'" for n in ZTUNNEL_VOLUMES)
    paths = ", ".join(f"'{p}'" for p in ZTUNNEL_MOUNT_PATHS)
    return [
        {
            "rule": f"!has(self.volumes) || self.volumes.all(v, !(v.name in [{ours}]))",
            "message": f"volume names must not be ztunnel's own ({ours})",
        },
        {
            "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m, "
            f"(has(self.volumes) && self.volumes.exists(v, v.name == m.name)) && "
            f"!(m.mountPath in [{paths}]))",
            "message": "each volumeMount must name one of volumes, at a path ztunnel does not "
            "mount itself",
        },
        {
            "rule": "!has(self.dnsPolicy) || self.dnsPolicy != 'None' || (has(self.dnsConfig) && "
            "has(self.dnsConfig.nameservers) && size(self.dnsConfig.nameservers) > 0)",
            "message": _DNS_NONE_MESSAGE,
        },
    ]


class ResourceQuotas(ApiModel):
    """The agents' ResourceQuotas for their priority class (the charts' resourceQuotas)."""

    enabled: Flag | None = Field(
        default=None,
        description="Render them. Unset: where the platform admits system-node-critical pods "
        "only in namespaces with such a quota (GKE).",
    )
    pods: Annotated[int, Field(ge=1, le=1000000)] | None = Field(
        default=None, description="Pods each quota admits. Unset: 5k, as the charts' 5000."
    )


class AgentNetworkPolicies(ApiModel):
    """A NetworkPolicy per agent (the charts' global.networkPolicy)."""

    enabled: Flag = Field(
        default=False,
        description="Render them: each admits the agent's own ports and any egress, as the "
        "charts' do, and selects the agent's Linux pods only. Windows agents run on the host "
        "network, where NetworkPolicies do not apply (docs/coming-from-helm.md).",
    )


def _rollout_rules(default_unavailable: int, default_surge: int) -> list[dict[str, str]]:
    """CEL rules that mirror the DaemonSet validation, with this component's defaults.

    The API server would only reject the DaemonSet the operator renders; saying
    it on the AmbientMesh tells the user which field to fix before anything runs.
    """
    zero = "'^0*%?$'"
    unavailable = f"string(has(self.maxUnavailable) ? self.maxUnavailable : {default_unavailable})"
    surge = f"string(has(self.maxSurge) ? self.maxSurge : {default_surge})"
    return [
        {
            "rule": f"!({unavailable}.matches({zero}) && {surge}.matches({zero}))",
            "message": "maxUnavailable and maxSurge must not both be zero",
        },
        {
            "rule": f"{unavailable}.matches({zero}) || {surge}.matches({zero})",
            "message": "maxSurge must be zero when maxUnavailable is not (a DaemonSet rule)",
        },
    ]


class Rollout(ApiModel):
    """RollingUpdate settings of one DaemonSet."""

    max_unavailable: IntOrPercent | None = None
    max_surge: IntOrPercent | None = None

    def effective(
        self, default_unavailable: int, default_surge: int
    ) -> tuple[int | str, int | str]:
        """(maxUnavailable, maxSurge) after the component's defaults."""
        unavailable = default_unavailable if self.max_unavailable is None else self.max_unavailable
        surge = default_surge if self.max_surge is None else self.max_surge
        return unavailable, surge

    def check(self, default_unavailable: int, default_surge: int) -> None:
        """Enforce the rules of `_rollout_rules` in Python for offline input."""
        unavailable, surge = self.effective(default_unavailable, default_surge)
        if is_zero(unavailable) and is_zero(surge):
            raise ValueError("maxUnavailable and maxSurge must not both be zero")
        if not is_zero(unavailable) and not is_zero(surge):
            raise ValueError("maxSurge must be zero when maxUnavailable is not (a DaemonSet rule)")


class ZtunnelRollout(Rollout):
    """ztunnel surges a new pod before the old one leaves, so traffic never stops."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": cast(JsonValue, _rollout_rules(0, 1))}
    )

    @model_validator(mode="after")
    def _valid(self) -> ZtunnelRollout:
        self.check(0, 1)
        return self


class CniRollout(Rollout):
    """istio-cni replaces one node at a time."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": cast(JsonValue, _rollout_rules(1, 0))}
    )

    @model_validator(mode="after")
    def _valid(self) -> CniRollout:
        self.check(1, 0)
        return self


class ComponentImage(ApiModel):
    """Image overrides of one agent; unset fields come from hub and tag."""

    linux: ImageRef | None = Field(
        default=None, description="Full image reference for Linux nodes."
    )
    windows: ImageRef | None = Field(
        default=None,
        description="Full image reference for every Windows build (HostProcess images "
        "need not match the host build). Istio publishes no Windows images: `make images` "
        "builds them from Istio's Windows experiment. Unset: the one under "
        "spec.images.registry; with no registry either, <hub>/<name>-windows:<tag>, the "
        "name the experiment's build gives, and the AmbientMesh is Degraded (RenderWarning).",
    )
    windows_builds: Annotated[dict[SupportedBuild, ImageRef], Field(max_length=4)] | None = Field(
        default=None, description="Per-build image references, keyed by Windows build."
    )


class Images(ApiModel):
    """Where the agent images come from."""

    hub: Repository = Field(
        default="docker.io/istio",
        description="Istio's registry and path of the Linux agents' images "
        "(<hub>/<name>:<tag>) and the waypoints'. It holds no Windows image: those come from "
        "registry.",
    )
    registry: Repository | None = Field(
        default=None,
        description="The registry `make images REGISTRY=<registry>` pushed this project's "
        "images to (docs/images.md). Set, each image not set in full below comes from it: "
        "the Windows agents as <registry>/ztunnel-windows and <registry>/install-cni-windows "
        "tagged with the Windows experiment pair they were built from, and the multi-build "
        "redirection-wait image (spec.newPodWorkaround.multiBuildImage) as "
        "<registry>/redirection-wait:<operator version>. Unset: the operator's default (the "
        "chart's value registry); with neither, the Windows agents get a name nobody "
        "publishes and pods whose Windows build is not fixed get no redirection-wait init "
        "container (ImageUnavailable), both reported in status.",
    )
    tag: ImageTag = Field(
        default=c.ISTIO_VERSION,
        description="The agents' Istio version, and the tag of every image not set in full "
        "below (a variant may follow: 1.31.0-distroless). A change rolls one platform at a "
        "time: Linux, then each Windows build, each once the one before is Ready "
        "(docs/versions.md). Unset, the agents follow the version of the istiod they talk to, "
        "once its rollout is complete; while no istiod version can be read, the release this "
        "operator was tested with. A set tag is never overridden.",
    )

    def tag_if_set(self) -> str | None:
        """The tag the user set, or None when it is unset (and the agents follow istiod)."""
        return self.tag if "tag" in self.model_fields_set else None

    variant: Literal["debug", "distroless"] | None = Field(
        default=None,
        description="Image variant appended to the tag of the Linux images, agents' and waypoints' "
        "(<hub>/<name>:<tag>-<variant>), as the charts' variant value does. Windows images "
        "have no variants and ignore it",
    )
    pull_policy: PullPolicy | None = Field(
        default=None,
        description="imagePullPolicy of every agent container on every OS, of each "
        "waypoint's proxy (istiod's global.imagePullPolicy) and of the redirection-wait "
        "init container. Unset: "
        "Kubernetes decides (Always for :latest, else IfNotPresent; the init container "
        "IfNotPresent)",
    )
    pull_secrets: PullSecrets | None = Field(
        default=None,
        description="Names of Secrets to pull images with, as the charts' imagePullSecrets: on the "
        "agents' ServiceAccounts (Secrets in spec.namespace, Linux and Windows) and on every "
        "waypoint pod (Secrets in its Gateway's namespace, as istiod's global.imagePullSecrets)",
    )
    ztunnel: ComponentImage = ComponentImage()
    istio_cni: ComponentImage = ComponentImage()

    def with_registry(self, registry: str | None) -> Images:
        """These images with `registry` as the default registry, when none is set."""
        if self.registry or not registry:
            return self
        return self.model_copy(update={"registry": registry})


class Istiod(ApiModel):
    """How the agents reach istiod."""

    revision: (
        Annotated[str, Field(max_length=53, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")] | None
    ) = Field(default=None, description="Istio revision; selects the Service istiod-<revision>.")
    service_name: (
        Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")] | None
    ) = Field(default=None, description="istiod Service name (default istiod[-revision]).")
    address: (
        Annotated[str, Field(max_length=253, pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")] | None
    ) = Field(default=None, description="host:port of XDS and CA; overrides the Service.")
    ca_address: (
        Annotated[str, Field(max_length=253, pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")] | None
    ) = Field(
        default=None,
        description="host:port of the CA alone (ztunnel's CA_ADDRESS, the chart's caAddress; a "
        "waypoint's CA_ADDR, istiod's global.caAddress); overrides address",
    )
    xds_address: (
        Annotated[str, Field(max_length=253, pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")] | None
    ) = Field(
        default=None,
        description="host:port of XDS alone (ztunnel's XDS_ADDRESS, the chart's xdsAddress; a "
        "waypoint's discoveryAddress, istiod's meshConfig.defaultConfig.discoveryAddress); "
        "overrides address",
    )

    def dialled_as_written(self) -> bool:
        """Whether the spec gives both CA and XDS addresses, so no Service is looked up."""
        return bool(self.address or (self.ca_address and self.xds_address))

    def service(self) -> str:
        """Name of the istiod Service the agents talk to."""
        if self.service_name:
            return self.service_name
        return f"istiod-{self.revision}" if self.revision else "istiod"


_HOST_PATH = Annotated[str, Field(max_length=255, pattern=r"^/[^\s]*$")]


class NodeSelectorRequirement(ApiModel):
    """One expression of a node selector term, as in core/v1."""

    key: Annotated[str, Field(max_length=316)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=64)] | None = (
        None
    )


class NodeSelectorTerm(ApiModel):
    """A term of required node affinity: its expressions all hold."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(min_length=1, max_length=16)]


class LinuxPlatform(ApiModel):
    """Linux nodes."""

    enabled: Flag = True
    node_affinity: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=8)] | None = (
        Field(
            default=None,
            description="Required node affinity of the Linux agents (the charts' affinity."
            "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms): a "
            "node must match one term. The operator's own pins are added to each term; nodes "
            "that match none are reported as ExcludedBySpec.",
        )
    )
    cni_bin_dir: _HOST_PATH | None = Field(
        default=None,
        description="CNI binary directory on Linux nodes. Unset: the platform's "
        "(docs/platforms.md), /opt/cni/bin when no platform is known.",
    )
    cni_conf_dir: _HOST_PATH | None = Field(
        default=None,
        description="CNI configuration directory on Linux nodes. Unset: the platform's, "
        "/etc/cni/net.d when no platform is known.",
    )
    cni_netns_dir: _HOST_PATH | None = Field(
        default=None,
        description="Where the container runtime keeps network namespaces on Linux nodes. "
        "Unset: the platform's, /var/run/netns when no platform is known.",
    )
    node_selector: LabelMap | None = Field(
        default=None,
        description="Extra node labels the agents require; other nodes are reported as "
        "ExcludedBySpec.",
    )
    tolerations: Tolerations | None = Field(
        default=None,
        description="Replace the default tolerations, which tolerate every taint; nodes with "
        "a taint these miss are reported as ExcludedBySpec.",
    )


class WindowsPlatform(ApiModel):
    """Windows nodes; each supported build gets its own DaemonSets."""

    enabled: Flag = True
    builds: Annotated[list[SupportedBuild], Field(max_length=4)] | None = Field(
        default=None,
        description="Builds that get agents. Unset: every supported build present in "
        "the cluster. Set: exactly these builds, present or not.",
    )
    node_selector: LabelMap | None = Field(
        default=None,
        description="Extra node labels the agents require; other nodes are reported as "
        "ExcludedBySpec.",
    )
    tolerations: Tolerations | None = Field(
        default=None,
        description="Replace the default tolerations, which tolerate every taint; nodes with "
        "a taint these miss are reported as ExcludedBySpec.",
    )
    cni_conf_dir: Annotated[str, Field(max_length=255)] | None = Field(
        default=None,
        description="CNI configuration directory on Windows nodes. Unset: the platform's "
        "(see docs/platforms.md); Azure CNI's C:\\k\\azurecni\\netconf on AKS and when no "
        "platform is known.",
    )
    cni_bin_dir: Annotated[str, Field(max_length=255)] | None = Field(
        default=None,
        description="CNI binary directory on Windows nodes. Unset: the platform's; Azure "
        "CNI's C:\\k\\azurecni\\bin on AKS and when no platform is known.",
    )


# Kubernetes platforms whose node paths and policies the agents follow
# (docs/platforms.md); "generic" is upstream's charts without a platform.
PlatformName = Literal[
    "generic", "aks", "eks", "gke", "openshift", "k3s", "k3d", "microk8s", "minikube", "kind"
]
PLATFORM_AUTO: Literal["auto"] = "auto"
# spec.platform: one enum, so the CRD schema stays structural.
PlatformSetting = Literal["auto", PlatformName]


class Platforms(ApiModel):
    """Which operating systems get the data plane."""

    linux: LinuxPlatform = LinuxPlatform()
    windows: WindowsPlatform = WindowsPlatform()


class Agent(ApiModel):
    """What both agents take alike."""

    log_level: LogLevel | None = Field(
        default=None, description="This agent's log level. Unset: spec.logLevel."
    )
    log_as_json: Flag = Field(default=False, description="Write this agent's logs as JSON.")
    pod_labels: LabelMap | None = Field(
        default=None,
        description="Extra labels of this agent's pods on every OS. The operator's own "
        "labels win over these.",
    )
    pod_annotations: AnnotationMap | None = Field(
        default=None,
        description="Extra annotations of this agent's pods on every OS (they are added to "
        "the Prometheus ones; a key given here wins).",
    )
    env: EnvMap | None = Field(
        default=None,
        description="Extra environment variables of this agent's container on every OS. A "
        "name the operator sets itself is refused in status (RenderWarning) and left out.",
    )


class Ztunnel(Agent):
    """ztunnel settings."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": cast(JsonValue, _ztunnel_rules())}
    )

    rollout: ZtunnelRollout = Field(
        default=ZtunnelRollout(),
        description="ztunnel surges a new pod before the old one leaves, so traffic never "
        "stops. On Windows it uses the host network, where an old and a new pod cannot share "
        "a node, so there maxSurge is spent as maxUnavailable.",
    )
    resources: Resources = Resources(requests={"cpu": "200m", "memory": "512Mi"})
    termination_grace_period_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    labels: LabelMap | None = Field(
        default=None,
        description="Extra labels of ztunnel's DaemonSets and ServiceAccounts on every OS "
        "(the chart's labels). The operator's own labels win over these.",
    )
    annotations: AnnotationMap | None = Field(
        default=None,
        description="Extra annotations of ztunnel's DaemonSets and ServiceAccounts on every OS "
        "(the chart's annotations).",
    )
    dns_policy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] | None = (
        Field(
            default=None,
            description="DNS policy of ztunnel's pods, on Linux (Windows agents use the host's "
            "resolver).",
        )
    )
    dns_config: DnsConfig | None = Field(
        default=None, description="DNS config of ztunnel's pods, on Linux."
    )
    se_linux_options: SELinuxOptions | None = Field(
        default=None,
        description="SELinux options of ztunnel's container, on Linux. Unset: the platform's "
        "(spc_t on OpenShift).",
    )
    volumes: Annotated[list[Volume], Field(max_length=16)] | None = Field(
        default=None,
        description="Extra volumes of ztunnel's pods on Linux (the chart's volumes): "
        "configMap, secret, hostPath or emptyDir.",
    )
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=16)] | None = Field(
        default=None,
        description="Where ztunnel's container mounts them, on Linux (the chart's "
        "volumeMounts). Windows HostProcess pods see the host's file system.",
    )
    peer_ca_crl: Flag = Field(
        default=False,
        description="Check peer certificates against the CRL of a plugged-in CA: mounts "
        "ConfigMap istio-ca-crl (optional) and sets CRL_PATH, on Linux (the Windows "
        "experiment's ztunnel does not read it).",
    )

    @model_validator(mode="after")
    def _valid(self) -> Ztunnel:
        if self.dns_policy == "None" and not (self.dns_config and self.dns_config.nameservers):
            raise ValueError(_DNS_NONE_MESSAGE)
        names = [v.name for v in self.volumes or []]
        if set(names) & set(ZTUNNEL_VOLUMES):
            raise ValueError(f"volume names must not be ztunnel's own ({ZTUNNEL_VOLUMES})")
        for mount in self.volume_mounts or []:
            if mount.name not in names or mount.mount_path in ZTUNNEL_MOUNT_PATHS:
                raise ValueError(
                    "each volumeMount must name one of volumes, at a path ztunnel does not "
                    "mount itself"
                )
        return self


# istio-cni takes the first of its repair modes set (repairPods, deletePods, labelPods).
RepairMode = Literal["Repair", "Delete", "Label"]


class BrokenPodLabel(ApiModel):
    """The label istio-cni's Label repair mode puts on a pod started without redirection."""

    key: Annotated[str, Field(min_length=1, max_length=316, pattern=_LABEL_KEY)] = (
        "cni.istio.io/uninitialized"
    )
    value: Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)] = "true"


class IstioCni(Agent):
    """istio-cni settings."""

    rollout: CniRollout = Field(
        default=CniRollout(),
        description="istio-cni replaces one node at a time. It uses the host network, where "
        "an old and a new pod cannot share a node, so a maxSurge is spent as maxUnavailable.",
    )
    resources: Resources = Resources(requests={"cpu": "100m", "memory": "100Mi"})
    termination_grace_period_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=30,
        description="Time for the agent to clean up its CNI configuration before a rollout "
        "replaces it, on Linux (Windows keeps 5 s; see docs/upstream-differences.md).",
    )
    env: EnvMap | None = Field(
        default=None,
        description="Extra environment variables of this agent's container on every OS, "
        "and keys of its ConfigMap, as the chart renders them. A name the "
        "operator sets itself is refused in status (RenderWarning) and left out.",
    )
    labels: LabelMap | None = Field(
        default=None,
        description="Extra labels of this agent's DaemonSets on every OS (the chart's "
        "daemonSetLabels). The operator's own labels win over these.",
    )
    se_linux_options: SELinuxOptions | None = Field(
        default=None,
        description="SELinux options of the agent's container, on Linux; type spc_t unless "
        "given, as the chart merges them.",
    )
    seccomp_profile: SeccompProfile | None = Field(
        default=None, description="Seccomp profile of the agent's container, on Linux."
    )
    repair: Flag = Field(
        default=True,
        description="Mend, in place, the redirection of pods that started before the agent "
        "was ready, on Linux (Windows repair is not implemented by the experiment).",
    )
    repair_init_container_name: Annotated[str, Field(max_length=63, pattern=_DNS_LABEL)] = Field(
        default="istio-validation",
        description="The init container whose failure marks a pod as started without redirection.",
    )
    repair_mode: RepairMode = Field(
        default="Repair",
        description="What repair does to such a pod, on Linux: Repair sets its redirection up in "
        "place; Delete deletes it, so that its owner makes a new one (istio-cni then needs "
        "delete on every pod: the chart value istioCniRepair.deletePods; without the chart "
        "the operator grants it if it holds it); Label puts brokenPodLabel on it.",
    )
    broken_pod_label: BrokenPodLabel = Field(
        default=BrokenPodLabel(),
        description="The label the Label repair mode puts on a pod started without redirection.",
    )
    istio_owned_cni_config: Flag = Field(
        default=False,
        description="Write the CNI configuration to a file of istio-cni's own instead of "
        "inserting the plugin into the primary CNI's file, on Linux.",
    )
    istio_owned_cni_config_file_name: Annotated[str, Field(max_length=253)] | None = Field(
        default=None,
        description="That file's name (istio-cni's default: 02-istio-cni.conflist).",
    )
    chained: Flag | None = Field(
        default=None,
        description="Chain the plugin into the primary CNI's configuration (true) or write "
        "it as a file of its own (false), on Linux. Unset: the platform's (a file of its own "
        "under Multus on OpenShift); Windows always chains.",
    )
    provider: Literal["default", "multus"] = Field(
        default="default",
        description="multus: also a NetworkAttachmentDefinition istio-cni in namespace "
        "default, for pods that attach istio-cni through Multus (the chart's provider). Needs "
        "Multus installed (its CRD) and the operator chart's value multus.enabled, which lets "
        "the operator write it; without either the rest is applied and Degraded says which.",
    )
    cni_conf_file_name: Annotated[str, Field(max_length=253, pattern=_FILE_NAME)] | None = Field(
        default=None,
        description="The CNI configuration file istio-cni inserts its plugin into, on "
        "every OS. Unset: the platform's, else the first file in the configuration "
        "directory.",
    )
    exclude_namespaces: Annotated[list[NamespaceName], Field(max_length=64)] = Field(
        default=["kube-system"],
        description="Namespaces whose pods istio-cni never redirects, on every OS.",
    )
    dns_capture: Flag = Field(
        default=True,
        description="Redirect enrolled pods' DNS to ztunnel, on Linux (Windows has no DNS "
        "proxying: always off there).",
    )
    ipv6: Flag = Field(
        default=True,
        description="Redirect IPv6 as well as IPv4, on Linux (Windows HNS policies are IPv4 "
        "only: always off there).",
    )
    reconcile_iptables_on_startup: Flag = Field(
        default=True,
        description="Mend enrolled pods' redirection rules when the agent starts, on Linux "
        "(Windows has no iptables).",
    )
    enable_ambient_detection_retry: Flag = Field(
        default=False,
        description="Retry telling whether a pod is enrolled after an error, on every OS.",
    )
    native_nftables: Flag = Field(
        default=False,
        description="Redirect with nftables instead of iptables, on Linux (Windows uses HNS).",
    )


class NewPodWorkaround(ApiModel):
    """The init container that holds new pods on pre-WS2025 nodes until redirection is on."""

    enabled: Flag = True
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = 120
    images: Annotated[dict[PreWs2025Build, ImageRef], Field(max_length=4)] = {
        c.BUILD_WS2022: "mcr.microsoft.com/windows/nanoserver:ltsc2022"
    }
    pull_secrets: PullSecrets | None = Field(
        default=None,
        description="Secrets to pull the init container's image with, added to the "
        "imagePullSecrets of each pod that gets it (when not listed already). They must exist "
        "in the pod's own namespace: the operator copies no Secret.",
    )
    multi_build_image: ImageRef | None = Field(
        default=None,
        description="Image for pods whose build is not fixed; a manifest list covering "
        "every supported build. Default: <registry>/redirection-wait:<operator version> "
        "under spec.images.registry, the index `make images` pushes. With neither, such "
        "pods are admitted without the init container (ImageUnavailable on their "
        "annotation, a Warning Event, status.enrollment.workaroundImageUnavailable), never "
        "handed an image nobody publishes.",
    )


class ReadinessTaint(ApiModel):
    """The taint that keeps pods off a node until its agents are Ready."""

    key: Annotated[str, Field(min_length=1, max_length=316, pattern=_LABEL_KEY)] = (
        "cni.istio.io/not-ready"
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeReadiness(ApiModel):
    """Remove a node's readiness taint once both of its agents are Ready (opt-in)."""

    enabled: Flag = Field(
        default=False,
        description="Remove spec.nodeReadiness.taint from a node once its ztunnel and istio-cni "
        "pods are both Ready, on Linux and every Windows build. Nothing else of a Node is ever "
        "changed. Needs the chart value nodeReadiness.enabled (it grants patch on Nodes).",
    )
    taint: ReadinessTaint = Field(
        default=ReadinessTaint(),
        description="The taint removed, matched by key and effect (any value). Your node "
        "provisioning adds it; the operator never adds a taint.",
    )


# Gateway API's pattern for a GatewayClass controllerName.
_CONTROLLER = _SUBDOMAIN[:-1] + r"/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$"
# Gateway API gives a controllerName's domain to whoever owns it, and istiod
# serves the istio.io ones (pkg/config/constants: istio.io/mesh-controller is
# the istio-waypoint class's, then unmanaged-gateway, eastwest-controller...;
# istio.io/gateway-controller by default): on one of those the operator would
# deploy istiod's Gateways a second time and the two would fight over them.
# No backslashes, so the pattern reads the same in CEL and in Python.
_ISTIO_CONTROLLER = r"^([^/]*[.])?istio[.]io/"
_NOT_ISTIOD_MESSAGE = (
    "must not be under istio.io/ (such as istio.io/mesh-controller): istiod serves "
    "those controllers"
)


def _not_istiods(value: str) -> str:
    if re.match(_ISTIO_CONTROLLER, value):
        raise ValueError(_NOT_ISTIOD_MESSAGE)
    return value


ControllerName = Annotated[
    str,
    Field(
        max_length=253,
        pattern=_CONTROLLER,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": f"!self.matches('{_ISTIO_CONTROLLER}')", "message": _NOT_ISTIOD_MESSAGE}
            ]
        },
    ),
    AfterValidator(_not_istiods),
]


# Node label and taint keys of control-plane nodes (kubeadm, and its older name).
CONTROL_PLANE_NODE_KEYS = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
]
# Pod annotations that change what monitoring, the autoscaler or Istio's
# endpoint choice does with a pod, never what the pod may do on its node.
SAFE_POD_ANNOTATIONS = [
    "prometheus.io/*",
    "cluster-autoscaler.kubernetes.io/safe-to-evict",
    "networking.istio.io/traffic-distribution",
]
_POLICY_ENTRY = Annotated[str, Field(min_length=1, max_length=317, pattern=r"^[^\s]+$")]


# Creating a Gateway creates pods: without limits, whoever may create a
# Gateway picks their ServiceAccount, image, nodes and annotations.
class WaypointPolicy(ApiModel):
    """What Gateways and their parameters may ask of waypoint pods (not spec.waypoints itself)."""

    service_account_labels: LabelMap = Field(
        default={c.LABEL_WAYPOINT_SERVICE_ACCOUNT: "true"},
        description="Labels a ServiceAccount named by annotation gateway.istio.io/service-account "
        "must carry when it exists and is not the Gateway's own. {} allows any ServiceAccount "
        "of the namespace, as istiod does.",
    )
    image_prefixes: Annotated[list[_POLICY_ENTRY], Field(max_length=32)] | None = Field(
        default=None,
        description="Image references parameters may set must start with one of these "
        "(a repository, matched up to a '/', ':' or '@'). Default: spec.images.hub.",
    )
    allow_keyless_tolerations: Flag = Field(
        default=False,
        description="Whether parameters may add a toleration without a key, which tolerates "
        "every taint.",
    )
    denied_node_keys: Annotated[list[_POLICY_ENTRY], Field(max_length=32)] = Field(
        default=CONTROL_PLANE_NODE_KEYS,
        description="Node label and taint keys parameters may neither select (nodeSelector) "
        "nor tolerate. Default: the control-plane role keys.",
    )
    pod_annotations: Annotated[list[_POLICY_ENTRY], Field(max_length=64)] = Field(
        default=SAFE_POD_ANNOTATIONS,
        description="spec.infrastructure.annotations a Gateway may set (they are copied to its "
        "pods): exact keys, or 'prefix/*' for every key under a prefix.",
    )


class Waypoints(ApiModel):
    """Waypoint proxies for Gateways of the operator's own class (always on Linux nodes)."""

    class_name: Annotated[str, Field(max_length=253, pattern=_SUBDOMAIN)] = Field(
        default="ambient-waypoint", description="Name of the GatewayClass the operator keeps."
    )
    controller_name: ControllerName = Field(
        default="ambientoperator.io/waypoint-controller",
        description="controllerName of that class; Gateways of any class with it are ours. "
        "Not one under istio.io/, which istiod serves.",
    )
    image: ImageRef | None = Field(
        default=None, description="proxyv2 image. Default: <hub>/proxyv2:<tag>."
    )
    resources: Resources = Resources(
        requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "2", "memory": "1Gi"}
    )
    replicas: Annotated[int, Field(ge=0, le=100)] = 1
    node_selector: LabelMap | None = Field(
        default=None, description="Extra node labels; kubernetes.io/os is always linux."
    )
    tolerations: Tolerations | None = None
    policy: WaypointPolicy = WaypointPolicy()


class MultiCluster(ApiModel):
    """This cluster's identity in a multi-cluster mesh."""

    cluster_name: Annotated[str, Field(max_length=253, pattern=_MESH_NAME)] | None = Field(
        default=None,
        description="The cluster's name, which must be istiod's: ISTIO_META_CLUSTER_ID of ztunnel "
        "(Linux and Windows) and of waypoints (the charts' multiCluster.clusterName, istiod's "
        "global.multiCluster.clusterName). Unset: Kubernetes, istiod's default",
    )


# Helm's own rule for a release name (pkg/chartutil ValidateReleaseName): a
# DNS-1123 subdomain of at most 53 characters.
HelmReleaseName = Annotated[
    str,
    Field(
        max_length=53,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]
DeletionPolicy = Literal["Delete", "Orphan"]


class Adopt(ApiModel):
    """Consent to take over objects the operator did not create, by Helm release."""

    helm_releases: Annotated[list[HelmReleaseName], Field(max_length=8)] = Field(
        default_factory=list,
        description="Helm releases in spec.namespace (Istio's ztunnel and istio-cni charts) "
        "whose objects the operator takes over as they run: the DaemonSets keep their pod "
        "templates, so no agent restarts, until a later change of this AmbientMesh is rolled. "
        "Only the objects in each release's record that carry its Helm ownership metadata are "
        "taken; a release that is missing, or that holds an object the operator does not "
        "render, is reported in status.adoption and nothing of it is taken (docs/migration.md)",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class AmbientMeshSpec(ApiModel):
    """What the platform team asks of the ambient data plane."""

    namespace: Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")] = (
        Field(default="istio-system", description="Namespace of the agents and istiod.")
    )
    images: Images = Images()
    istiod: Istiod = Istiod()
    trust_domain: Annotated[
        str, Field(max_length=253, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    ] = "cluster.local"
    cluster_domain: Annotated[
        str, Field(max_length=253, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    ] = "cluster.local"
    platform: PlatformSetting = Field(
        default=PLATFORM_AUTO,
        description="The Kubernetes platform, whose CNI paths, quotas and security policies "
        "the agents follow. auto: detected from the Nodes' providerID and labels "
        "(status.platform says what was found and why).",
    )
    platforms: Platforms = Platforms()
    ztunnel: Ztunnel = Ztunnel()
    istio_cni: IstioCni = IstioCni()
    new_pod_workaround: NewPodWorkaround = NewPodWorkaround()
    priority_class_name: Annotated[str, Field(max_length=253, pattern=_SUBDOMAIN)] = (
        "system-node-critical"
    )
    log_level: LogLevel = "info"
    multi_cluster: MultiCluster = MultiCluster()
    resource_quotas: ResourceQuotas = ResourceQuotas()
    network_policy: AgentNetworkPolicies = AgentNetworkPolicies()
    network: Annotated[str, Field(max_length=63, pattern=_MESH_NAME)] | None = Field(
        default=None,
        description="The network this cluster's agents and waypoints are on: ztunnel's "
        "NETWORK (the charts' network or global.network) on Linux and Windows, and a waypoint's "
        "ISTIO_META_NETWORK and topology.istio.io/network label unless its Gateway's own "
        "label names another, as istiod's global.network does (docs/waypoints.md). A label "
        "value, so 63 characters at most. A multi-network mesh also needs the label "
        "topology.istio.io/network on spec.namespace and istiod's AMBIENT_ENABLE_MULTI_NETWORK "
        "(docs/coming-from-helm.md)",
    )
    waypoints: Waypoints = Waypoints()
    node_readiness: NodeReadiness = NodeReadiness()
    adopt: Adopt = Adopt()
    deletion_policy: DeletionPolicy = Field(
        default="Delete",
        description="What deleting this AmbientMesh does to the agents. Delete: they are "
        "garbage-collected with it. Orphan: every data-plane object stays and keeps running, "
        "with the operator's owner reference, labels and annotations removed, for Istio's "
        "charts to take back with helm install --take-ownership (docs/migration.md)",
    )

    def with_default_registry(self, registry: str | None) -> AmbientMeshSpec:
        """This spec with the operator's default registry (--default-registry, the chart's
        value registry) where spec.images.registry is unset; the spec's own wins."""
        images = self.images.with_registry(registry)
        return self if images is self.images else self.model_copy(update={"images": images})


class Condition(ApiModel):
    """metav1.Condition."""

    type: Annotated[str, Field(max_length=316)]
    status: ConditionStatus
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]
    reason: Annotated[
        str, Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ]
    message: Annotated[str, Field(max_length=32768)]


class ComponentStatus(ApiModel):
    """Rollout state of one DaemonSet we own."""

    name: str
    component: Literal["ztunnel", "istio-cni"]
    platform: str = Field(description="linux, or the Windows build")
    desired: int = 0
    current: int = 0
    updated: int = 0
    ready: int = 0
    available: int = 0


class BuildCount(ApiModel):
    """How many nodes run one Windows build."""

    build: str
    release: str
    nodes: int
    supported: bool


class UnsupportedNode(ApiModel):
    """A node that gets no agent, and why."""

    name: str
    reason: str
    message: str


class NodeInventory(ApiModel):
    """Node counts by OS and Windows build, and what is unsupported."""

    total: int = 0
    linux: int = 0
    windows: int = 0
    supported: int = 0
    unsupported: int = 0
    windows_builds: list[BuildCount] = []
    unsupported_nodes: Annotated[list[UnsupportedNode], Field(max_length=20)] = Field(
        default=[], description="At most 20 examples; `unsupported` has the count."
    )


class PodCounts(ApiModel):
    """Enrolled pods of one OS by redirection state."""

    enabled: int = 0
    pending: int = 0
    missing: int = 0


class Enrollment(ApiModel):
    """What ambient enrollment looks like across namespaces."""

    namespaces: int = 0
    linux_pods: PodCounts = PodCounts()
    windows_pods: PodCounts = PodCounts()
    example_pending_pods: Annotated[list[str], Field(max_length=5)] = []
    workaround_misses: int = Field(
        default=0, description="Windows pods admitted without the redirection-wait init container."
    )
    workaround_image_unavailable: int = Field(
        default=0,
        description="Of workaroundMisses, those admitted without it because no image for it "
        "was known (ImageUnavailable): set spec.images.registry after `make images`.",
    )


class NodeReadinessStatus(ApiModel):
    """Nodes whose readiness taint stays until both of their agents are Ready."""

    taint: str = Field(description="key:effect of the taint removed")
    waiting: int = Field(default=0, description="Nodes with the taint whose agents are not Ready")
    example_waiting_nodes: Annotated[list[str], Field(max_length=5)] = Field(
        default=[], description="At most 5 examples; `waiting` has the count."
    )


class PlatformStatus(ApiModel):
    """Which platform the agents are rendered for, and why."""

    name: PlatformName = Field(description="The platform the agents are rendered for.")
    detected: PlatformName = Field(description="What the Nodes say, whatever spec.platform says.")
    source: Literal["detected", "spec"] = Field(
        description="detected (spec.platform is auto) or spec (spec.platform overrides)."
    )
    evidence: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=8)] = Field(
        default=[], description="What detection found on the Nodes, most telling first."
    )


class VersionStatus(ApiModel):
    """The Istio versions of istiod and the agents, and a version change under way."""

    control_plane: str | None = Field(
        default=None,
        description="istiod's version, from its Deployment's image tag (or its version "
        "labels); absent when nothing tells it, and then no skew is judged.",
    )
    data_plane: str = Field(description="spec.images.tag: the version the agents run or roll to.")
    source: Literal["spec", "istiod", "default"] = Field(
        default="spec",
        description="Where dataPlane comes from: spec.images.tag, istiod's version (the tag is "
        "unset), or the built-in default (unset, and no istiod version can be read).",
    )
    note: str | None = Field(
        default=None, description="With source istiod or default: what is followed, or why not."
    )
    newest_patch: str | None = Field(
        default=None,
        description="The newest patch this operator knows of istiod's minor, when the agents "
        "run an older one of that minor (docs/versions.md lists what each fixes).",
    )
    rolling: str | None = Field(
        default=None,
        description="The platform (linux or a Windows build) whose agents are being replaced now.",
    )
    waiting: Annotated[list[str], Field(max_length=8)] = Field(
        default=[],
        description="Platforms that keep the images they run until `rolling` is Ready, in order.",
    )
    previous: str | None = Field(
        default=None,
        description="dataPlane before its last change: setting spec.images.tag back to it is a "
        "rollback.",
    )
    revision: str | None = Field(
        default=None,
        description="The istiod revision the agents serve or roll to (spec.istiod.revision; "
        "default: the istiod installed without one).",
    )
    previous_revision: str | None = Field(
        default=None,
        description="`revision` before its last change: setting spec.istiod.revision back to it "
        "is a rollback.",
    )
    rollback: str | None = Field(
        default=None,
        description="Set while the change under way sets the agents back (what goes back, "
        "`from 1.31.0 to 1.30.4`): spec.images.tag "
        "or spec.istiod.revision to the value before `previous` or `previousRevision`, or the "
        "tag to an older version than a platform runs. A rollback goes in the same order as "
        "any change: Linux, then each Windows build.",
    )


class AsIsDaemonSet(ApiModel):
    """A DaemonSet that keeps the pod template it runs: taken over from Helm, or written by
    another operator version."""

    name: str
    platform: str = Field(description="linux, or the Windows build")
    pods: int = Field(
        default=0, description="Pods it runs now: each restarts when the next change is rolled."
    )
    differences: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=32)] = (
        Field(
            default=[],
            description="Fields of the pod template where what runs differs from what the "
            "operator renders: the next change of this AmbientMesh applies them. At most 32.",
        )
    )
    reason: Literal["OperatorUpgrade", "TakenOver"] | None = Field(
        default=None,
        description="In status.held: OperatorUpgrade (another operator version wrote the "
        "template that runs) or TakenOver (Helm's, from spec.adopt).",
    )
    approved: bool = Field(
        default=False,
        description="In status.held: the user approved it; it rolls when the platforms before "
        "it in the rollout order are Ready.",
    )


class HeldTemplates(ApiModel):
    """DaemonSets whose pods keep the template they run until a change or an approval."""

    approval: str = Field(
        description="The value of the AmbientMesh annotation ambientoperator.io/approve-templates "
        "that approves exactly what is listed: those DaemonSets then roll, Linux first, then "
        "each Windows build, each Ready before the next."
    )
    daemon_sets: Annotated[list[AsIsDaemonSet], Field(max_length=32)] = []
    stale_approval: str | None = Field(
        default=None,
        description="The annotation's value, when it approves something other than what is "
        "held now (what is held changed since): nothing is approved by it.",
    )


class AdoptionStatus(ApiModel):
    """What spec.adopt took over, or why it took nothing."""

    releases: Annotated[list[str], Field(max_length=8)] = []
    taken: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=64)] = Field(
        default=[], description="Each object taken over from the releases (Kind namespace/name)."
    )
    left_with_helm: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=32)] = (
        Field(
            default=[],
            description="RBAC of the releases that the operator does not render (the istio-cni "
            "chart's roles and bindings): left to Helm; the operator's chart grants the same.",
        )
    )
    refused: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=32)] = Field(
        default=[],
        description="Why nothing is taken: each release or object and its reason.",
    )
    as_is: Annotated[list[AsIsDaemonSet], Field(max_length=16)] = []


class RevisionStatus(ApiModel):
    """One istiod revision seen, and what of this mesh uses it."""

    name: str = Field(description="The revision (default: istiod installed without one).")
    version: str | None = Field(
        default=None, description="Its istiod's version; absent when nothing tells it."
    )
    istiod: bool = Field(
        default=False,
        description="An istiod Deployment of spec.namespace serves it (istiod-<revision>).",
    )
    tags: Annotated[list[str], Field(max_length=16)] = Field(
        default=[], description="Revision tags (istio-revision-tag-<tag>) pointing at it."
    )
    agents: bool = Field(default=False, description="The agents follow it (spec.istiod.revision).")
    waypoints: int = Field(default=0, description="Waypoints of our class that talk to it.")
    namespaces: Annotated[list[str], Field(max_length=16)] = Field(
        default=[], description="Namespaces whose istio.io/rev names it or a tag of it (16 shown)."
    )
    skew: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=4)] = Field(
        default=[],
        description="Where the agents or the waypoints that use it are outside Istio's support "
        "rule with its istiod.",
    )


class AmbientMeshStatus(ApiModel):
    """What the operator observed and did."""

    observed_generation: int | None = None
    conditions: Annotated[list[Condition], Field(max_length=16)] = []
    components: Annotated[list[ComponentStatus], Field(max_length=64)] = []
    nodes: NodeInventory = NodeInventory()
    platform: PlatformStatus | None = None
    enrollment: Enrollment = Enrollment()
    ready_components: str | None = Field(default=None, description="ready/total DaemonSets")
    versions: VersionStatus | None = None
    node_readiness: NodeReadinessStatus | None = Field(
        default=None, description="Set while spec.nodeReadiness.enabled"
    )
    adoption: AdoptionStatus | None = Field(
        default=None, description="Set while spec.adopt names Helm releases"
    )
    revisions: Annotated[list[RevisionStatus], Field(max_length=8)] = Field(
        default=[],
        description="Each istiod revision seen: its version and tags, and the agents, waypoints "
        "and namespaces that use it.",
    )
    held: HeldTemplates | None = Field(
        default=None,
        description="Set while agent DaemonSets keep the pod template they run instead of the "
        "render (after an operator upgrade, or a take-over): nothing restarts until the "
        "AmbientMesh changes or the user approves (docs/upgrades.md).",
    )


class AmbientMesh(ApiModel):
    """The AmbientMesh object as the operator reads it."""

    api_version: Literal["ambientoperator.io/v1alpha1"] = "ambientoperator.io/v1alpha1"
    kind: Literal["AmbientMesh"] = "AmbientMesh"
    metadata: dict[str, Any] = {"name": c.MESH_NAME}
    spec: AmbientMeshSpec = AmbientMeshSpec()
    status: AmbientMeshStatus | None = None

    @model_validator(mode="after")
    def _named_default(self) -> AmbientMesh:
        if self.metadata.get("name", c.MESH_NAME) != c.MESH_NAME:
            raise ValueError(f"metadata.name: an AmbientMesh must be named {c.MESH_NAME!r}")
        return self


__all__ = [
    "WINDOWS_BUILD_PATTERN",
    "AmbientMesh",
    "AmbientMeshSpec",
    "AmbientMeshStatus",
    "Condition",
]
