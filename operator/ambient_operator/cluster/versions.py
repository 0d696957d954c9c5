"""Istio versions as the cluster shows them, and Istio's support rule between them.

Pure functions of API objects and strings. `istiod_version` reads the
version of a live istiod from its Deployment; `skew_problem` applies
Istio's rule between the control plane and the node agents. Both are
public names other commands (`precheck`) call; keep them stable.

What a live istiod reveals of its version, best evidence first:

1. the tag of its `discovery` container's image (what actually runs):
   upstream's chart builds it as `<hub>/pilot:<tag>[-<variant>]`;
2. `operator.istio.io/version`, which `istioctl install` puts on what it
   installs (the istioctl's own version, which picks the images);
3. `app.kubernetes.io/version`, the chart's appVersion (Helm installs),
   except `1.0.0`, the placeholder of charts built from Istio's source
   (their Chart.yaml says release-builder replaces it).

`istio.io/rev` names a revision, which by convention only looks like a
version (`1-30-4`, as often `canary`): it is never read as one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Upstream's istiod chart names istiod's container this.
ISTIOD_CONTAINER = "discovery"
LABEL_ISTIOCTL_VERSION = "operator.istio.io/version"
LABEL_APP_VERSION = "app.kubernetes.io/version"
# appVersion of charts that were never released (Istio's source tree).
UNRELEASED_CHART_VERSION = "1.0.0"

# 1.30.4, v1.30.4, 1.31 (a development line), then anything after a '-' or
# '+': a variant (-distroless), a pre-release (-alpha.<commit>, -beta.1,
# -rc.0) or a vendor's suffix (-solo, -fips).
_VERSION = re.compile(r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:\.(0|[1-9][0-9]*))?(?:[-+_](.+))?$")
# A digest ends a reference; a tag is the text after the last ':' of the last
# path component (a registry's port is before a '/').
_DIGEST = re.compile(r"@[A-Za-z0-9_+.-]+:[A-Fa-f0-9]+$")


@dataclass(frozen=True)
class Version:
    """An Istio version: major.minor, the patch when known, and any suffix of the tag."""

    major: int
    minor: int
    patch: int | None = None
    suffix: str | None = None

    @property
    def line(self) -> tuple[int, int]:
        """(major, minor): the release line Istio's support rule is stated in."""
        return self.major, self.minor

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}"
        if self.patch is not None:
            text += f".{self.patch}"
        return f"{text}-{self.suffix}" if self.suffix else text

    @property
    def line_name(self) -> str:
        """`1.30`: the line, for messages."""
        return f"{self.major}.{self.minor}"

    def older_than(self, other: Version) -> bool:
        """Whether this is an earlier release than `other` (an unknown patch counts as 0)."""
        return (*self.line, self.patch or 0) < (*other.line, other.patch or 0)


def parse_version(text: str | None) -> Version | None:
    """The version a tag or label value names (`1.30.4-distroless` is 1.30.4); None if none."""
    if not text:
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch, suffix = match.groups()
    return Version(int(major), int(minor), None if patch is None else int(patch), suffix)


def image_tag(image: str | None) -> str | None:
    """The tag of an image reference (`docker.io/istio/pilot:1.30.4@sha256:...` -> 1.30.4)."""
    if not image:
        return None
    ref = _DIGEST.sub("", image.strip())
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    return last.rsplit(":", 1)[1] or None


def image_version(image: str | None) -> Version | None:
    """The Istio version an image's tag names; None for `latest`, digests alone, and the like."""
    return parse_version(image_tag(image))


def _containers(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = workload.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    pod = template.get("spec") if isinstance(template, Mapping) else None
    containers = pod.get("containers") if isinstance(pod, Mapping) else None
    if not isinstance(containers, list):
        return []
    return [c for c in containers if isinstance(c, Mapping)]


def workload_image(workload: Mapping[str, Any] | None, container: str | None = None) -> str | None:
    """The image of a Deployment's or DaemonSet's container (`container`, else its first)."""
    if not isinstance(workload, Mapping):
        return None
    containers = _containers(workload)
    chosen = next((c for c in containers if c.get("name") == container), None)
    if chosen is None and containers:
        chosen = containers[0]
    image = (chosen or {}).get("image")
    return image if isinstance(image, str) and image else None


def istiod_version(deployment: Mapping[str, Any] | None) -> Version | None:
    """The Istio version of the istiod a Deployment runs; None when nothing tells it.

    Never raises: a malformed Deployment tells no version. The evidence and
    its order are in this module's docstring.
    """
    if not isinstance(deployment, Mapping):
        return None
    found = image_version(workload_image(deployment, ISTIOD_CONTAINER))
    if found is not None:
        return found
    meta = deployment.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return None
    for key in (LABEL_ISTIOCTL_VERSION, LABEL_APP_VERSION):
        value = labels.get(key)
        if isinstance(value, str) and value != UNRELEASED_CHART_VERSION:
            found = parse_version(value)
            if found is not None:
                return found
    return None


SAFE_ORDER = "istiod first, then istio-cni and ztunnel, never more than one minor apart"


def skew_problem(control_plane: Version, data_plane: Version) -> str | None:
    """What breaks Istio's support rule between istiod and a node agent's version; None if fine.

    The rule (Istio's ambient upgrade guide): ztunnel and istio-cni at 1.x
    work with istiod at 1.x and 1.x+1. So the control plane may be at most
    one minor ahead of the agents, and the agents never ahead of it. Patch
    releases and tag suffixes do not count: the rule is stated in minors.
    """
    cp, dp = control_plane, data_plane
    if cp.major != dp.major:
        return (
            f"istiod {cp} and the agents' {dp} are of different major versions, which Istio "
            f"does not support together; upgrade {SAFE_ORDER}"
        )
    if dp.minor > cp.minor:
        return (
            f"the agents' {dp} is newer than istiod {cp}; the data plane must never be newer "
            f"than the control plane: upgrade istiod to {dp.line_name} first, or set the agents "
            f"back to {cp.line_name} or older (the safe order is {SAFE_ORDER})"
        )
    behind = cp.minor - dp.minor
    if behind > 1:
        return (
            f"istiod {cp} is {behind} minors ahead of the agents' {dp}; it may be at most one "
            f"ahead: upgrade the agents to {cp.major}.{cp.minor - 1} or later (the safe order "
            f"is {SAFE_ORDER})"
        )
    return None


@dataclass(frozen=True)
class RunningAgent:
    """One of our agent DaemonSets as it runs now, for the rollout order.

    `settled`: the controller saw its latest spec and every pod is updated
    and available. `updating`: some pods still run an older template (or
    the controller has not seen the latest yet): a rollout is under way.
    """

    image: str | None
    settled: bool
    updating: bool
    progress: str = ""
    # ztunnel's istiod revision (its pod template's istio.io/rev; None: the
    # Service istiod). istio-cni serves every revision and says none.
    revision: str | None = None


# Image variants a tag may carry: not part of the version the agents follow.
VARIANTS = frozenset({"distroless", "debug"})


def rollout_complete(deployment: Mapping[str, Any] | None) -> bool:
    """Whether a Deployment runs its latest template everywhere: observed, updated, available.

    The same reading as `kubectl rollout status`: the controller has seen
    the latest generation, and every replica is updated and available.
    """
    if not isinstance(deployment, Mapping):
        return False
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    status = deployment.get("status") or {}
    wanted = int(spec.get("replicas", 1) or 0)
    return (
        int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        and int(status.get("updatedReplicas") or 0) >= wanted
        and int(status.get("availableReplicas") or 0) >= wanted
        and int(status.get("replicas") or 0) == int(status.get("updatedReplicas") or 0)
    )


def release_tag(version: Version) -> str | None:
    """The agents' tag for a version istiod runs: `1.31.0` for pilot:1.31.0-distroless.

    None for a development line (no patch): no agent image is released for it.
    A pre-release or vendor suffix is kept (`1.32.0-beta.1`): its agents are
    built with it; a variant is not, `spec.images.variant` appends its own.
    """
    if version.patch is None:
        return None
    base = f"{version.major}.{version.minor}.{version.patch}"
    if version.suffix and version.suffix not in VARIANTS:
        return f"{base}-{version.suffix}"
    return base


@dataclass(frozen=True)
class AgentTag:
    """The tag the agents get this pass, and why (status.versions says it)."""

    tag: str
    # "spec": spec.images.tag is set; "istiod": it follows istiod; "default":
    # no istiod version can be read.
    source: str
    # For status: what is followed, or why the default applies.
    note: str = ""


def agent_tag(
    spec_tag: str | None,
    default: str,
    istiod: Mapping[str, Any] | None,
    running: str | None = None,
) -> AgentTag:
    """The agents' tag: `spec_tag` when set, else istiod's version, else `default`.

    Following istiod is Istio's safe order (istiod first, then the agents)
    done for the user, who asked for it by upgrading istiod. It moves only
    once istiod's rollout is complete: until then the agents keep the tag
    they run (`running`, read from the Linux ztunnel), so a canary that is
    rolled back never reaches a node.
    """
    if spec_tag is not None:
        return AgentTag(spec_tag, "spec")
    version = istiod_version(istiod)
    tag = None if version is None else release_tag(version)
    if version is None or tag is None:
        why = "no istiod version can be read" if version is None else f"istiod runs {version}"
        return AgentTag(default, "default", f"{why}: the built-in default {default}")
    if not rollout_complete(istiod):
        kept = running or tag
        return AgentTag(
            kept,
            "istiod",
            f"istiod is rolling out {version}; the agents stay at {kept} until it is done",
        )
    return AgentTag(tag, "istiod", f"follows istiod {version}")
