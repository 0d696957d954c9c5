"""Which Kubernetes platform the cluster is, read from its Nodes.

Pure: Nodes in their API JSON form in, a guess with its evidence out.
`detect_platform` is the one reading, for the data-plane pass and for
`ambient-operator precheck` alike; `effective_platform` applies
spec.platform on top of it.

What each platform leaves on its Nodes (docs/platforms.md has the sources):
- OpenShift: `node.openshift.io/os_id` (rhcos, rhel, Windows) on every node,
  whatever cloud it runs on, so it is read before any cloud's marks.
- MicroK8s: `microk8s.io/cluster`; minikube: `minikube.k8s.io/*`.
- k3s: providerID `k3s://<node>` (its built-in cloud provider), or
  `node.kubernetes.io/instance-type=k3s`; k3d is k3s in containers of the
  rancher/k3s image, whose nodes report osImage `K3s v...` and are named
  `k3d-<cluster>-...`.
- kind: providerID `kind://<runtime>/<cluster>/<node>`.
- AKS: `kubernetes.azure.com/cluster`; EKS: `eks.amazonaws.com/*` labels,
  or a kubelet version like `v1.31.2-eks-7f9249a`; GKE: `cloud.google.com/gke-*`
  labels, or a kubelet version like `v1.31.5-gke.1023000`.
A bare cloud providerID (`azure://`, `aws://`, `gce://`) is Kubernetes on
that cloud's machines, not its managed service: noted, not a platform.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from ambient_operator.api.v1alpha1 import PLATFORM_AUTO, PlatformName

GENERIC = "generic"
PLATFORMS: tuple[str, ...] = get_args(PlatformName)
# status.platform.evidence keeps this many lines.
MAX_EVIDENCE = 8
# Cloud providerID schemes, the managed service they suggest, and the label
# that would have made it that service.
_CLOUD_SCHEMES = {
    "azure://": ("aks", "kubernetes.azure.com/cluster"),
    "aws://": ("eks", "eks.amazonaws.com/nodegroup"),
    "gce://": ("gke", "cloud.google.com/gke-nodepool"),
}


@dataclass(frozen=True)
class Clue:
    """What one Node says about the platform."""

    platform: str
    what: str


@dataclass(frozen=True)
class PlatformGuess:
    """What the Nodes say: a platform, the evidence, and whether they disagree."""

    platform: str
    evidence: tuple[str, ...]
    # Nodes pointed at more than one platform; `platform` is then generic.
    conflicting: bool = False


@dataclass(frozen=True)
class PlatformChoice:
    """The platform the agents are rendered for, and how it was decided."""

    name: str
    detected: str
    # "detected" when spec.platform is auto, else "spec".
    source: str
    evidence: tuple[str, ...]
    conflicting: bool = False


def _field(node: Mapping[str, Any], *path: str) -> Any:
    value: Any = node
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    raw = _field(node, "metadata", "labels")
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _label_with_prefix(labels: Mapping[str, str], prefix: str, best: str) -> str | None:
    """`best` when present (it names the platform's own grouping), else the first key."""
    if best in labels:
        return best
    keys = sorted(k for k in labels if k.startswith(prefix))
    return keys[0] if keys else None


def node_clue(node: Mapping[str, Any]) -> Clue | None:
    """The platform one Node points at, with the mark that says so; None without one.

    Distributions come before clouds: OpenShift on AWS carries an `aws://`
    providerID, and k3s on Azure machines still has its own. Never raises.
    """
    if not isinstance(node, Mapping):
        return None
    labels = _labels(node)
    provider = _text(_field(node, "spec", "providerID"))
    os_image = _text(_field(node, "status", "nodeInfo", "osImage"))
    kubelet = _text(_field(node, "status", "nodeInfo", "kubeletVersion"))
    name = _text(_field(node, "metadata", "name"))

    if "node.openshift.io/os_id" in labels:
        return Clue(
            "openshift", f"label node.openshift.io/os_id={labels['node.openshift.io/os_id']}"
        )
    if "microk8s.io/cluster" in labels:
        return Clue("microk8s", "label microk8s.io/cluster")
    key = _label_with_prefix(labels, "minikube.k8s.io/", "minikube.k8s.io/name")
    if key:
        return Clue("minikube", f"label {key}")
    k3s_type = labels.get("node.kubernetes.io/instance-type") == "k3s"
    if provider.startswith("k3s://") or k3s_type:
        mark = (
            f"providerID {provider}"
            if provider.startswith("k3s://")
            else ("label node.kubernetes.io/instance-type=k3s")
        )
        if os_image.startswith("K3s "):
            return Clue("k3d", f"{mark} and osImage {os_image!r} (k3s in a container)")
        if name.startswith("k3d-"):
            return Clue("k3d", f"{mark} and a k3d node name")
        return Clue("k3s", mark)
    if provider.startswith("kind://"):
        return Clue("kind", f"providerID {provider}")
    if "kubernetes.azure.com/cluster" in labels:
        return Clue("aks", "label kubernetes.azure.com/cluster")
    key = _label_with_prefix(labels, "eks.amazonaws.com/", "eks.amazonaws.com/nodegroup")
    if key:
        return Clue("eks", f"label {key}")
    if "-eks-" in kubelet:
        return Clue("eks", f"kubelet version {kubelet}")
    key = _label_with_prefix(labels, "cloud.google.com/gke-", "cloud.google.com/gke-nodepool")
    if key:
        return Clue("gke", f"label {key}")
    if "-gke." in kubelet:
        return Clue("gke", f"kubelet version {kubelet}")
    return None


@dataclass(frozen=True)
class NodeMark:
    """What platform detection reads of one Node: its name, clue and providerID."""

    name: str
    clue: Clue | None
    provider: str


def node_mark(node: Mapping[str, Any]) -> NodeMark | None:
    """One Node's mark for `guess_platform`; None when it is no object. Never raises."""
    if not isinstance(node, Mapping):
        return None
    return NodeMark(
        _text(_field(node, "metadata", "name")),
        node_clue(node),
        _text(_field(node, "spec", "providerID")),
    )


def _cloud_notes(schemes: Mapping[str, int]) -> list[str]:
    """Notes on unmarked nodes with a bare cloud's providerID, by their count per scheme."""
    notes = []
    for scheme, (managed, label) in _CLOUD_SCHEMES.items():
        count = schemes.get(scheme, 0)
        if count:
            notes.append(
                f"{count} node(s) with providerID {scheme} but no {label} label: Kubernetes "
                f"on that cloud's machines, not {managed}"
            )
    return notes


def _scheme(provider: str) -> str | None:
    return next((scheme for scheme in _CLOUD_SCHEMES if provider.startswith(scheme)), None)


def detect_platform(nodes: Iterable[Mapping[str, Any]]) -> PlatformGuess:
    """The platform the Nodes point at, with the evidence, most telling first.

    Nodes without any mark (a node whose providerID the cloud controller
    has not set yet, a virtual node) count for nothing either way. When the
    marked Nodes disagree, the guess is generic and `conflicting` is set:
    the Linux agents are one DaemonSet, so one platform's host paths would
    be wrong on the other platform's nodes, where istio-cni would install
    its plugin where the kubelet never looks and new pods would start
    outside the mesh; upstream's defaults plus a status that names the
    disagreement leave the choice to spec.platform.
    """
    return guess_platform([m for n in nodes if (m := node_mark(n)) is not None])


def guess_platform(marks: Iterable[NodeMark]) -> PlatformGuess:
    """`detect_platform` from the Nodes' marks (`node_mark`), which a caller may keep."""
    nodes = sorted(marks, key=lambda m: m.name)
    marked: dict[str, list[NodeMark]] = {}
    schemes: dict[str, int] = {}
    for mark in nodes:
        if mark.clue is not None:
            marked.setdefault(mark.clue.platform, []).append(mark)
        elif (scheme := _scheme(mark.provider)) is not None:
            schemes[scheme] = schemes.get(scheme, 0) + 1
    firsts = {p: (len(ms), ms[0].name, _what(ms[0])) for p, ms in marked.items()}
    return _guess(len(nodes), firsts, schemes)


class MarkTally:
    """What `guess_platform` reads of the marks, kept as each Node's mark changes.

    The data plane's pass guesses on every node event; a guess from every
    mark walked all 5,000 of them (see cluster/node_table.py for the cost).
    Names are unique here, as a cluster's Nodes' are.
    """

    def __init__(self) -> None:
        self._marks: dict[str, NodeMark] = {}
        # Names of the marked nodes by platform, in name order.
        self._marked: dict[str, list[str]] = {}
        # Unmarked nodes with a bare cloud's providerID, by scheme.
        self._schemes: dict[str, int] = {}
        self._guess: PlatformGuess | None = None

    def set(self, name: str, mark: NodeMark | None) -> None:
        """Node `name`'s mark now; None: the node went (or is no object)."""
        old = self._marks.pop(name, None)
        if old is not None:
            self._count(old, -1)
        if mark is not None:
            self._marks[name] = mark
            self._count(mark, 1)
        self._guess = None

    def _count(self, mark: NodeMark, step: int) -> None:
        if mark.clue is not None:
            names = self._marked.setdefault(mark.clue.platform, [])
            if step > 0:
                bisect.insort(names, mark.name)
            else:
                del names[bisect.bisect_left(names, mark.name)]
                if not names:
                    del self._marked[mark.clue.platform]
        elif (scheme := _scheme(mark.provider)) is not None:
            self._schemes[scheme] = self._schemes.get(scheme, 0) + step

    def guess(self) -> PlatformGuess:
        """`guess_platform` of the marks held."""
        if self._guess is None:
            marked = {
                p: (len(names), names[0], _what(self._marks[names[0]]))
                for p, names in self._marked.items()
            }
            self._guess = _guess(len(self._marks), marked, self._schemes)
        return self._guess


def _what(mark: NodeMark) -> str:
    # Only marked nodes are counted per platform, so the clue is there.
    return mark.clue.what if mark.clue is not None else ""


def _guess(
    total: int,
    marked: Mapping[str, tuple[int, str, str]],
    schemes: Mapping[str, int],
) -> PlatformGuess:
    """The guess and its evidence from `total` nodes: per platform, how many point at it,
    and the first by name with its clue; of the nodes pointing nowhere, how many per
    cloud scheme."""
    unmarked = total - sum(count for count, _, _ in marked.values())

    def line(platform: str) -> str:
        count, first, what = marked[platform]
        return f"{platform}: {count} of {total} node(s), e.g. {first}: {what}"

    order = sorted(marked, key=lambda p: (-marked[p][0], p))
    evidence = [line(p) for p in order]
    if unmarked and marked:
        evidence.append(f"{unmarked} node(s) carry no platform's providerID or labels")
    evidence += _cloud_notes(schemes)
    if not marked:
        if not total:
            evidence.insert(0, "no nodes yet")
        elif not evidence:
            evidence.append(f"none of {total} node(s) carries a platform's providerID or labels")
        return PlatformGuess(GENERIC, tuple(evidence[:MAX_EVIDENCE]))
    if len(marked) > 1:
        evidence.insert(
            0,
            f"nodes point at {len(marked)} platforms ({', '.join(order)}): rendering for "
            "generic; set spec.platform to the one whose paths the Linux nodes use",
        )
        return PlatformGuess(GENERIC, tuple(evidence[:MAX_EVIDENCE]), conflicting=True)
    return PlatformGuess(order[0], tuple(evidence[:MAX_EVIDENCE]))


def choice_warning(choice: PlatformChoice) -> str | None:
    """What the status must say about a choice: nodes that disagree, with nothing chosen."""
    if choice.conflicting and choice.source == "detected" and choice.evidence:
        return f"platform: {choice.evidence[0]}"
    return None


def effective_platform(requested: str, guess: PlatformGuess) -> PlatformChoice:
    """spec.platform when it names one, else what detection found."""
    if requested == PLATFORM_AUTO:
        return PlatformChoice(
            guess.platform, guess.platform, "detected", guess.evidence, guess.conflicting
        )
    return PlatformChoice(requested, guess.platform, "spec", guess.evidence, guess.conflicting)
