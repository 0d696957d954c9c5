"""Which pods the ambient data plane is meant to redirect, and whether it does.

Rules from istio.io: a pod is enrolled when its own `istio.io/dataplane-mode`
is `ambient`, or its namespace's is and the pod's is not `none`; a pod with a
sidecar is not redirected by ztunnel (sidecar wins); host-network pods never
are. istio-cni reports the result in `ambient.istio.io/redirection`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import NamespaceEvent
from ambient_operator.api.v1alpha1 import Enrollment, PodCounts


class PodSummary(Protocol):
    """What these rules read of a pod (cluster/state.py's PodSummary, which imports this)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def mode(self) -> str | None: ...
    @property
    def sidecar(self) -> bool: ...
    @property
    def host_network(self) -> bool: ...
    @property
    def os(self) -> str | None: ...
    @property
    def node(self) -> str | None: ...
    @property
    def redirection(self) -> str | None: ...
    @property
    def phase(self) -> str | None: ...


PodKey = tuple[str, str]
# How one pod counts: (OS, redirection state), or None when it is not counted.
Counted = tuple[str, str] | None

VALID_MODES = ("ambient", "none")
SIDECAR_NAMESPACE_LABELS = ("istio-injection", "istio.io/rev")
MAX_EXAMPLES = 5


def namespace_enrolled(labels: Mapping[str, str]) -> bool:
    """The namespace asks for ambient."""
    return labels.get(c.LABEL_DATAPLANE_MODE) == "ambient"


def namespace_sidecar(labels: Mapping[str, str]) -> bool:
    """The namespace asks for sidecar injection."""
    return labels.get("istio-injection") == "enabled" or "istio.io/rev" in labels


def pod_enrolled(pod: PodSummary, namespace_labels: Mapping[str, str]) -> bool:
    """Whether ztunnel is meant to redirect this pod."""
    if pod.host_network or pod.sidecar:
        return False
    if pod.mode == "ambient":
        return True
    return namespace_enrolled(namespace_labels) and pod.mode != "none"


def pod_os(pod: PodSummary, node_os: Mapping[str, str]) -> str:
    """'windows' or 'linux' (the default of Kubernetes itself)."""
    if pod.os:
        return pod.os
    if pod.node and pod.node in node_os:
        return node_os[pod.node]
    return "linux"


def redirection_state(pod: PodSummary) -> str:
    """enabled, pending or missing."""
    if pod.redirection == "enabled":
        return "enabled"
    if pod.redirection == "pending":
        return "pending"
    return "missing"


def counted(
    pod: PodSummary, namespace_labels: Mapping[str, str], node_os: Mapping[str, str]
) -> Counted:
    """How one pod counts in the enrollment totals: (OS, redirection state), or None.

    The one rule of `summarize` and of `EnrollmentTally`: finished pods and
    pods not enrolled are not counted.
    """
    if pod.phase in ("Succeeded", "Failed"):
        return None
    if not pod_enrolled(pod, namespace_labels):
        return None
    os_name = "windows" if pod_os(pod, node_os) == "windows" else "linux"
    return os_name, redirection_state(pod)


def _enrollment(
    counts: Mapping[Counted, int],
    examples: list[str],
    namespaces: int,
    misses: int,
    image_unavailable: int = 0,
) -> Enrollment:
    def of(os_name: str) -> PodCounts:
        states = ("enabled", "pending", "missing")
        return PodCounts(**{state: counts.get((os_name, state), 0) for state in states})

    return Enrollment(
        namespaces=namespaces,
        linux_pods=of("linux"),
        windows_pods=of("windows"),
        example_pending_pods=examples,
        workaround_misses=misses,
        workaround_image_unavailable=image_unavailable,
    )


def summarize(
    pods: Iterable[PodSummary],
    namespaces: Mapping[str, Mapping[str, Any]],
    node_os: Mapping[str, str],
    workaround_misses: int = 0,
) -> Enrollment:
    """Bounded totals of enrolled pods by OS and redirection state."""
    counts: dict[Counted, int] = {}
    examples: list[str] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        labels = (namespaces.get(pod.namespace) or {}).get("labels") or {}
        how = counted(pod, labels, node_os)
        if how is None:
            continue
        counts[how] = counts.get(how, 0) + 1
        if how[1] != "enabled" and len(examples) < MAX_EXAMPLES:
            examples.append(f"{pod.namespace}/{pod.name}")
    enrolled_namespaces = sum(
        1 for ns in namespaces.values() if namespace_enrolled(ns.get("labels") or {})
    )
    return _enrollment(counts, examples, enrolled_namespaces, workaround_misses)


class EnrollmentTally:
    """`summarize`'s answer kept up to date change by change, in work per change.

    Told each pod change, each namespace's labels and each node's OS, it
    keeps every pod's `counted` and the totals; a namespace's label change
    counts its own pods again, a node's OS change the pods on it. The
    examples are the first MAX_EXAMPLES uncounted-as-enabled pods in name
    order, kept until one of them goes or a pod sorts before the last.
    """

    def __init__(self) -> None:
        self._pods: dict[PodKey, PodSummary] = {}
        self._counted: dict[PodKey, Counted] = {}
        self._by_namespace: dict[str, set[PodKey]] = {}
        self._by_node: dict[str, set[PodKey]] = {}
        self._labels: dict[str, Mapping[str, str]] = {}
        self._node_os: dict[str, str] = {}
        self._nodes_by_os: dict[str, int] = {}
        self._enrolled_namespaces: set[str] = set()
        self._counts: dict[Counted, int] = {}
        # Enrolled Windows pods by node (microsoft/hcsshim#2571's per-node limit), and
        # the node each was counted on.
        self._windows_on: dict[str, int] = {}
        self._counted_on: dict[PodKey, str] = {}
        # Enrolled pods not redirected (yet), and the first of them in name order.
        self._pending: set[PodKey] = set()
        self._examples: list[PodKey] | None = []
        # Pods counted again, for tests that count the work.
        self.recounted = 0

    def pod(self, key: PodKey, pod: PodSummary | None) -> None:
        """A pod was listed, changed (its new summary) or deleted (None)."""
        old = self._pods.get(key)
        if old is not None:
            self._index(self._by_namespace, old.namespace, key, add=False)
            if old.node:
                self._index(self._by_node, old.node, key, add=False)
        if pod is None:
            self._pods.pop(key, None)
            self._set(key, None)
            return
        self._pods[key] = pod
        self._index(self._by_namespace, pod.namespace, key, add=True)
        if pod.node:
            self._index(self._by_node, pod.node, key, add=True)
        self._recount(key)

    def namespace(self, name: str, labels: Mapping[str, str] | None) -> None:
        """A namespace's labels (None: it is gone); its pods are counted again when they changed."""
        if labels is None:
            self._labels.pop(name, None)
            self._enrolled_namespaces.discard(name)
        else:
            if self._labels.get(name) == labels:
                return
            self._labels[name] = dict(labels)
            if namespace_enrolled(labels):
                self._enrolled_namespaces.add(name)
            else:
                self._enrolled_namespaces.discard(name)
        for key in self._by_namespace.get(name, ()):
            self._recount(key)

    def node(self, name: str, os_name: str | None) -> None:
        """A node's OS as enrollment reads it (None: the node is gone)."""
        was = self._node_os.get(name)
        if was == os_name:
            return
        if was is not None:
            self._nodes_by_os[was] -= 1
        if os_name is None:
            del self._node_os[name]
        else:
            self._node_os[name] = os_name
            self._nodes_by_os[os_name] = self._nodes_by_os.get(os_name, 0) + 1
        for key in self._by_node.get(name, ()):
            self._recount(key)

    def nodes_of(self, os_name: str) -> int:
        """How many nodes run `os_name` as enrollment reads it, without walking the nodes: the
        waypoints ask on every pass whether there is a Windows node at all."""
        return self._nodes_by_os.get(os_name, 0)

    def enrollment(self, workaround_misses: int = 0, image_unavailable: int = 0) -> Enrollment:
        """What `summarize` says of the pods, namespaces and nodes told so far; the webhook's
        misses, and those of them for want of an image, as counted by webhook/misses.py."""
        if self._examples is None:
            self._examples = heapq.nsmallest(MAX_EXAMPLES, self._pending)
        examples = [f"{ns}/{name}" for ns, name in self._examples]
        return _enrollment(
            self._counts,
            examples,
            len(self._enrolled_namespaces),
            workaround_misses,
            image_unavailable,
        )

    def _count_node(self, node: str | None, how: Counted, delta: int) -> None:
        if not node or how is None or how[0] != "windows":
            return
        count = self._windows_on.get(node, 0) + delta
        if count:
            self._windows_on[node] = count
        else:
            self._windows_on.pop(node, None)

    @staticmethod
    def _index(index: dict[str, set[PodKey]], at: str, key: PodKey, *, add: bool) -> None:
        if add:
            index.setdefault(at, set()).add(key)
            return
        keys = index.get(at)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[at]

    def _recount(self, key: PodKey) -> None:
        self.recounted += 1
        pod = self._pods[key]
        self._set(key, counted(pod, self._labels.get(pod.namespace) or {}, self._node_os))

    def windows_pods_by_node(self) -> dict[str, int]:
        """Enrolled Windows pods per node they are scheduled on, in any redirection state."""
        return dict(self._windows_on)

    def _set(self, key: PodKey, how: Counted) -> None:
        old = self._counted.pop(key, None)
        if old is not None:
            self._counts[old] -= 1
            self._count_node(self._counted_on.pop(key, None), old, -1)
        if how is not None:
            self._counted[key] = how
            self._counts[how] = self._counts.get(how, 0) + 1
            pod = self._pods.get(key)
            node = pod.node if pod is not None else None
            if node and how[0] == "windows":
                self._counted_on[key] = node
            self._count_node(node, how, 1)
        pending = how is not None and how[1] != "enabled"
        if pending == (key in self._pending):
            return
        examples = self._examples
        if pending:
            self._pending.add(key)
            # Only a pod that sorts among the first ones changes the examples.
            if examples is not None and (len(examples) < MAX_EXAMPLES or key < examples[-1]):
                self._examples = None
        else:
            self._pending.discard(key)
            if examples is not None and key in examples:
                self._examples = None


# Values people give istio.io/use-waypoint when they read it as a switch; it
# takes a Gateway's name (or `none`), and no waypoint is ever named these.
SWITCH_ON = frozenset({"true", "yes", "on", "enabled", "enable", "1"})
SWITCH_OFF = frozenset({"false", "no", "off", "disabled", "disable", "0"})


def _squashed(key: str) -> str:
    """A label key without case, separators or an Istio prefix: what a near miss shares.

    `data-plane-mode`, `istio.io/data-plane-mode`, `istio.io/dataPlaneMode`
    and `Istio.io/dataplane-mode` all squash to `dataplanemode`; a key of
    another project's prefix (`example.com/dataplane-mode`) does not.
    """
    flat = "".join(ch for ch in key.lower() if ch not in "-_./")
    for prefix in ("istioio", "istio"):
        if flat.startswith(prefix):
            return flat[len(prefix) :]
    return flat


_DATAPLANE_MODE = _squashed(c.LABEL_DATAPLANE_MODE)
_USE_WAYPOINT = _squashed(c.LABEL_USE_WAYPOINT)


def near_misses(labels: Mapping[str, str], right: str) -> list[str]:
    """Keys of `labels` that look like the label key `right` but are not it, sorted."""
    squashed = _squashed(right)
    return sorted(key for key in labels if key != right and _squashed(key) == squashed)


def carries_ambient_labels(labels: Mapping[str, str]) -> bool:
    """The labels hold an ambient key, right or nearly: worth judging."""
    return any(_squashed(key) in (_DATAPLANE_MODE, _USE_WAYPOINT) for key in labels)


def namespace_problems(
    name: str,
    labels: Mapping[str, str],
    waypoint_exists: Mapping[tuple[str, str], bool],
    *,
    enrollment: bool = False,
) -> list[tuple[NamespaceEvent, str]]:
    """(reason, message) for each thing wrong with a namespace's ambient labels.

    `waypoint_exists` maps each Gateway's (namespace, name) to whether it is a
    waypoint. The same labels on a Service are judged too (`istio.io/use-waypoint`
    works on both); `enrollment=True` says the labels are a Namespace's, where a
    misspelt `istio.io/dataplane-mode` or a missing one leaves its pods out of
    the mesh, which a Service's labels never decide. Root causes come first.
    """
    problems: list[tuple[NamespaceEvent, str]] = []
    mode = labels.get(c.LABEL_DATAPLANE_MODE)
    # Only while the right key is absent: beside it, a stray key changes nothing.
    misspelt_mode = near_misses(labels, c.LABEL_DATAPLANE_MODE) if mode is None else []
    if enrollment:
        for key in misspelt_mode:
            value = labels[key]
            fix = value if value in VALID_MODES else "ambient"
            problems.append(
                (
                    NamespaceEvent.MISSPELLED_DATAPLANE_MODE,
                    f"{key}={value} is not a label Istio reads; the key is "
                    f"{c.LABEL_DATAPLANE_MODE}. This namespace is not enrolled in ambient and "
                    f"ztunnel does not redirect its pods: kubectl label namespace {name} "
                    f"{c.LABEL_DATAPLANE_MODE}={fix}",
                )
            )
    if mode is not None and mode not in VALID_MODES:
        problems.append(
            (
                NamespaceEvent.INVALID_DATAPLANE_MODE,
                f"{c.LABEL_DATAPLANE_MODE}={mode!r} is not valid; use 'ambient' or 'none'. "
                "Pods in this namespace are not enrolled.",
            )
        )
    if mode == "ambient" and namespace_sidecar(labels):
        problems.append(
            (
                NamespaceEvent.SIDECAR_AND_AMBIENT,
                "sidecar injection is also enabled on this namespace; injected pods keep "
                "their sidecar and are not redirected by ztunnel (sidecar wins)",
            )
        )
    waypoint = labels.get(c.LABEL_USE_WAYPOINT)
    if waypoint is None:
        for key in near_misses(labels, c.LABEL_USE_WAYPOINT):
            value = labels[key]
            switch = value.lower() in SWITCH_ON | SWITCH_OFF
            fix = "<name of a waypoint Gateway>" if switch else value
            takes = f", and it takes a waypoint Gateway's name, not {value}" if switch else ""
            problems.append(
                (
                    NamespaceEvent.MISSPELLED_USE_WAYPOINT,
                    f"{key}={value} is not a label Istio reads; the key is "
                    f"{c.LABEL_USE_WAYPOINT}{takes}. No waypoint is used: set "
                    f"{c.LABEL_USE_WAYPOINT}={fix}",
                )
            )
    if not waypoint or waypoint == "none":
        return problems
    # Said once: a misspelt or invalid dataplane-mode above already tells that
    # the namespace is not enrolled, and how to enroll it.
    if enrollment and mode in (None, "none") and not misspelt_mode:
        why = "no" if mode is None else f"{c.LABEL_DATAPLANE_MODE}=none, not"
        problems.append(
            (
                NamespaceEvent.WAYPOINT_WITHOUT_AMBIENT,
                f"{c.LABEL_USE_WAYPOINT}={waypoint} has no effect on this namespace's pods: "
                f"the namespace is not enrolled in ambient ({why} "
                f"{c.LABEL_DATAPLANE_MODE}=ambient), so ztunnel does not redirect their "
                "traffic; only pods labelled for ambient themselves use the waypoint. "
                f"Label the namespace {c.LABEL_DATAPLANE_MODE}=ambient",
            )
        )
    target_ns = labels.get(c.LABEL_USE_WAYPOINT_NAMESPACE) or name
    found = waypoint_exists.get((target_ns, waypoint))
    if found is None and waypoint.lower() in SWITCH_ON | SWITCH_OFF:
        if waypoint.lower() in SWITCH_OFF:
            fix = "to use no waypoint, set it to none"
        else:
            there = sorted(gw for (ns, gw), ok in waypoint_exists.items() if ns == target_ns and ok)
            fix = (
                f"waypoints in {target_ns}: {', '.join(there)}"
                if there
                else f"{target_ns} has no waypoint yet (ambient-operator waypoint apply -n "
                f"{target_ns} makes one named waypoint)"
            )
        problems.append(
            (
                NamespaceEvent.WAYPOINT_NAME_EXPECTED,
                f"{c.LABEL_USE_WAYPOINT} takes the name of a waypoint Gateway, not "
                f"{waypoint}: no Gateway {target_ns}/{waypoint} exists, so traffic skips any "
                f"waypoint; {fix}",
            )
        )
    elif found is None:
        problems.append(
            (
                NamespaceEvent.WAYPOINT_NOT_FOUND,
                f"{c.LABEL_USE_WAYPOINT}={waypoint} names Gateway {target_ns}/{waypoint}, "
                "which does not exist; traffic skips the waypoint",
            )
        )
    elif not found:
        problems.append(
            (
                NamespaceEvent.NOT_A_WAYPOINT,
                f"{c.LABEL_USE_WAYPOINT}={waypoint} names Gateway {target_ns}/{waypoint}, "
                "which is not a waypoint (no HBONE listener on 15008); traffic skips it",
            )
        )
    return problems
