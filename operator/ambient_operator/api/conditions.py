"""Conditions as the operator judges them, before timestamps: the shared vocabulary.

Pure verdict functions (status/, render/) produce these; the status writer
turns them into the API's Condition objects.

Every condition type, condition reason, node verdict reason, Event reason
and webhook reason the operator writes is a member of one of the StrEnums
below, and nowhere else a literal. A member is a str: it is its value in
JSON, f-strings, metric labels and logs, and equals the string the API
server hands back (yaml.safe_dump alone refuses it; pass `.value` there).
The tables at the end say what each one means and what to do;
docs/troubleshooting.md shows them (`make docs` rewrites its tables from
here, and tests fail when the page is stale or a member goes unexplained
or unused).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Verdict:
    """One condition before timestamps: type, status, reason, message."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Problem:
    """Something that degrades the mesh (reason, message)."""

    reason: str
    message: str


# -- the vocabulary ---------------------------------------------------------------------


class MeshCondition(StrEnum):
    """Condition types of an AmbientMesh."""

    RECONCILED = "Reconciled"
    READY = "Ready"
    DEGRADED = "Degraded"


class MeshReason(StrEnum):
    """Reasons of an AmbientMesh's conditions, and of the Events that tell their changes."""

    # Reconciled
    RECONCILED = "Reconciled"
    INVALID_SPEC = "InvalidSpec"
    NAMESPACE_NOT_FOUND = "NamespaceNotFound"
    NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
    REPAIR_MODE_NOT_GRANTED = "RepairModeNotGranted"
    NAME_CONFLICT = "NameConflict"
    RENDER_FAILED = "RenderFailed"
    APPLY_FAILED = "ApplyFailed"
    ADOPTED_AS_IS = "AdoptedAsIs"
    TEMPLATES_HELD = "TemplatesHeld"
    ADOPTION_REFUSED = "AdoptionRefused"
    # Ready
    AGENTS_READY = "AgentsReady"
    DAEMONSET_NOT_READY = "DaemonSetNotReady"
    NO_AGENTS = "NoAgents"
    # Degraded: the most severe problem names the reason; status/components.py
    # (mesh_problems) looks in this order, most severe first.
    AS_EXPECTED = "AsExpected"
    CRD_OUTDATED = "CrdOutdated"
    ISTIOD_NOT_FOUND = "IstiodNotFound"
    ISTIOD_TRUST_MISSING = "IstiodTrustMissing"
    VERSION_SKEW = "VersionSkew"
    UNSUPPORTED_NODES = "UnsupportedNodes"
    MULTUS_NOT_AVAILABLE = "MultusNotAvailable"
    RENDER_WARNING = "RenderWarning"
    NODE_TAINT_NOT_REMOVED = "NodeTaintNotRemoved"


class NodeReason(StrEnum):
    """Why a node gets no agents (status.nodes.unsupportedNodes, `render`'s warnings)."""

    WINDOWS_BUILD_UNSUPPORTED = "WindowsBuildUnsupported"
    WINDOWS_BUILD_UNKNOWN = "WindowsBuildUnknown"
    ARCHITECTURE_UNSUPPORTED = "ArchitectureUnsupported"
    OPERATING_SYSTEM_UNKNOWN = "OperatingSystemUnknown"
    PLATFORM_DISABLED = "PlatformDisabled"
    WINDOWS_BUILD_NOT_ENABLED = "WindowsBuildNotEnabled"
    EXCLUDED_BY_SPEC = "ExcludedBySpec"


# Node verdicts that are a choice of the user, not a gap in support: not Degraded.
INTENDED_EXCLUSIONS = frozenset(
    {
        NodeReason.PLATFORM_DISABLED,
        NodeReason.WINDOWS_BUILD_NOT_ENABLED,
        NodeReason.EXCLUDED_BY_SPEC,
    }
)


class NamespaceEvent(StrEnum):
    """Warning Events on a Namespace (or a Service with istio.io/use-waypoint)."""

    MISSPELLED_DATAPLANE_MODE = "MisspelledDataplaneMode"
    INVALID_DATAPLANE_MODE = "InvalidDataplaneMode"
    SIDECAR_AND_AMBIENT = "SidecarAndAmbient"
    WAYPOINT_NOT_FOUND = "WaypointNotFound"
    NOT_A_WAYPOINT = "NotAWaypoint"
    MISSPELLED_USE_WAYPOINT = "MisspelledUseWaypoint"
    WAYPOINT_WITHOUT_AMBIENT = "WaypointWithoutAmbient"
    WAYPOINT_NAME_EXPECTED = "WaypointNameExpected"


class GatewayCondition(StrEnum):
    """Condition types of a Gateway, its listeners and a GatewayClass (Gateway API's)."""

    ACCEPTED = "Accepted"
    PROGRAMMED = "Programmed"
    RESOLVED_REFS = "ResolvedRefs"


class GatewayReason(StrEnum):
    """Reasons of Gateway, listener and GatewayClass conditions: Gateway API's, but one."""

    ACCEPTED = "Accepted"
    INVALID = "Invalid"
    UNSUPPORTED_ADDRESS = "UnsupportedAddress"
    INVALID_PARAMETERS = "InvalidParameters"
    LISTENERS_NOT_VALID = "ListenersNotValid"
    PROGRAMMED = "Programmed"
    PENDING = "Pending"
    NO_RESOURCES = "NoResources"
    ADDRESS_NOT_ASSIGNED = "AddressNotAssigned"
    # Ours: Gateway API lets a controller raise Programmed "with other reasons"
    # when none of its own fits (status/waypoints.py says why none does).
    NAME_CONFLICT = "NameConflict"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
    RESOLVED_REFS = "ResolvedRefs"
    INVALID_ROUTE_KINDS = "InvalidRouteKinds"


class WaypointEvent(StrEnum):
    """Warning Events about waypoints (on a Gateway, a ConfigMap or the AmbientMesh)."""

    INVALID_WAYPOINT_FOR = "InvalidWaypointFor"
    WINDOWS_PLACEMENT_IGNORED = "WindowsPlacementIgnored"
    WAYPOINT_ON_WINDOWS = "WaypointOnWindows"
    CLASS_DEFAULTS_UNREADABLE = "ClassDefaultsUnreadable"
    GATEWAY_CLASS_NOT_APPLIED = "GatewayClassNotApplied"
    NAME_CONFLICT = "NameConflict"
    CLASS_DEFAULTS_NOT_PINNED = "ClassDefaultsNotPinned"
    REPLICAS_LEFT_TO_AUTOSCALER = "ReplicasLeftToAutoscaler"


class MeshEvent(StrEnum):
    """Warning Events on the AmbientMesh that no condition carries (it is being deleted)."""

    ORPHAN_FAILED = "OrphanFailed"


class PodEvent(StrEnum):
    """Warning Events on a pod."""

    REDIRECTION_WAIT_MISSING = "RedirectionWaitMissing"
    REDIRECTION_WAIT_IMAGE_UNAVAILABLE = "RedirectionWaitImageUnavailable"


class AdmissionReason(StrEnum):
    """Why the redirection-wait webhook did what it did to a pod (annotation, metric)."""

    PINNED_TO_PRE_WS2025_BUILD = "PinnedToPreWS2025Build"
    SCHEDULED_ON_PRE_WS2025_NODE = "ScheduledOnPreWS2025Node"
    MAY_LAND_ON_PRE_WS2025_NODE = "MayLandOnPreWS2025Node"
    NOT_FIRST = "NotFirst"
    ALREADY_PRESENT = "AlreadyPresent"
    OPTED_OUT = "OptedOut"
    HOST_NETWORK = "HostNetwork"
    DATAPLANE_MODE_NONE = "DataplaneModeNone"
    SIDECAR = "Sidecar"
    NOT_ENROLLED = "NotEnrolled"
    NO_AMBIENT_MESH = "NoAmbientMesh"
    WORKAROUND_DISABLED = "WorkaroundDisabled"
    NOT_WINDOWS = "NotWindows"
    NO_PRE_WS2025_BUILD = "NoPreWS2025Build"
    NO_PRE_WS2025_NODE = "NoPreWS2025Node"
    IMAGE_UNAVAILABLE = "ImageUnavailable"


class BadReviewReason(StrEnum):
    """Why the webhook could not read a request: metric label, first word of its answer."""

    BODY_TOO_LARGE = "BodyTooLarge"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    NOT_JSON = "NotJSON"
    TOO_DEEP = "TooDeep"
    NOT_ADMISSION_REVIEW = "NotAdmissionReview"
    NO_UID = "NoUID"
    MALFORMED_REQUEST = "MalformedRequest"
    MALFORMED_POD = "MalformedPod"
    # Bugs of ours, not the sender's: logged with their traceback, not counted as bad reviews.
    DECISION_FAILED = "DecisionFailed"
    INTERNAL_ERROR = "InternalError"


class ErrorReason(StrEnum):
    """The reason label of the error metrics when a handler raised (a bug of ours)."""

    EXCEPTION = "Exception"


# -- what each one means: docs/troubleshooting.md's tables ------------------------------


@dataclass(frozen=True)
class Row:
    """One line of a troubleshooting table: a reason, where it shows, what it means, what to do."""

    reason: StrEnum
    meaning: str
    todo: str = ""
    # The column before or after the reason: the condition (`Ready=False`), the
    # object an Event is on, the webhook's action or HTTP answer.
    where: str = ""
    # Shown after the reason, e.g. the message that tells this case apart.
    note: str = ""


@dataclass(frozen=True)
class Table:
    """One table of docs/troubleshooting.md, between its marker comments.

    `columns` pairs each header with the Row field it shows: "reason",
    "where", "meaning" or "todo".
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    rows: tuple[Row, ...]

    def markdown(self) -> str:
        """The table as Markdown lines (no trailing newline)."""
        lines = [
            "| " + " | ".join(header for header, _ in self.columns) + " |",
            "|" + "---|" * len(self.columns),
        ]
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row, field) for _, field in self.columns) + " |")
        return "\n".join(lines)


def _cell(row: Row, field: str) -> str:
    if field == "reason":
        shown = f"`{row.reason.value}`"
        return f"{shown}, {row.note}" if row.note else shown
    text = str(getattr(row, field))
    if "\n" in text:
        raise ValueError(f"{row.reason}: {field} must be one line")
    return text


def when(condition: StrEnum, status: str, of: str = "") -> str:
    """The condition column: `Ready=False`, or `Listener Accepted=False` with `of`."""
    return f"{of} {condition.value}={status}".strip()


_MESH_COLUMNS = (
    ("Condition", "where"),
    ("Reason", "reason"),
    ("Meaning", "meaning"),
    ("What to do", "todo"),
)
_REASON_COLUMNS = (("Reason", "reason"), ("Meaning", "meaning"), ("What to do", "todo"))
_EVENT_COLUMNS = (
    ("Reason", "reason"),
    ("On", "where"),
    ("Meaning", "meaning"),
    ("What to do", "todo"),
)

_RECONCILED_FALSE = when(MeshCondition.RECONCILED, "False")
_ACCEPTED_FALSE = when(GatewayCondition.ACCEPTED, "False")
_PROGRAMMED_FALSE = when(GatewayCondition.PROGRAMMED, "False")

MESH_CONDITIONS = Table(
    "mesh-conditions",
    _MESH_COLUMNS,
    (
        Row(
            MeshReason.RECONCILED,
            "Every object the spec asks for is applied as asked.",
            "Nothing.",
            when(MeshCondition.RECONCILED, "True"),
        ),
        Row(
            MeshReason.INVALID_SPEC,
            "The spec failed the operator's own validation (the message names the field, e.g. "
            "`spec.ztunnel.rollout`). The API server checks most rules first; this catches "
            "objects stored by an older CRD.",
            "Fix the named field (`kubectl edit ambientmesh default`); apply the current CRD "
            "(`kubectl apply --server-side --force-conflicts -f crds/`).",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.NAMESPACE_NOT_FOUND,
            "`spec.namespace` names a namespace that does not exist (or is being deleted). "
            "Nothing was changed: no object written or pruned, the istio-cni binding not "
            "touched; the agents keep running where they are, which the message names. Told "
            "once (one Event).",
            "Fix the typo (`kubectl edit ambientmesh default`), or create the namespace, with "
            "istiod in it, if you mean to move the agents there.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.NAMESPACE_NOT_ALLOWED,
            "`spec.namespace` is not one of the namespaces the operator may put agents in "
            "(`--agents-namespace`; the chart's value `agents.namespaces`, where it grants the "
            "operator a Role). Nothing was changed.",
            "To move the agents: add the namespace to `agents.namespaces` (`helm upgrade ... "
            '--reuse-values --set-json \'agents.namespaces=["istio-system","new-ns"]\'`), wait '
            "for the move to finish (`READY True`), then drop the old one. Otherwise set "
            "`spec.namespace` back.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.REPAIR_MODE_NOT_GRANTED,
            "`spec.istioCni.repairMode: Delete` has istio-cni delete pods that started without "
            "redirection, which needs `delete` on every pod, and istio-cni may not have it: the "
            "chart does not grant it, or (without the chart) the operator does not hold it to "
            "grant. Nothing was changed: the agents keep running as they were.",
            "With the chart, set `istioCniRepair.deletePods=true` (`helm upgrade ... "
            "--reuse-values --set istioCniRepair.deletePods=true`): it grants istio-cni the "
            "permission and tells the operator. Without the chart, grant the operator `delete` "
            "on pods (RBAC lets it grant only what it holds; it asks on the next pass). Or set "
            "`spec.istioCni.repairMode` to `Repair` or `Label`, which need nothing more.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.RECONCILED,
            "A move of `spec.namespace` is under way: the new agents are applied and the old "
            "ones keep running until every new DaemonSet is Ready; then the old namespace's "
            "objects are pruned.",
            "Wait; if it lasts, `Ready=False` (`DaemonSetNotReady`) says which new DaemonSet is "
            "stuck.",
            when(MeshCondition.RECONCILED, "True"),
            'message "the agents in ... stay until those in ... are Ready"',
        ),
        Row(
            MeshReason.NAME_CONFLICT,
            "An object the spec asks for exists and is not this AmbientMesh's (no controller "
            "reference to it): typically Helm's `ztunnel` ServiceAccount or `istio-cni-config` "
            "ConfigMap from an upstream Istio install in the namespace. The message names each "
            "object and who manages it (its controller, or its field managers such as `helm`); "
            "DaemonSets that would use such an object are not written. It is never changed, "
            "adopted or deleted, and nothing is pruned in that pass.",
            "To move an install of Istio's `ztunnel`/`istio-cni` charts over without a restart, "
            "name its releases in `spec.adopt.helmReleases` ([migration.md](migration.md)). "
            "Otherwise remove the other install or the object, or choose another "
            "`spec.namespace`. The operator retries on every pass.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.ADOPTION_REFUSED,
            "`spec.adopt.helmReleases` names a Helm release that is not in `spec.namespace`, is "
            "not of Istio's `ztunnel` or `istio-cni` chart, or holds an object the operator does "
            "not render; or an object carries a named release's Helm metadata without being in "
            "its record. The message and `status.adoption.refused` name each object and why. "
            "Nothing at all is written in that pass: the take-over is whole or not at all.",
            "`helm list -n <namespace>` and `helm get manifest ztunnel -n <namespace>` (or "
            "`istio-cni`) show what a release holds. Remove the object named (or its Helm "
            "metadata), or take the release out of "
            "`spec.adopt`. When the records cannot be read (403), install the operator's chart "
            "with `adoption.enabled=true`. The operator checks again on its next pass (any "
            "change of the AmbientMesh starts one).",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.ADOPTED_AS_IS,
            "Objects of the releases in `spec.adopt.helmReleases` are the operator's now, and "
            "their DaemonSets still run the pod template Helm made, so no agent restarted. "
            "`status.adoption.asIs` lists each DaemonSet, its pods and the fields of its "
            "template that the next change of the AmbientMesh will apply (its pods are then "
            "replaced by the ordered rollout).",
            "Have Helm forget each release before anything runs `helm uninstall` on it (it "
            "would delete the objects): `kubectl delete secret -n <namespace> -l "
            "owner=helm,name=ztunnel`, and the same for `istio-cni`. Change the AmbientMesh "
            "when you are ready for the "
            "restart ([migration.md](migration.md)).",
            when(MeshCondition.RECONCILED, "True"),
        ),
        Row(
            MeshReason.TEMPLATES_HELD,
            "Agent DaemonSets run a pod template that another operator version wrote (the "
            "operator was upgraded, and its render of the same spec differs), so the new "
            "template waits instead of restarting every agent at once. `status.held` lists each "
            "DaemonSet, its platform, its pods and the fields that differ. Objects without pods "
            "(ConfigMaps, RBAC) were written at once.",
            "Nothing is wrong. Approve when the restart suits you: `kubectl annotate ambientmesh "
            "default ambientoperator.io/approve-templates=<status.held.approval> --overwrite`; "
            "Linux rolls first, then each Windows build, each Ready before the next. Any change "
            "of the spec that changes the agents rolls them too ([upgrades.md](upgrades.md)).",
            when(MeshCondition.RECONCILED, "True"),
        ),
        Row(
            MeshReason.RENDER_FAILED,
            "Rendering the DaemonSets raised an error: a bug, or facts the renderer did not "
            "expect. Previous objects stay as they were.",
            "Look at the operator log (it has the traceback) and report it with `kubectl get "
            "nodes -o yaml` and the AmbientMesh.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.APPLY_FAILED,
            "The API server refused one or more objects; the message lists them with its "
            "answer. Usually RBAC (`forbidden`), an admission policy, or a quota. Nothing is "
            "pruned in that pass.",
            "Read the message. For `forbidden`, compare the operator's ClusterRole with the "
            "chart's (`helm template`). For a policy engine (Kyverno, Gatekeeper, Pod Security), "
            "exempt the agents' namespace: the agents need host access.",
            _RECONCILED_FALSE,
        ),
        Row(
            MeshReason.AGENTS_READY,
            "Every DaemonSet has all its pods updated and ready.",
            "Nothing.",
            when(MeshCondition.READY, "True"),
        ),
        Row(
            MeshReason.DAEMONSET_NOT_READY,
            "At least one DaemonSet is rolling out, has pods not ready, or has none scheduled on "
            "nodes that should run it; the message says which and how many.",
            "`kubectl -n istio-system get pods -o wide -l "
            "app.kubernetes.io/managed-by=ambient-operator`, then `describe` a pod that is not "
            "ready: image pull errors (Windows images for the wrong build, a private registry), "
            "`Pending` for lack of resources, or crash loops (look at the agent's log; on "
            "Windows, is containerd at least 1.6 and HostProcess allowed?).",
            when(MeshCondition.READY, "False"),
        ),
        Row(
            MeshReason.NO_AGENTS,
            "No node gets an agent: no supported node, or every platform disabled.",
            "Check `status.nodes` and the spec's `platforms`.",
            when(MeshCondition.READY, "False"),
        ),
        Row(
            MeshReason.AS_EXPECTED,
            "Nothing is wrong.",
            "Nothing.",
            when(MeshCondition.DEGRADED, "False"),
        ),
        Row(
            MeshReason.CRD_OUTDATED,
            "The AmbientMesh CRD the API server serves lacks fields this operator knows: it "
            "was installed by an older release, and `helm upgrade` never updates a chart's "
            "`crds/`. The API server drops those fields from every write (a client that asks "
            "for no strict validation, like the Python client, is not told), so what you set "
            "there is not what the operator sees; status keeps to what the old schema declares. "
            "The message lists the fields. The operator reads the CRD at start and on every "
            "change of it.",
            "Apply the CRDs of the operator's release: `kubectl apply --server-side "
            "--force-conflicts -f crds/` from the release's source, or "
            "`-f charts/ambient-operator/crds/` from its chart "
            "([upgrades.md](upgrades.md)). Then set again any field that was dropped.",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.ISTIOD_NOT_FOUND,
            "The istiod Service (`spec.istiod.serviceName`, or `istiod[-<revision>]` in "
            "`spec.namespace`) does not exist, and no `spec.istiod.address` is set. Agents "
            "cannot get configuration or certificates.",
            "Install istiod in `spec.namespace`, or point `spec.istiod` at it.",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.ISTIOD_TRUST_MISSING,
            "istiod's `CA_TRUSTED_NODE_ACCOUNTS` does not list every ztunnel ServiceAccount "
            "(e.g. `istio-system/ztunnel-windows`), so those ztunnels cannot get certificates "
            "for the pods on their node.",
            "Set the istiod chart value the message names, `env.CA_TRUSTED_NODE_ACCOUNTS`, to "
            "every account it lists, comma-separated (with `--set-string`, escape the commas as "
            "`\\,`). The chart's `trustedZtunnelName` names only one account.",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.VERSION_SKEW,
            "istiod and the agents' versions are outside Istio's support rule: istiod may be at "
            "most one minor ahead of ztunnel and istio-cni, and never behind them. The message "
            "names both versions, the DaemonSets and the safe order. istiod's version is read "
            "from its Deployment's image tag; when nothing tells it, no skew is judged.",
            "Upgrade istiod first, then set `spec.images.tag` (and any full image reference in "
            "`spec.images`) one minor at a time; the operator rolls Linux, then each Windows "
            "build ([versions.md](versions.md)).",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.UNSUPPORTED_NODES,
            "Some nodes can never run the agents (see node reasons below); pods on them are not "
            "in the mesh. Nodes you left out on purpose ("
            + ", ".join(f"`{r.value}`" for r in NodeReason if r in INTENDED_EXCLUSIONS)
            + ") do not count.",
            "Move mesh workloads off those nodes, or upgrade them (WS2019 to WS2022 or later). "
            "The message lists up to 10.",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.MULTUS_NOT_AVAILABLE,
            "`spec.istioCni.provider: multus` asks for Multus's NetworkAttachmentDefinition "
            "`default/istio-cni`, and it was not written: the cluster does not serve the kind "
            "(Multus is not installed), or the operator may not write it. Everything else is "
            "applied; pods that attach istio-cni through Multus do not start meanwhile.",
            "Install Multus (its CRD `network-attachment-definitions.k8s.cni.cncf.io`); the "
            "operator writes the attachment on a later pass. Or set the chart value "
            "`multus.enabled=true` (`helm upgrade ... --reuse-values --set multus.enabled=true`), "
            "which lets it write them, as the message says. Or unset `spec.istioCni.provider`.",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.RENDER_WARNING,
            "The agents were rendered with a fallback that may not work: istiod's or the cluster "
            "DNS's Service IP is unknown, so Windows agents get a DNS name they cannot resolve; "
            "or `spec.images.ztunnel.windows` / `spec.images.istioCni.windows` is unset, so "
            "Windows agents get an image name Istio does not publish.",
            "Make sure `kube-system/kube-dns` and the istiod Service exist and have a ClusterIP; "
            "the operator re-renders as soon as they do. Build the Windows images and set the "
            "field the message names ([windows-support.md](windows-support.md#agent-images)).",
            when(MeshCondition.DEGRADED, "True"),
        ),
        Row(
            MeshReason.NODE_TAINT_NOT_REMOVED,
            "With `spec.nodeReadiness.enabled`, a node's agents are Ready but the API server "
            "refused to remove its readiness taint; the message names the nodes and its answer. "
            "`forbidden`: the operator holds no `patch` on Nodes. New pods cannot schedule on "
            "those nodes meanwhile.",
            "Set the chart value `nodeReadiness.enabled=true` (`helm upgrade ... --reuse-values "
            "--set nodeReadiness.enabled=true`), or turn `spec.nodeReadiness.enabled` off. "
            "Other answers are retried on every pass ([node-readiness.md](node-readiness.md)).",
            when(MeshCondition.DEGRADED, "True"),
        ),
    ),
)

NODE_REASONS = Table(
    "node-reasons",
    _REASON_COLUMNS,
    (
        Row(
            NodeReason.WINDOWS_BUILD_UNSUPPORTED,
            "A Windows build older than WS2022 (WS2019): no HostProcess agents with HNS L4 WFP "
            "proxy policies.",
            "Upgrade the node pool to WS2022 or WS2025; keep mesh workloads off it meanwhile.",
        ),
        Row(
            NodeReason.WINDOWS_BUILD_UNKNOWN,
            "The build cannot be told: no `node.kubernetes.io/windows-build` label and nothing "
            "usable in `status.nodeInfo.kernelVersion` / `osImage`, or a build the operator does "
            "not know (newer than it).",
            "Label the node with its build, or upgrade the operator for a newer Windows release.",
        ),
        Row(
            NodeReason.ARCHITECTURE_UNSUPPORTED,
            "No agent image for this OS and CPU (Windows: amd64 only; Linux: amd64 and arm64).",
            "Run mesh workloads on supported nodes.",
        ),
        Row(
            NodeReason.OPERATING_SYSTEM_UNKNOWN,
            "The node reports neither linux nor windows (`kubernetes.io/os` and "
            "`nodeInfo.operatingSystem`).",
            "Check the node's labels; virtual nodes (e.g. serverless) cannot run the agents.",
        ),
        Row(
            NodeReason.PLATFORM_DISABLED,
            "`spec.platforms.<os>.enabled` is false. Intended; not Degraded.",
            "Nothing, unless you meant to enable it.",
        ),
        Row(
            NodeReason.WINDOWS_BUILD_NOT_ENABLED,
            "The build is supported but not listed in `spec.platforms.windows.builds`. Intended.",
            "Add the build to the list, or remove the list to serve every supported build.",
        ),
        Row(
            NodeReason.EXCLUDED_BY_SPEC,
            "The node lacks a label from `spec.platforms.<os>.nodeSelector`, or has a taint the "
            "spec's tolerations miss. Intended.",
            "Adjust the selector or tolerations if the node should run the agents.",
        ),
    ),
)

NAMESPACE_EVENTS = Table(
    "namespace-events",
    _REASON_COLUMNS,
    (
        Row(
            NamespaceEvent.MISSPELLED_DATAPLANE_MODE,
            "The namespace has a key that looks like `istio.io/dataplane-mode` but is not it "
            "(`data-plane-mode`, `dataplane-mode`, `istio.io/data-plane-mode`, "
            "`istio.io/dataPlaneMode`, ...) and not the key itself. Istio reads only the exact "
            "key: the namespace is not enrolled and ztunnel does not redirect its pods.",
            "`kubectl label namespace <ns> istio.io/dataplane-mode=ambient`, and remove the "
            "misspelt key.",
        ),
        Row(
            NamespaceEvent.INVALID_DATAPLANE_MODE,
            "`istio.io/dataplane-mode` has a value other than `ambient` or `none`; pods there are "
            "not enrolled.",
            "`kubectl label namespace <ns> istio.io/dataplane-mode=ambient --overwrite`.",
        ),
        Row(
            NamespaceEvent.SIDECAR_AND_AMBIENT,
            "The namespace is ambient and also has sidecar injection (`istio-injection=enabled` "
            "or `istio.io/rev`). Injected pods keep their sidecar and are not redirected by "
            "ztunnel.",
            "Choose one: remove the injection label, or the ambient one.",
        ),
        Row(
            NamespaceEvent.WAYPOINT_NOT_FOUND,
            "`istio.io/use-waypoint` names a Gateway that does not exist (in the namespace, or in "
            "`istio.io/use-waypoint-namespace`); traffic skips the waypoint.",
            "Create the waypoint (`ambient-operator waypoint apply -n <ns>`) or fix the label.",
        ),
        Row(
            NamespaceEvent.NOT_A_WAYPOINT,
            "The named Gateway exists but has no HBONE listener on port 15008, so it is not a "
            "waypoint; traffic skips it.",
            "Use a Gateway of a waypoint class with the listener `{name: mesh, port: 15008, "
            "protocol: HBONE}`.",
        ),
        Row(
            NamespaceEvent.MISSPELLED_USE_WAYPOINT,
            "A key that looks like `istio.io/use-waypoint` but is not it (`use-waypoint`, "
            "`istio.io/useWaypoint`, ...), and not the key itself: no waypoint is used.",
            "`kubectl label namespace <ns> istio.io/use-waypoint=<waypoint name>`, and remove the "
            "misspelt key.",
        ),
        Row(
            NamespaceEvent.WAYPOINT_WITHOUT_AMBIENT,
            "`istio.io/use-waypoint` is on a namespace without `istio.io/dataplane-mode=ambient`: "
            "its pods are not redirected by ztunnel, so the label has no effect on them (pods "
            "labelled for ambient themselves excepted). Not told when a misspelt or invalid "
            "`istio.io/dataplane-mode` is the reason.",
            "`kubectl label namespace <ns> istio.io/dataplane-mode=ambient`.",
        ),
        Row(
            NamespaceEvent.WAYPOINT_NAME_EXPECTED,
            "`istio.io/use-waypoint` is `true` (or `yes`, `enabled`, `false`, ...) and no Gateway "
            "has that name. The label takes a waypoint Gateway's name, or `none` to use no "
            "waypoint; traffic skips any waypoint. Told instead of `WaypointNotFound`.",
            "Set it to a waypoint's name (the message lists the namespace's waypoints), or "
            "create one: `ambient-operator waypoint apply -n <ns>` makes `waypoint`.",
        ),
    ),
)

GATEWAY_CONDITIONS = Table(
    "gateway-conditions",
    _MESH_COLUMNS,
    (
        Row(
            GatewayReason.ACCEPTED,
            "The Gateway (or GatewayClass) is served as a waypoint on Linux nodes.",
            "Nothing.",
            when(GatewayCondition.ACCEPTED, "True"),
        ),
        Row(
            GatewayReason.INVALID,
            "The name is unusable for the objects it needs (too long, not a DNS label), per the "
            "message.",
            "Rename the Gateway (or its `gateway.istio.io/name-override`).",
            _ACCEPTED_FALSE,
        ),
        Row(
            GatewayReason.UNSUPPORTED_ADDRESS,
            "`spec.addresses` is set; a waypoint's address is its Service's.",
            "Remove `spec.addresses`.",
            _ACCEPTED_FALSE,
        ),
        Row(
            GatewayReason.INVALID_PARAMETERS,
            "A `parametersRef` (of the Gateway's `infrastructure` or of the class) names a "
            "missing ConfigMap, another kind, a class ConfigMap outside the AmbientMesh's "
            "`spec.namespace`, or has keys or values that do not parse (or an autoscaler whose "
            "`minReplicas` is above its `maxReplicas`, a budget with both `minAvailable` and "
            "`maxUnavailable`); the message names the key, never the value. Or the Gateway "
            "asks for what `spec.waypoints.policy` refuses "
            "(a ServiceAccount not opted in, an image outside `imagePrefixes`, a keyless "
            "toleration, a denied node key, an infrastructure annotation not in "
            "`podAnnotations`); the message names the policy field.",
            "Fix the ConfigMap: keys `image`, `replicas`, `resources`, `nodeSelector`, "
            "`tolerations`, each a YAML value, and `horizontalPodAutoscaler`, "
            "`podDisruptionBudget`, each an overlay `spec: {...}` "
            "([waypoints.md](waypoints.md#scaling-and-disruption)); move class parameters to "
            "`spec.namespace`. For the "
            "policy: change the Gateway, label the ServiceAccount "
            "`ambientoperator.io/waypoint-service-account=true` (its owners' call), or have the "
            "platform team widen `spec.waypoints.policy` "
            "([waypoints.md](waypoints.md#policy-what-a-gateway-may-ask-of-its-pods)).",
            _ACCEPTED_FALSE,
        ),
        Row(
            GatewayReason.LISTENERS_NOT_VALID,
            "No listener is HBONE on 15008.",
            "Add `{name: mesh, port: 15008, protocol: HBONE}`.",
            _ACCEPTED_FALSE,
        ),
        Row(
            GatewayReason.PROGRAMMED,
            "At least one waypoint pod is available behind the Service's ClusterIP, which is in "
            "`status.addresses`.",
            "Nothing.",
            when(GatewayCondition.PROGRAMMED, "True"),
        ),
        Row(
            GatewayReason.PENDING,
            "The Deployment or Service is being created, or no pod is available yet.",
            "Wait; if it lasts, `kubectl describe deploy -n <ns> <gateway>` (image pull, no Linux "
            "node with room).",
            _PROGRAMMED_FALSE,
        ),
        Row(
            GatewayReason.INVALID,
            "Not accepted, or applying its objects failed (message).",
            "Fix what Accepted or the message says.",
            _PROGRAMMED_FALSE,
        ),
        Row(
            GatewayReason.NO_RESOURCES,
            "`replicas: 0` was asked (parametersRef or `spec.waypoints.replicas`). Addresses "
            "already reported are kept.",
            "Set replicas to 1 or more.",
            _PROGRAMMED_FALSE,
        ),
        Row(
            GatewayReason.ADDRESS_NOT_ASSIGNED,
            "The waypoint Service has no ClusterIP yet.",
            "Wait; check the Service.",
            _PROGRAMMED_FALSE,
        ),
        Row(
            GatewayReason.NAME_CONFLICT,
            "An object that is not this Gateway's (no controller reference with its UID) holds a "
            "name the waypoint needs: another team's Service or ServiceAccount named like the "
            "Gateway, or one another Gateway created under the same "
            "`gateway.istio.io/name-override`. The message names each. Nothing is written for "
            "the Gateway, and nothing of theirs is changed, adopted or deleted; it is checked "
            "again with backoff.",
            "Rename the Gateway or set a free `gateway.istio.io/name-override`; or, if the object "
            "is a leftover nobody needs, delete it.",
            _PROGRAMMED_FALSE,
        ),
        Row(
            GatewayReason.ACCEPTED,
            "This listener is HBONE on 15008.",
            "Nothing.",
            when(GatewayCondition.ACCEPTED, "True", "Listener"),
        ),
        Row(
            GatewayReason.UNSUPPORTED_PROTOCOL,
            "This listener is not HBONE/15008; the others still work.",
            "Remove or fix the listener.",
            when(GatewayCondition.ACCEPTED, "False", "Listener"),
        ),
        Row(
            GatewayReason.PROGRAMMED,
            "The Gateway is Programmed and this listener is valid.",
            "Nothing.",
            when(GatewayCondition.PROGRAMMED, "True", "Listener"),
        ),
        Row(
            GatewayReason.INVALID,
            "This listener is not HBONE/15008, or the Gateway's Programmed is `Invalid`.",
            "Fix the listener, or what the Gateway's conditions say.",
            when(GatewayCondition.PROGRAMMED, "False", "Listener"),
        ),
        Row(
            GatewayReason.PENDING,
            "The Gateway is not Programmed yet, for any other reason (its message is repeated).",
            "See the Gateway's Programmed condition.",
            when(GatewayCondition.PROGRAMMED, "False", "Listener"),
        ),
        Row(
            GatewayReason.RESOLVED_REFS,
            "Nothing to resolve.",
            "Nothing.",
            when(GatewayCondition.RESOLVED_REFS, "True", "Listener"),
        ),
        Row(
            GatewayReason.INVALID_ROUTE_KINDS,
            "`allowedRoutes.kinds` names route kinds that cannot attach to a waypoint listener.",
            "Attach routes to the Services that use the waypoint (`parentRefs` to the Service), "
            "not to the listener.",
            when(GatewayCondition.RESOLVED_REFS, "False", "Listener"),
        ),
    ),
)

WAYPOINT_EVENTS = Table(
    "waypoint-events",
    _EVENT_COLUMNS,
    (
        Row(
            WaypointEvent.INVALID_WAYPOINT_FOR,
            "`istio.io/waypoint-for` on the Gateway or class is not `service`, `workload`, `all` "
            "or `none`.",
            "Fix the label.",
            "Gateway",
        ),
        Row(
            WaypointEvent.WINDOWS_PLACEMENT_IGNORED,
            "Its parameters asked for Windows placement (a node selector or toleration that only "
            "fits Windows); it was dropped, waypoints run on Linux only.",
            "Remove the Windows placement from the parameters.",
            "Gateway",
        ),
        Row(
            WaypointEvent.REPLICAS_LEFT_TO_AUTOSCALER,
            "A parametersRef ConfigMap sets `replicas` and the waypoint has a "
            "HorizontalPodAutoscaler (`horizontalPodAutoscaler` key): the autoscaler sets the "
            "Deployment's replicas, so `replicas` is not applied.",
            "Remove `replicas`, or set the count through the autoscaler's `minReplicas`.",
            "Gateway",
        ),
        Row(
            WaypointEvent.WAYPOINT_ON_WINDOWS,
            "A waypoint pod (of istiod's `istio-waypoint` class, or any waypoint) runs on a "
            "Windows node, where Envoy cannot run.",
            "Pin it to Linux (`nodeSelector: {kubernetes.io/os: linux}` in istiod's class "
            "defaults or the Gateway's parameters), or use the operator's class.",
            "Gateway",
        ),
        Row(
            WaypointEvent.CLASS_DEFAULTS_UNREADABLE,
            "istiod's class-defaults ConfigMap for `istio-waypoint` has a `deployment` overlay "
            "that is not a YAML mapping, so the operator could not add the Linux pin.",
            "Fix the ConfigMap's `deployment` key.",
            "ConfigMap",
        ),
        Row(
            WaypointEvent.GATEWAY_CLASS_NOT_APPLIED,
            "The operator could not create or update its GatewayClass (message has the API "
            "server's answer; often Gateway API CRDs missing or RBAC).",
            "Install Gateway API CRDs; check the operator's permissions.",
            "AmbientMesh",
        ),
        Row(
            WaypointEvent.NAME_CONFLICT,
            "A GatewayClass named `spec.waypoints.className` exists and is not the "
            "AmbientMesh's; it is left alone.",
            "Delete that class if nobody uses it, or set another `spec.waypoints.className`.",
            "AmbientMesh",
        ),
        Row(
            WaypointEvent.CLASS_DEFAULTS_NOT_PINNED,
            "A ConfigMap labelled `gateway.istio.io/defaults-for-class=istio-waypoint` that the "
            "operator did not create (Helm's, say) lacks the Linux pin; the operator does not "
            "edit other parties' ConfigMaps.",
            "Add `nodeSelector: {kubernetes.io/os: linux}` under `spec.template.spec` of its "
            "`deployment` key (for Helm, in istiod's `gatewayClasses` value).",
            "ConfigMap",
        ),
    ),
)

MESH_EVENTS = Table(
    "mesh-events",
    _EVENT_COLUMNS,
    (
        Row(
            MeshEvent.ORPHAN_FAILED,
            "The AmbientMesh is being deleted with `spec.deletionPolicy: Orphan`, and the "
            "operator could not remove its owner reference, labels and annotations from the "
            "objects named (the API server refused the write). Its finalizer "
            "`ambientoperator.io/orphan-agents` keeps the AmbientMesh, and with it every agent, "
            "until they are let go; the operator tries again on every event.",
            "Fix what the message names (often RBAC: the operator's chart grants it); to give "
            "up keeping the agents, remove the finalizer and they are garbage-collected with "
            "the AmbientMesh.",
            "AmbientMesh",
        ),
    ),
)

POD_EVENTS = Table(
    "pod-events",
    _EVENT_COLUMNS,
    (
        Row(
            PodEvent.REDIRECTION_WAIT_MISSING,
            "A Windows pod that should have the redirection-wait init container was admitted "
            "without it, because the webhook did not answer (the operator was down or slow; the "
            "webhook never blocks pod creation). Its containers may start before istio-cni "
            "redirects its traffic, which then bypasses ztunnel until redirection is on. "
            "Counted in `status.enrollment.workaroundMisses` and "
            "`ambient_operator_webhook_missed_pods`.",
            "Delete the pod so its controller recreates it with the workaround; check that the "
            "operator runs and its Service has endpoints.",
            "Pod",
        ),
        Row(
            PodEvent.REDIRECTION_WAIT_IMAGE_UNAVAILABLE,
            "A new Windows pod that may run on a pre-WS2025 node was admitted without the "
            "redirection-wait init container because the image it would get is known not to "
            "exist: no `spec.newPodWorkaround.multiBuildImage` and no `spec.images.registry` "
            "(nor the chart's `registry`), or one under Istio's hub, which publishes none "
            "(admission reason `ImageUnavailable`). The webhook never hands a pod an image that "
            "cannot be pulled. Its containers may start before istio-cni redirects its "
            "traffic, which then bypasses ztunnel until redirection is on. Counted in "
            "`status.enrollment.workaroundMisses` and `workaroundImageUnavailable`.",
            "Build the images with `make images REGISTRY=<registry>` (docs/images.md) and set "
            "`spec.images.registry` to that registry (or the chart's `registry`); then delete "
            "the pod so it is recreated with the workaround.",
            "Pod",
        ),
    ),
)

_DECISION_COLUMNS = (("Reason", "reason"), ("Action", "where"), ("Meaning", "meaning"))

ADMISSION_DECISIONS = Table(
    "admission-decisions",
    _DECISION_COLUMNS,
    (
        Row(
            AdmissionReason.PINNED_TO_PRE_WS2025_BUILD,
            "The pod's node selection pins `node.kubernetes.io/windows-build` to WS2022; it gets "
            "that build's image.",
            where="inject",
        ),
        Row(
            AdmissionReason.SCHEDULED_ON_PRE_WS2025_NODE,
            "The pod is bound (`spec.nodeName`) to a WS2022 node that runs the agents.",
            where="inject",
        ),
        Row(
            AdmissionReason.MAY_LAND_ON_PRE_WS2025_NODE,
            "No build pinned, and a WS2022 node with agents matches its selection; it gets the "
            "multi-build image.",
            where="inject",
        ),
        Row(
            AdmissionReason.NOT_FIRST,
            "Another webhook put an init container ahead of ours; ours is moved back to the front.",
            where="reorder",
        ),
        Row(
            AdmissionReason.ALREADY_PRESENT,
            "The pod already has the init container.",
            where="none",
        ),
        Row(
            AdmissionReason.OPTED_OUT,
            'The pod has `ambientoperator.io/redirection-wait: "false"`.',
            where="none",
        ),
        Row(AdmissionReason.HOST_NETWORK, "Host-network pods are never enrolled.", where="none"),
        Row(
            AdmissionReason.DATAPLANE_MODE_NONE,
            "The pod has `istio.io/dataplane-mode=none`.",
            where="none",
        ),
        Row(
            AdmissionReason.SIDECAR,
            "The pod gets an Istio sidecar, which wins over ambient.",
            where="none",
        ),
        Row(
            AdmissionReason.NOT_ENROLLED,
            "Neither the pod nor its namespace is ambient.",
            where="none",
        ),
        Row(
            AdmissionReason.NO_AMBIENT_MESH,
            "No usable AmbientMesh (missing, being deleted, or invalid).",
            where="none",
        ),
        Row(
            AdmissionReason.WORKAROUND_DISABLED,
            "`spec.newPodWorkaround.enabled` is false.",
            where="none",
        ),
        Row(
            AdmissionReason.NOT_WINDOWS,
            "The pod does not target Windows nodes.",
            where="none",
        ),
        Row(
            AdmissionReason.NO_PRE_WS2025_BUILD,
            "The pod is pinned to builds that need no workaround (WS2025) or have no agents "
            "(WS2019).",
            where="none",
        ),
        Row(
            AdmissionReason.NO_PRE_WS2025_NODE,
            "No WS2022 node with agents matches the pod's selection and tolerations, or it is "
            "bound to a node that needs no workaround.",
            where="none",
        ),
        Row(
            AdmissionReason.IMAGE_UNAVAILABLE,
            "The pod needs the init container, but the image it would get is known not to "
            "exist: no `spec.newPodWorkaround.multiBuildImage` (or per-build image) and no "
            "`spec.images.registry`, or one under Istio's hub, which publishes none. The pod is "
            "admitted without it, never handed an image that cannot be pulled; its annotation "
            "reads `withheld; build=...; reason=ImageUnavailable`, and the operator posts the "
            "Warning Event `RedirectionWaitImageUnavailable` and counts it in status.",
            where="withheld",
        ),
        Row(
            ErrorReason.EXCEPTION,
            "Deciding raised (a bug in the operator): the pod is admitted unchanged with the "
            f"warning `{BadReviewReason.DECISION_FAILED.value}` (below), and the log has the "
            "traceback.",
            where="error",
        ),
    ),
)

_ANSWER_COLUMNS = (("Reason", "reason"), ("Answer", "where"), ("Meaning", "meaning"))
_A_BUG = (
    "A bug in the operator; the log line has its traceback (once per 10 seconds). Please report it."
)

BAD_REVIEWS = Table(
    "bad-reviews",
    _ANSWER_COLUMNS,
    (
        Row(BadReviewReason.BODY_TOO_LARGE, "The body exceeds 4 MiB.", where="413"),
        Row(
            BadReviewReason.UNSUPPORTED_MEDIA_TYPE,
            "The Content-Type is not `application/json`.",
            where="415",
        ),
        Row(BadReviewReason.NOT_JSON, "The body is empty, not UTF-8 or not JSON.", where="400"),
        Row(BadReviewReason.TOO_DEEP, "The JSON nests deeper than 100 levels.", where="400"),
        Row(
            BadReviewReason.NOT_ADMISSION_REVIEW,
            "Not a JSON object, or `apiVersion`/`kind` other than `admission.k8s.io/v1` "
            "`AdmissionReview`.",
            where="400",
        ),
        Row(
            BadReviewReason.NO_UID,
            "No `request`, or no string `request.uid` to answer to.",
            where="400",
        ),
        Row(
            BadReviewReason.MALFORMED_REQUEST,
            "A field of the request is missing or of the wrong type (`request.operation`, "
            "`request.object`, ...).",
            where="allowed, warning",
        ),
        Row(
            BadReviewReason.MALFORMED_POD,
            "A field of the pod the decision reads has the wrong type (`spec.containers` not a "
            "list, ...).",
            where="allowed, warning",
        ),
        Row(
            BadReviewReason.DECISION_FAILED,
            f"Deciding for the pod raised. {_A_BUG}",
            where="allowed, warning",
        ),
        Row(
            BadReviewReason.INTERNAL_ERROR,
            f"Answering the review raised (500 when even its uid cannot be read). {_A_BUG}",
            where="allowed, warning",
        ),
    ),
)

# Every table of docs/troubleshooting.md, in page order.
TROUBLESHOOTING_TABLES = (
    MESH_CONDITIONS,
    NODE_REASONS,
    NAMESPACE_EVENTS,
    GATEWAY_CONDITIONS,
    WAYPOINT_EVENTS,
    MESH_EVENTS,
    POD_EVENTS,
    ADMISSION_DECISIONS,
    BAD_REVIEWS,
)

# Every enum of the vocabulary: each member is explained by a table row.
VOCABULARY: tuple[type[StrEnum], ...] = (
    MeshCondition,
    MeshReason,
    NodeReason,
    NamespaceEvent,
    GatewayCondition,
    GatewayReason,
    WaypointEvent,
    MeshEvent,
    PodEvent,
    AdmissionReason,
    BadReviewReason,
    ErrorReason,
)
