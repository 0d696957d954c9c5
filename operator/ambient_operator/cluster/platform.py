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


def _cloud_notes(unmarked: list[NodeMark]) -> list[str]:
    notes = []
    for scheme, (managed, label) in _CLOUD_SCHEMES.items():
        count = sum(1 for n in unmarked if n.provider.startswith(scheme))
        if count:
            notes.append(
                f"{count} node(s) with providerID {scheme} but no {label} label: Kubernetes "
                f"on that cloud's machines, not {managed}"
            )
    return notes


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
    by_platform: dict[str, list[tuple[str, Clue]]] = {}
    unmarked: list[NodeMark] = []
    for mark in nodes:
        if mark.clue is None:
            unmarked.append(mark)
        else:
            by_platform.setdefault(mark.clue.platform, []).append((mark.name, mark.clue))

    def line(platform: str) -> str:
        marked = by_platform[platform]
        name, clue = marked[0]
        return f"{platform}: {len(marked)} of {len(nodes)} node(s), e.g. {name}: {clue.what}"

    order = sorted(by_platform, key=lambda p: (-len(by_platform[p]), p))
    evidence = [line(p) for p in order]
    if unmarked and by_platform:
        evidence.append(f"{len(unmarked)} node(s) carry no platform's providerID or labels")
    evidence += _cloud_notes(unmarked)
    if not by_platform:
        if not nodes:
            evidence.insert(0, "no nodes yet")
        elif not evidence:
            evidence.append(
                f"none of {len(nodes)} node(s) carries a platform's providerID or labels"
            )
        return PlatformGuess(GENERIC, tuple(evidence[:MAX_EVIDENCE]))
    if len(by_platform) > 1:
        evidence.insert(
            0,
            f"nodes point at {len(by_platform)} platforms ({', '.join(order)}): rendering for "
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
