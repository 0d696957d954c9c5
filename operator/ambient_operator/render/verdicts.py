"""Which nodes get agents, for which platform, and why the others do not.

Reasons are NodeReason members (api/conditions.py), shown verbatim by the
status and the CLI; the checks run from what the node is (OS, architecture, build) to what the spec
asks (platform switched off, build not listed, excluded by selector or
tolerations), so the first reason given is the most fundamental one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import NodeReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster import scheduling
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.render.model import PLATFORM_LINUX, NodeVerdict
from ambient_operator.render.placement import (
    LINUX_ARCHES,
    WINDOWS_ARCHES,
    effective_tolerations,
    user_affinity,
)

_BUILD_NUMBER = re.compile(r"^10\.0\.([0-9]+)$")
_OLDEST_SUPPORTED = min(int(b.rsplit(".", 1)[1]) for b in c.SUPPORTED_WINDOWS_BUILDS)

# Sorting by it runs in C; a lambda costs a Python call per node (5,000 per node pass).
_NAME = attrgetter("name")


def _release(build: str) -> str:
    name = c.WINDOWS_BUILD_NAMES.get(build)
    return f"{name} (build {build})" if name else f"Windows build {build}"


def _supported_list() -> str:
    return ", ".join(_release(b) for b in c.SUPPORTED_WINDOWS_BUILDS)


@dataclass(frozen=True)
class Assignment:
    """The verdict of every node and the nodes each platform's DaemonSets are for."""

    verdicts: tuple[NodeVerdict, ...]
    linux: tuple[NodeFacts, ...]
    windows: Mapping[str, tuple[NodeFacts, ...]]


def _no(node: NodeFacts, reason: NodeReason, message: str) -> NodeVerdict:
    return NodeVerdict(node.name, node.os, node.build, False, reason, message)


def _build_problem(node: NodeFacts) -> tuple[NodeReason, str] | None:
    build = node.build
    if build is None:
        return NodeReason.WINDOWS_BUILD_UNKNOWN, (
            f"the Windows build is unknown: no {c.LABEL_WINDOWS_BUILD} label and no "
            "build in status.nodeInfo.kernelVersion or osImage"
        )
    if build in c.SUPPORTED_WINDOWS_BUILDS:
        return None
    match = _BUILD_NUMBER.match(build)
    if build in c.WINDOWS_BUILD_NAMES or (match and int(match.group(1)) < _OLDEST_SUPPORTED):
        return NodeReason.WINDOWS_BUILD_UNSUPPORTED, (
            f"{_release(build)} lacks HostProcess containers and HNS L4 WFP proxy policies, "
            f"which ambient needs; supported: {_supported_list()}"
        )
    return NodeReason.WINDOWS_BUILD_UNKNOWN, (
        f"Windows build {build!r} is not one this operator knows; supported: {_supported_list()}"
    )


def _intrinsic(node: NodeFacts) -> tuple[NodeReason, str] | None:
    """Why the node can never run the agents, whatever the spec says."""
    if node.os not in ("linux", "windows"):
        what = "no operating system" if node.os is None else f"operating system {node.os!r}"
        return NodeReason.OPERATING_SYSTEM_UNKNOWN, (
            f"the node reports {what}; the ambient data plane runs on linux and windows nodes"
        )
    arches = LINUX_ARCHES if node.os == "linux" else WINDOWS_ARCHES
    if node.arch not in arches:
        arch = "an unknown architecture" if node.arch is None else node.arch
        os_name = "Linux" if node.os == "linux" else "Windows"
        return NodeReason.ARCHITECTURE_UNSUPPORTED, (
            f"{os_name} on {arch} is not supported; the {os_name} agents are "
            f"built for {' and '.join(arches)}"
        )
    if node.os == "windows":
        return _build_problem(node)
    return None


def _by_spec(
    node: NodeFacts,
    spec: AmbientMeshSpec,
    tolerations: Mapping[str, Sequence[Mapping[str, Any]]],
) -> tuple[NodeReason, str] | None:
    """Why the spec keeps agents off a node that could run them."""
    os_name = "linux" if node.os == "linux" else "windows"
    plat = spec.platforms.linux if os_name == "linux" else spec.platforms.windows
    field = f"spec.platforms.{os_name}"
    if not plat.enabled:
        return NodeReason.PLATFORM_DISABLED, f"{field}.enabled is false"
    builds = spec.platforms.windows.builds
    if os_name == "windows" and builds is not None and node.build not in builds:
        return NodeReason.WINDOWS_BUILD_NOT_ENABLED, (
            f"{_release(node.build or '')} is supported but not listed in {field}.builds"
        )
    for key, value in sorted((plat.node_selector or {}).items()):
        if node.labels.get(key) != value:
            return (
                NodeReason.EXCLUDED_BY_SPEC,
                f"the node lacks {key}={value} from {field}.nodeSelector",
            )
    affinity = user_affinity(spec.platforms.linux.node_affinity) if os_name == "linux" else None
    if affinity is not None and not scheduling.node_matches({"affinity": affinity}, node):
        return (
            NodeReason.EXCLUDED_BY_SPEC,
            f"the node matches none of the terms of {field}.nodeAffinity",
        )
    blocking = scheduling.untolerated(tolerations[os_name], node.taints)
    if blocking:
        taint = blocking[0]
        shown = taint.key if taint.value is None else f"{taint.key}={taint.value}"
        return NodeReason.EXCLUDED_BY_SPEC, (
            f"taint {shown}:{taint.effect} is not tolerated by {field}.tolerations"
        )
    return None


class VerdictMemo:
    """Each node's last verdict, by its facts, while the spec stays the same.

    A verdict is a pure function of the spec and the node's facts: a pass
    judges again only the nodes that changed (or all, after a spec change).
    """

    def __init__(self) -> None:
        self._spec: AmbientMeshSpec | None = None
        self._held: dict[str, tuple[NodeFacts, NodeVerdict]] = {}
        # Nodes judged, for tests that count the work.
        self.judged = 0

    def verdicts(
        self, spec: AmbientMeshSpec, nodes: Sequence[NodeFacts]
    ) -> list[tuple[NodeFacts, NodeVerdict]]:
        """Each node (in name order) with its verdict: the last one where its facts are equal."""
        if self._spec is not spec and self._spec != spec:
            self._spec, self._held = spec, {}
        tolerations: dict[str, Sequence[Mapping[str, Any]]] | None = None
        kept: dict[str, tuple[NodeFacts, NodeVerdict]] = {}
        for node in sorted(nodes, key=_NAME):
            held = self._held.get(node.name)
            if held is None or (held[0] is not node and held[0] != node):
                if tolerations is None:
                    tolerations = _tolerations(spec)
                held = (node, _verdict(spec, node, tolerations))
                self.judged += 1
            kept[node.name] = held
        self._held = kept
        return list(kept.values())


def _tolerations(spec: AmbientMeshSpec) -> dict[str, Sequence[Mapping[str, Any]]]:
    # Tolerations are the same for every build, so check taints against any one.
    return {
        "linux": effective_tolerations(spec, PLATFORM_LINUX),
        "windows": effective_tolerations(spec, c.SUPPORTED_WINDOWS_BUILDS[0]),
    }


def _verdict(
    spec: AmbientMeshSpec,
    node: NodeFacts,
    tolerations: Mapping[str, Sequence[Mapping[str, Any]]],
) -> NodeVerdict:
    problem = _intrinsic(node) or _by_spec(node, spec, tolerations)
    if problem is not None:
        return _no(node, *problem)
    platform = PLATFORM_LINUX if node.os == "linux" else node.build or ""
    return NodeVerdict(node.name, node.os, node.build, True, platform=platform)


def assign(
    spec: AmbientMeshSpec, nodes: Sequence[NodeFacts], memo: VerdictMemo | None = None
) -> Assignment:
    """Judge every node (in name order) and group the accepted ones by platform.

    `memo`, the last pass's, spares judging again the nodes that did not change.
    """
    judged = (memo if memo is not None else VerdictMemo()).verdicts(spec, nodes)
    linux: list[NodeFacts] = []
    windows: dict[str, list[NodeFacts]] = {}
    for node, verdict in judged:
        if not verdict.supported:
            continue
        if node.os == "linux":
            linux.append(node)
        else:
            windows.setdefault(verdict.platform or "", []).append(node)
    return Assignment(
        verdicts=tuple(verdict for _, verdict in judged),
        linux=tuple(linux),
        windows={b: tuple(ns) for b, ns in sorted(windows.items())},
    )
