"""What the operator knows of the cluster, kept current by watch events.

Handlers only put what they see here and pull the trigger; the reconcile
loop reads it. Pods are kept as small summaries, not whole objects, so
memory stays flat with thousands of them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.constants import LABEL_CONTROLLER
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.enrollment import EnrollmentTally
from ambient_operator.cluster.node_table import NodeTable
from ambient_operator.kube.resources import ObjectKey, key_of, resource_version

SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
SIDECAR_INJECT_LABEL = "sidecar.istio.io/inject"
# A key keyed again within this long of its last keyed change is folded by
# the loop's spacing like other changes (ClusterState.poke); the same span as
# runtime/pacing.py's IDLE_AFTER_SECONDS, after which any urgent change goes.
KEY_QUIET_SECONDS = 2.0
# How many keys' times are kept before those older than the quiet span are dropped.
KEYS_KEPT = 1024
# The agents' component labels, mapped to one shared string per agent.
AGENTS = {"ztunnel": "ztunnel", "istio-cni": "istio-cni"}


@dataclass(frozen=True)
class PodSummary:
    """The few facts of a pod that enrollment and node readiness gating need."""

    namespace: str
    name: str
    mode: str | None  # its own istio.io/dataplane-mode label
    sidecar: bool
    host_network: bool
    os: str | None  # from spec.os.name or nodeSelector; else the node decides
    node: str | None
    redirection: str | None
    phase: str | None
    # Only for our agents' pods (node readiness gating); other pods keep None
    # and False, so their readiness flapping changes no summary.
    agent: str | None = None  # "ztunnel" or "istio-cni"
    ready: bool = False  # Ready, and not terminating

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodSummary:
        """Summarise a Pod object."""
        meta = pod.get("metadata", {})
        spec = pod.get("spec", {})
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        os_name = (spec.get("os") or {}).get("name") or (spec.get("nodeSelector") or {}).get(
            c.LABEL_OS
        )
        ours = labels.get(c.LABEL_MANAGED_BY) == c.MANAGED_BY
        agent = AGENTS.get(labels.get(c.LABEL_COMPONENT, "")) if ours else None
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            mode=labels.get(c.LABEL_DATAPLANE_MODE),
            sidecar=SIDECAR_STATUS_ANNOTATION in annotations
            or labels.get(SIDECAR_INJECT_LABEL) == "true",
            host_network=bool(spec.get("hostNetwork")),
            os=os_name,
            node=spec.get("nodeName"),
            redirection=annotations.get(c.ANNOTATION_REDIRECTION),
            phase=(pod.get("status") or {}).get("phase"),
            agent=agent,
            ready=agent is not None and not meta.get("deletionTimestamp") and _ready(pod),
        )


def _ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (what kubelet and the DaemonSet controller count)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


@dataclass
class ClusterState:
    """Caches fed by watches, and the trigger of the data-plane reconcile."""

    mesh: dict[str, Any] | None = None
    # The AmbientMesh CRD as the API server serves it (status/schema.py reads it).
    mesh_crd: dict[str, Any] | None = None
    # A NodeTable: a node pass catches up with the Nodes that changed alone.
    nodes: dict[str, dict[str, Any]] = field(default_factory=NodeTable)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    owned: dict[ObjectKey, dict[str, Any]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodSummary] = field(default_factory=dict)
    gateways: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # istiod's revision tags: MutatingWebhookConfigurations istio-revision-tag-*
    # by name, their metadata only (cluster/revisions.py reads the labels).
    revision_tags: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The enrollment totals, told every pod, namespace and node change by the
    # functions that keep the caches above (cluster/pods.py, cluster/watches.py).
    tally: EnrollmentTally = field(default_factory=EnrollmentTally)
    trigger: asyncio.Event = field(default_factory=asyncio.Event)
    # Whether a pending change can alter what we write (a node, the spec, one
    # of our objects) rather than only what status reports (pods, rollouts).
    urgent: bool = False
    # What the pokes said since the data plane's last full pass: True once any
    # change but status news came (status=False), or a resync is due. The data
    # plane clears it when it starts a full pass; while it stays False, a
    # status-only pass answers (controllers/dataplane.py). True at start.
    full_pass_due: bool = True
    # Namespaces changed since the namespace checks last ran (controllers/
    # namespaces.py), and Gateways whose spec or labels changed or that went
    # (namespaces naming them as their waypoint are checked again); None:
    # check every namespace (at start and on resync).
    changed_namespaces: set[str] | None = None
    changed_gateways: set[tuple[str, str]] = field(default_factory=set)
    # Counts the changes of what status.revisions reads (istiod's Deployments,
    # revision tags, Gateways, namespaces' istio.io/rev): equal counts, equal
    # revisions (controllers/dataplane.py keeps the last answer).
    revision_changes: int = 0
    # Whether a pending change is keyed (runtime/pacing.py): news a user waits
    # for about one key, a namespace's labels or a node's platform, which goes
    # at once however busy the loop. The loop's Trigger reads it and clears it.
    keyed: bool = False
    # When each key was last keyed (time.monotonic()), while within KEY_QUIET_SECONDS.
    keyed_at: dict[str, float] = field(default_factory=dict)
    # spec.namespace when the data plane refused it in its last pass (missing,
    # being deleted, or not granted to the operator): nothing may be written
    # there, istiod's waypoint class defaults included. None when accepted.
    refused_namespace: str | None = None

    # The event loop the reconcile runs on, set at start-up. asyncio.Event is not
    # thread-safe: a poke from another thread (code run by asyncio.to_thread)
    # is handed to the loop, or the loop might not wake up until other I/O does.
    loop: asyncio.AbstractEventLoop | None = None

    def poke(self, urgent: bool = True, *, status: bool = False, key: str | None = None) -> None:
        """Ask the reconcile loop to run: soon when urgent, else within seconds.

        `status` says the change is status news only (a pod, one of our
        objects' status, the webhook's miss count), which a status-only pass
        of the data plane answers; any other change makes the next pass full.
        `key` names what changed when a user waits for it (`namespace/<name>`,
        `platform/<os>/<build>`): the pass goes at once, however busy the
        loop, unless the same key went so within KEY_QUIET_SECONDS.
        """
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                poke = functools.partial(self.poke, urgent, status=status, key=key)
                loop.call_soon_threadsafe(poke)
                return
        self.urgent = self.urgent or urgent
        self.full_pass_due = self.full_pass_due or not status
        if key is not None and self.key_goes_now(key, time.monotonic()):
            self.keyed = True
        self.trigger.set()

    def key_goes_now(self, key: str, now: float) -> bool:
        """Whether a change of `key` is keyed: not when the key was, less than
        KEY_QUIET_SECONDS ago. A burst on one key (200 nodes joining one
        platform, a label flipped back and forth) is then folded by the loop's
        spacing, as before keys; another key still goes at once."""
        last = self.keyed_at.get(key)
        if last is not None and now - last < KEY_QUIET_SECONDS:
            return False
        if len(self.keyed_at) >= KEYS_KEPT:
            # Only keys within the quiet time matter: the rest are forgotten.
            self.keyed_at = {k: t for k, t in self.keyed_at.items() if now - t < KEY_QUIET_SECONDS}
        self.keyed_at[key] = now
        return True

    def namespace_read_by_writes(self, name: str) -> bool:
        """Whether a change of namespace `name` needs a full data-plane pass.

        It does when the namespace is spec.namespace (its entry decides
        whether the agents may be written there at all: missing, being
        deleted, refused), or holds objects of ours (the agents a move
        leaves behind, which are pruned only in a namespace that can take
        the deletes). Render reads no namespace; enrollment is tallied and
        status.revisions counts its own inputs, so for any other namespace
        a status-only pass is the whole answer.
        """
        spec = (self.mesh or {}).get("spec") or {}
        target = spec.get("namespace") or AmbientMeshSpec.model_fields["namespace"].default
        if name in (target, self.refused_namespace):
            return True
        return any(key[2] == name for key in self.owned)

    def resync(self) -> None:
        """The periodic resync is due: a full pass, and every namespace checked."""
        self.changed_namespaces = None
        self.poke(urgent=False)

    def namespace_changed(self, name: str) -> None:
        """Record that a namespace changed (or went) for the namespace checks."""
        if self.changed_namespaces is not None:
            self.changed_namespaces.add(name)

    def gateway_changed(self, key: tuple[str, str]) -> None:
        """A Gateway's spec or labels changed, or it went: checks and revisions read it.

        Render reads no Gateway: the namespace checks and status.revisions,
        which every pass runs, are all it changes, so a status-only pass
        answers it, at once (urgent: the checks are news a user waits for).
        """
        self.changed_gateways.add(key)
        self.revision_changes += 1
        self.poke(status=True)

    def owned_by(self, controller: str) -> dict[ObjectKey, dict[str, Any]]:
        """The prune set of one controller."""
        return {
            key: obj
            for key, obj in self.owned.items()
            if (obj.get("metadata", {}).get("labels") or {}).get(LABEL_CONTROLLER) == controller
        }

    def remember_owned(self, obj: dict[str, Any], deleted: bool = False) -> bool:
        """Record a live object of ours (from a watch or a write response).

        Never older over newer: a write's response can reach us after the
        watch event of a later change (a DaemonSet controller's status
        update, say), and a late watch event after a write's response. The
        older one would stay until the object changes again: a rollout
        that looks unobserved, or a stale resourceVersion for the next
        write. False when `obj` was older than what we hold.
        """
        key = key_of(obj)
        if deleted:
            self.owned.pop(key, None)
            return True
        held = self.owned.get(key)
        if held is not None and resource_version(held) > resource_version(obj):
            return False
        self.owned[key] = obj
        return True
