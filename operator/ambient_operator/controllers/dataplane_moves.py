"""The data plane's inputs and its namespace moves.

What a data-plane pass starts from: the cluster facts for render, this mesh's
objects in the caches, and where its agents run now. A move of spec.namespace
is make-before-break: `namespace_refusal` says whether the new namespace can
take the agents at all, and `_taking_over` whether those there may replace
the old ones yet. Also the module-level helpers the pass uses (a spec error's
message, what a DaemonSet's pods use). The pass itself is in dataplane.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.adopt import Takeover
from ambient_operator.apply.ownership import conflict, describe
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.facts import (
    NETWORK_ATTACHMENTS_NOT_GRANTED,
    NETWORK_ATTACHMENTS_NOT_SERVED,
    NETWORK_ATTACHMENTS_SERVED,
    ClusterFacts,
    NodeFacts,
)
from ambient_operator.cluster.node_table import PerNode, Readings
from ambient_operator.cluster.platform import (
    MarkTally,
    NodeMark,
    PlatformChoice,
    choice_warning,
    effective_platform,
    node_mark,
)
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.versions import RunningAgent, workload_image
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.resources import KINDS, ObjectKey
from ambient_operator.render import RenderResult
from ambient_operator.render.values import ZTUNNEL
from ambient_operator.status.components import (
    daemonset_placed,
    daemonset_ready,
    daemonset_settled,
)
from ambient_operator.status.events import EventRecorder, now_rfc3339

CONTROLLER = c.DATAPLANE_CONTROLLER
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]
NAMESPACE = KINDS[("v1", "Namespace")]
NETWORK_ATTACHMENT = KINDS[("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")]
# The chart value that grants the operator a namespace for the agents.
CHART_NAMESPACES_VALUE = "agents.namespaces"
CLUSTER_DNS = ("kube-system", "kube-dns")


def spec_error(exc: ValidationError) -> str:
    """The first validation error as `spec.a.b: message`."""
    first = exc.errors()[0]
    path = ".".join(str(part) for part in ("spec", *first["loc"]))
    return f"{path}: {first['msg']}"


def _uses(obj: Mapping[str, Any]) -> Iterator[ObjectKey]:
    """Keys of the ServiceAccount and ConfigMaps a DaemonSet's pods use, in its namespace."""
    if obj.get("kind") != "DaemonSet":
        return
    namespace = obj["metadata"].get("namespace") or ""
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    if pod.get("serviceAccountName"):
        yield ("v1", "ServiceAccount", namespace, str(pod["serviceAccountName"]))
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or {}
            if ref.get("name"):
                yield ("v1", "ConfigMap", namespace, str(ref["name"]))
    for volume in pod.get("volumes") or []:
        ref = volume.get("configMap") or {}
        if ref.get("name"):
            yield ("v1", "ConfigMap", namespace, str(ref["name"]))


def _named(key: ObjectKey) -> str:
    return describe({"kind": key[1], "metadata": {"namespace": key[2], "name": key[3]}})


class DataplaneMoves:
    """Where this mesh's agents are and may go; the base of `DataplaneController`."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        events: EventRecorder,
        kube_version: str = "1.37",
        clock: Callable[[], str] = now_rfc3339,
        *,
        agents_namespaces: Collection[str] = (),
        cni_rbac: bool = True,
        istio_cni_may_delete_pods: bool = False,
        network_attachments: bool = False,
        default_registry: str | None = None,
    ) -> None:
        self.state = state
        # --default-registry: spec.images.registry of a mesh that names none.
        self.default_registry = default_registry
        self.kube = kube
        self.events = events
        self.kube_version = kube_version
        self.clock = clock
        # The webhook's misses, and those of them for want of an image (webhook/misses.py).
        self.workaround_misses = (0, 0)
        # Where the agents may go (empty: anywhere). The chart grants the
        # operator DaemonSets, ConfigMaps and ServiceAccounts only there.
        self.agents_namespaces = tuple(sorted(set(agents_namespaces)))
        # Whether the istio-cni ClusterRole and binding are ours to keep;
        # the chart ships them itself.
        self.cni_rbac = cni_rbac
        # The last answer of spec.adopt (controllers/dataplane.py, _takeover).
        self.takeover: Takeover | None = None
        # With the chart's istio-cni RBAC: whether the chart grants istio-cni
        # delete on pods. Without: whether the operator was found to hold it, and
        # so may grant it (asked until it does).
        self.istio_cni_may_delete_pods = istio_cni_may_delete_pods
        self.holds_pod_delete = False
        # Whether the operator may write Multus's NetworkAttachmentDefinitions,
        # and whether the API server was found to serve them (asked until it does).
        self.may_write_network_attachments = network_attachments
        self.network_attachments_served = False
        # Each node's facts and platform mark by its cached object: the caches
        # replace a Node's object on each of its events, so an unchanged one is
        # the same object.
        self._node_facts: PerNode[NodeFacts] = PerNode(NodeFacts.from_node)
        self._marks = MarkTally()
        self._node_marks: PerNode[NodeMark | None] = PerNode(node_mark, self._marks.set)
        # Nodes whose facts were read, for tests that count the work.
        self.node_facts_read = 0

    # -- facts ------------------------------------------------------------
    def _service_ip(self, namespace: str, name: str) -> str | None:
        svc = self.state.services.get((namespace, name))
        ip = ((svc or {}).get("spec") or {}).get("clusterIP")
        return ip if ip and ip != "None" else None

    def may_grant_pod_delete(self) -> bool:
        """Whether istio-cni may have delete on pods (spec.istioCni.repairMode Delete).

        With the chart's RBAC, the chart says so (--istio-cni-may-delete-pods).
        Without, the operator writes istio-cni's ClusterRole, and the API server
        lets it grant only what it holds itself (or with `escalate`): it asks
        before writing anything, so that a ConfigMap asking istio-cni to delete
        pods is never written beside a role refused. Blocking: call it in a thread.
        """
        if not self.cni_rbac:
            return self.istio_cni_may_delete_pods
        if not self.holds_pod_delete:
            rbac = "rbac.authorization.k8s.io"
            self.holds_pod_delete = self.kube.may("delete", "pods") or self.kube.may(
                "escalate", "clusterroles", rbac
            )
        return self.holds_pod_delete

    def network_attachments(self, spec: AmbientMeshSpec) -> str:
        """Whether Multus's NetworkAttachmentDefinitions can be written (cluster/facts.py).

        Discovery is asked only while the spec wants one and the kind was not
        found served yet: Multus may be installed at any time, and then a later
        pass writes it. Blocking: call it in a thread.
        """
        if spec.istio_cni.provider != "multus":
            return NETWORK_ATTACHMENTS_SERVED
        if not self.may_write_network_attachments:
            return NETWORK_ATTACHMENTS_NOT_GRANTED
        if not self.network_attachments_served:
            self.network_attachments_served = self.kube.serves(NETWORK_ATTACHMENT)
        if self.network_attachments_served:
            return NETWORK_ATTACHMENTS_SERVED
        return NETWORK_ATTACHMENTS_NOT_SERVED

    def node_facts(self) -> Readings[NodeFacts]:
        """Every node's facts, in name order; only a node whose object changed is read again.

        The readings tell render which nodes changed since the last pass's.
        Raises ValueError naming the field when a Node is malformed (NodeFacts.from_node).
        """
        facts = self._node_facts.update(self.state.nodes)
        self.node_facts_read = self._node_facts.reads
        return facts

    def facts(
        self,
        spec: AmbientMeshSpec,
        moving_from: Sequence[str] = (),
        ours: Mapping[ObjectKey, Mapping[str, Any]] | None = None,
        choice: PlatformChoice | None = None,
        network_attachments: str = NETWORK_ATTACHMENTS_SERVED,
    ) -> ClusterFacts:
        """Cluster facts for render, from the caches; `ours` (this mesh's objects, `ours()`)
        tells a rollout's progress.

        `choice` is `platform_choice(spec)` when the caller has it already,
        taken from the same Nodes.
        """
        nodes = self.node_facts()
        choice = choice or self.platform_choice(spec)
        return ClusterFacts(
            nodes=nodes,
            istiod_ip=self._service_ip(spec.namespace, spec.istiod.service()),
            istiod_ips={
                name: ip
                for (namespace, name) in self.state.services
                if namespace == spec.namespace and (ip := self._service_ip(namespace, name))
            },
            dns_ip=self._service_ip(*CLUSTER_DNS),
            kube_version=self.kube_version,
            moving_from=tuple(moving_from),
            agents=self.running_agents(spec.namespace, ours) if ours is not None else {},
            platform=choice.name,
            platform_warning=choice_warning(choice),
            network_attachments=network_attachments,
        )

    def platform_choice(self, spec: AmbientMeshSpec) -> PlatformChoice:
        """The platform the agents are rendered for: spec.platform, or what the Nodes say."""
        # The marks' tally catches up with the nodes that changed: a guess costs
        # the platforms, not a walk of every node.
        self._node_marks.catch_up(self.state.nodes)
        return effective_platform(spec.platform, self._marks.guess())

    @staticmethod
    def running_agents(
        namespace: str, ours: Mapping[ObjectKey, Mapping[str, Any]]
    ) -> dict[tuple[str, str], RunningAgent]:
        """This mesh's agent DaemonSets in `namespace` by (platform, component), as they run.

        `ours` is this mesh's objects (`ours()`, or its DaemonSets). Only the
        target namespace's: during a move the new agents have nothing to hold
        back, and the old ones are pruned, not rolled.
        """
        out: dict[tuple[str, str], RunningAgent] = {}
        for key, live in ours.items():
            if key[:3] != ("apps/v1", "DaemonSet", namespace):
                continue
            labels = live.get("metadata", {}).get("labels") or {}
            platform, component = labels.get(c.LABEL_PLATFORM), labels.get(c.LABEL_COMPONENT)
            if not platform or not component:
                continue
            settled, updating, progress = daemonset_settled(live)
            template = (live.get("spec") or {}).get("template") or {}
            annotations = (template.get("metadata") or {}).get("annotations") or {}
            out[(platform, component)] = RunningAgent(
                workload_image(live),
                settled,
                updating,
                progress,
                annotations.get(c.LABEL_REVISION) if component == ZTUNNEL else None,
            )
        return out

    def ours(self, owner: Owner) -> dict[ObjectKey, dict[str, Any]]:
        """This mesh's data-plane objects: our labels select them, its UID decides.

        Reads every object the operator keeps: a pass takes it once and hands it on.
        """
        return {
            key: obj
            for key, obj in self.state.owned_by(CONTROLLER).items()
            if conflict(obj, owner) is None
        }

    @staticmethod
    def agent_namespaces(ours: Mapping[ObjectKey, Mapping[str, Any]]) -> set[str]:
        """Namespaces holding objects of this mesh's data plane.

        This is how the operator knows where the agents run now, across
        restarts and whatever spec.namespace says: the namespaced objects the
        caches hold (watched by our labels) whose controller reference is this
        mesh. Any of these other than spec.namespace is a namespace being
        moved away from.
        """
        # Multus's attachment lives in its global namespace, wherever the agents are.
        return {key[2] for key in ours if key[2] and key[1] != NETWORK_ATTACHMENT.kind}

    async def namespace_refusal(
        self, namespace: str, ours: Mapping[ObjectKey, Mapping[str, Any]]
    ) -> tuple[MeshReason, str] | None:
        """(reason, message) when `namespace` cannot take the agents; None when it can.

        `ours`: this mesh's objects (`ours()`), which tell where the agents run.

        Refusing changes nothing: not a write, not a prune, not the cluster-
        scoped binding. The namespace is looked up in the cache (namespaces
        are watched) and, when not there, with one GET: a namespace created a
        moment ago may not have reached the watch.
        """
        where = sorted(self.agent_namespaces(ours))
        kept = f"the agents keep running in {', '.join(where)}" if where else "none was created"
        others = [name for name in where if name != namespace]
        back = f", or set spec.namespace back to {others[0]}" if len(others) == 1 else ""
        entry: Mapping[str, Any] | None = self.state.namespaces.get(namespace)
        if entry is None:
            try:
                entry = await asyncio.to_thread(self.kube.get, NAMESPACE, namespace)
            except KubeError as exc:
                return MeshReason.APPLY_FAILED, f"cannot read Namespace {namespace}: {exc.message}"
        if entry is None:
            return (
                MeshReason.NAMESPACE_NOT_FOUND,
                f"Namespace {namespace} (spec.namespace) does not exist; nothing was changed "
                f"and {kept}. Create the namespace{back}",
            )
        if entry.get("terminating") or (entry.get("metadata") or {}).get("deletionTimestamp"):
            return (
                MeshReason.NAMESPACE_NOT_FOUND,
                f"Namespace {namespace} (spec.namespace) is being deleted; nothing was changed "
                f"and {kept}. Choose another namespace{back}",
            )
        if self.agents_namespaces and namespace not in self.agents_namespaces:
            allowed = ", ".join(self.agents_namespaces)
            return (
                MeshReason.NAMESPACE_NOT_ALLOWED,
                f"spec.namespace {namespace} is not a namespace the operator may put the "
                f"agents in (only {allowed}); nothing was changed and {kept}. With the Helm "
                f"chart, add {namespace} to the value {CHART_NAMESPACES_VALUE} (which grants "
                "the operator a Role there, --agents-namespace), or set spec.namespace to "
                f"one of {allowed}",
            )
        return None

    def _taking_over(
        self, result: RenderResult, target: str, ours: Mapping[ObjectKey, Mapping[str, Any]]
    ) -> list[str]:
        """Why the agents in `target` cannot take over yet; empty when they can.

        Make-before-break where the agents can run twice on a node: ztunnel
        on the pod network is Ready beside the old one (the way its own
        surge rollout hands over). Agents on the host network (istio-cni, the
        Windows HostProcess agents) cannot: the new pods wait for the old
        ones' ports and CNI configuration, so they must be placed on every
        node (their pods created, the DaemonSet accepted by admission and the
        controller) and then they start as the old ones leave, like their own
        rollout without surge.
        """
        rendered = {
            obj["metadata"]["name"]: obj for obj in result.objects if obj["kind"] == "DaemonSet"
        }
        waiting = []
        for ds in result.daemonsets:
            live = ours.get(("apps/v1", "DaemonSet", target, ds.name))
            pod = ((rendered.get(ds.name) or {}).get("spec") or {}).get("template", {})
            rule = (
                daemonset_placed if (pod.get("spec") or {}).get("hostNetwork") else daemonset_ready
            )
            ok, why = rule(live, len(ds.nodes))
            if not ok:
                waiting.append(f"{ds.name}: {why}")
        return waiting
