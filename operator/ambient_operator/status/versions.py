"""Versions in the AmbientMesh status: skew with istiod, and a version change under way.

Pure. The version readings and Istio's support rule are cluster/versions.py's;
the order of a rollout is render/rollout.py's. This module words them for
status.versions, Degraded (VersionSkew) and the Reconciled message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshReason, Problem
from ambient_operator.api.releases import newest_patch
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, VersionStatus
from ambient_operator.cluster.revisions import DEFAULT_REVISION
from ambient_operator.cluster.versions import (
    AgentTag,
    Version,
    image_version,
    istiod_version,
    parse_version,
    skew_problem,
)
from ambient_operator.render.model import PLATFORM_LINUX, OrderedRollout, PlatformRollout
from ambient_operator.render.values import ZTUNNEL, daemonset_name

# What a Windows node loses while its agents are replaced (docs/versions.md says more).
WINDOWS_RESTART = (
    "ztunnel on Windows cannot hand its ports to its successor (no SO_REUSEPORT; "
    "INPOD_PORT_REUSE=false), so each node's old agent leaves before the new one starts: "
    "there, until the new ztunnel is Ready, the node's ambient pods cannot open connections "
    "and those still open when the old one's grace period (spec.ztunnel."
    "terminationGracePeriodSeconds) ends are cut; pods created while istio-cni restarts are "
    "redirected once the new one runs (docs/versions.md)"
)


def platform_name(platform: str) -> str:
    """`Linux`, or `Windows Server 2022 (10.0.20348)`."""
    if platform == PLATFORM_LINUX:
        return "Linux"
    release = c.WINDOWS_BUILD_NAMES.get(platform)
    return f"{release} ({platform})" if release else f"Windows build {platform}"


def _images(rollout: OrderedRollout) -> Iterable[tuple[str, str]]:
    """(DaemonSet name, image) of what runs now and what is rendered, for every platform."""
    for plat in rollout.platforms:
        for images in (plat.running, plat.images):
            for component, image in images.items():
                yield daemonset_name(component, plat.platform), image


def version_skew(rollout: OrderedRollout, istiod: Mapping[str, Any] | None) -> Problem | None:
    """VersionSkew, when an agent that runs or is rendered is outside the rule with istiod.

    Both what runs and what the pass renders count: during a rollout the
    old version still serves the nodes not yet updated. Nothing is judged
    when istiod's version or an image's is unknown (`latest`, a digest).
    """
    control_plane = istiod_version(istiod)
    if control_plane is None:
        return None
    by_version: dict[Version, set[str]] = {}
    for name, image in _images(rollout):
        version = image_version(image)
        if version is not None:
            by_version.setdefault(version, set()).add(name)
    lines = []
    for version, names in sorted(by_version.items(), key=lambda item: str(item[0])):
        problem = skew_problem(control_plane, version)
        if problem is not None:
            lines.append(f"{', '.join(sorted(names))} at {version}: {problem}")
    if not lines:
        return None
    newest = newest_patch(control_plane.line_name)
    if newest is not None:
        lines.append(
            f"the newest patch of {control_plane.line_name} this operator knows is {newest.version}"
        )
    return Problem(MeshReason.VERSION_SKEW, "; ".join(lines))


def older_patch(control_plane: Version | None, agents: Version | None) -> str | None:
    """The newest known patch of istiod's minor, when the agents run an older patch of it."""
    if control_plane is None or agents is None or agents.line != control_plane.line:
        return None
    newest = newest_patch(control_plane.line_name)
    if newest is None or agents.patch is None or newest.key[2] <= agents.patch:
        return None
    return newest.version


def _running(rollout: OrderedRollout) -> Iterable[tuple[str, str]]:
    """(DaemonSet name, image) of what runs now."""
    for plat in rollout.platforms:
        for component, image in plat.running.items():
            yield daemonset_name(component, plat.platform), image


def _rolling(rollout: OrderedRollout) -> PlatformRollout | None:
    return rollout.first("rolling")


def rollout_message(
    rollout: OrderedRollout,
    chosen: AgentTag | None = None,
    versions: VersionStatus | None = None,
    held: frozenset[str] = frozenset(),
) -> str | None:
    """What the Reconciled message says while a platform rolls or others wait; None otherwise.

    When the agents follow istiod, it says so, and from which version to which;
    a rollback (`versions.rollback`) is named as one. A platform in `held`
    (its DaemonSets keep the template they run until approved, status/held.py)
    is not being replaced: the held message says what approving changes.
    """
    rolling, waiting = _rolling(rollout), rollout.waiting()
    if rolling is not None and rolling.platform in held:
        rolling = None
    if rolling is None and not waiting:
        return None
    parts = []
    if versions is not None and versions.rollback:
        parts.append(
            f"rolling the agents back {versions.rollback}, in the same order as a change: "
            "Linux, then each Windows build"
        )
    if chosen is not None and chosen.source == "istiod":
        was = sorted({str(v) for _, image in _running(rollout) if (v := image_version(image))})
        parts.append(
            f"the agents' tag follows istiod ({chosen.note}): from {', '.join(was) or 'none'} "
            f"to {chosen.tag}"
        )
    if rolling is not None:
        parts.append(
            f"the agents on {platform_name(rolling.platform)} are being replaced ({rolling.why})"
        )
    if waiting:
        names = ", ".join(platform_name(p.platform) for p in waiting)
        target = next((p.revision for p in rollout.platforms if p.state != "waiting"), None)
        moving = any(p.revision != target for p in waiting)
        kept, change = (
            ("the istiod revision and images", "images or istiod revision")
            if moving
            else ("the images", "images")
        )
        parts.append(
            f"{names} keep {kept} they run until {platform_name(waiting[0].why)} is Ready "
            f"(a change of the agents' {change} rolls one platform at a time: Linux, then each "
            "Windows build)"
        )
    if rolling is not None and rolling.platform != PLATFORM_LINUX and ZTUNNEL in rolling.images:
        parts.append(WINDOWS_RESTART)
    return "; ".join(parts)


def _back(value: str, was: str | None, before_was: str | None) -> tuple[str | None, bool]:
    """(the value before the last change, whether this one returns to it) for one setting.

    `was` is the setting in the last pass, `before_was` what it was before that.
    """
    if value == was:
        return before_was, False
    return was, value == before_was


def rollback(
    tag: str, revision: str, rollout: OrderedRollout, before: VersionStatus | None
) -> tuple[str | None, str | None, str | None]:
    """(status.versions.previous, .previousRevision, .rollback) this pass.

    `before` is the last pass's status.versions. A change of the agents' tag
    or istiod revision records the value it left; a change back to the value
    recorded before it is a rollback, and so is a change to an older version
    than a platform runs. It stays one, saying what goes back, until every
    platform has it.
    """
    if before is None:
        return None, None, None
    rolling = rollout.first("rolling") is not None or bool(rollout.waiting())
    was_revision = before.revision or revision
    previous, tag_back = _back(tag, before.data_plane, before.previous)
    previous_revision, revision_back = _back(revision, was_revision, before.previous_revision)
    if tag == before.data_plane and revision == was_revision:
        return previous, previous_revision, before.rollback if rolling else None
    wanted = parse_version(tag)
    tag_back = tag_back or (
        tag != before.data_plane
        and wanted is not None
        and any(
            (v := image_version(image)) is not None and wanted.older_than(v)
            for _, image in _running(rollout)
        )
    )
    moves = [
        *([f"from {before.data_plane} to {tag}"] if tag_back else []),
        *([f"from istiod revision {was_revision} to {revision}"] if revision_back else []),
    ]
    return previous, previous_revision, " and ".join(moves) if rolling and moves else None


def version_status(
    spec: AmbientMeshSpec,
    rollout: OrderedRollout,
    istiod: Mapping[str, Any] | None,
    chosen: AgentTag | None = None,
    before: VersionStatus | None = None,
) -> VersionStatus:
    """status.versions: istiod's version, the agents' target, and the platforms in a rollout.

    `spec` carries the tag the pass rendered (`chosen.tag` when it follows
    istiod); `before` is the last pass's status.versions (for a rollback).
    """
    control_plane = istiod_version(istiod)
    rolling = _rolling(rollout)
    source = "spec" if chosen is None else chosen.source
    revision = spec.istiod.revision or DEFAULT_REVISION
    previous, previous_revision, back = rollback(spec.images.tag, revision, rollout, before)
    return VersionStatus(
        control_plane=None if control_plane is None else str(control_plane),
        data_plane=spec.images.tag,
        source=source if source in ("istiod", "default") else "spec",
        note=None if chosen is None or not chosen.note else chosen.note,
        newest_patch=older_patch(control_plane, parse_version(spec.images.tag)),
        rolling=None if rolling is None else rolling.platform,
        waiting=[p.platform for p in rollout.waiting()],
        previous=previous,
        revision=revision,
        previous_revision=previous_revision,
        rollback=back,
    )
