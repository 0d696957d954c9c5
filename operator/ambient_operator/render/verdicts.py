"""Which nodes get agents, for which platform, and why the others do not.

Reasons are NodeReason members (api/conditions.py), shown verbatim by the
status and the CLI; the checks run from what the node is (OS, architecture, build) to what the spec
asks (platform switched off, build not listed, excluded by selector or
tolerations), so the first reason given is the most fundamental one.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import NodeReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster import scheduling
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.node_table import Readings
from ambient_operator.render import placement as pl
from ambient_operator.render.model import PLATFORM_LINUX, TALLIED, NodeVerdict, VerdictTally
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
_NODE = attrgetter("node")


def _release(build: str) -> str:
    name = c.WINDOWS_BUILD_NAMES.get(build)
    return f"{name} (build {build})" if name else f"Windows build {build}"


def _supported_list() -> str:
    return ", ".join(_release(b) for b in c.SUPPORTED_WINDOWS_BUILDS)


@dataclass(frozen=True)
class Placed:
    """The nodes of one platform (Linux or a Windows build), as its placement reads them."""

    nodes: tuple[NodeFacts, ...]
    names: tuple[str, ...]
    # The platform's requirements that some of its nodes miss by label (their
    # facts came from nodeInfo), and those nodes' names in order.
    missing: frozenset[pl.Requirement]
    unlabeled: tuple[str, ...]


_NOBODY = Placed((), (), frozenset(), ())


@dataclass(frozen=True)
class Assignment:
    """The verdict of every node and the nodes each platform's DaemonSets are for."""

    verdicts: tuple[NodeVerdict, ...]
    # By platform ("linux" or a Windows build), those that have nodes.
    placed: Mapping[str, Placed]
    tally: VerdictTally

    def nodes_of(self, platform: str) -> Placed:
        """The nodes of `platform` (none when no node is assigned to it)."""
        return self.placed.get(platform, _NOBODY)

    @property
    def windows(self) -> dict[str, tuple[NodeFacts, ...]]:
        """The Windows nodes by build, builds in order."""
        return {b: p.nodes for b, p in sorted(self.placed.items()) if b != PLATFORM_LINUX}


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


class _Group:
    """The nodes of one platform, in name order, kept as nodes come, go and change."""

    __slots__ = ("missed", "missing", "names", "nodes")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.nodes: list[NodeFacts] = []
        # The requirements each node misses, for the nodes that miss any.
        self.missed: dict[str, tuple[pl.Requirement, ...]] = {}
        # How many nodes miss each requirement.
        self.missing: Counter[pl.Requirement] = Counter()

    def add(self, node: NodeFacts, missed: tuple[pl.Requirement, ...]) -> None:
        at = bisect.bisect_left(self.names, node.name)
        self.names.insert(at, node.name)
        self.nodes.insert(at, node)
        if missed:
            self.missed[node.name] = missed
            self.missing.update(missed)

    def remove(self, name: str) -> None:
        at = bisect.bisect_left(self.names, name)
        del self.names[at], self.nodes[at]
        missed = self.missed.pop(name, ())
        self.missing.subtract(missed)
        for req in missed:
            if not self.missing[req]:
                del self.missing[req]

    def placed(self) -> Placed:
        return Placed(
            tuple(self.nodes),
            tuple(self.names),
            frozenset(self.missing),
            tuple(sorted(self.missed)),
        )


class VerdictMemo:
    """Each node's verdict and the platforms' nodes, kept while the spec stays the same.

    A verdict is a pure function of the spec and the node's facts, and a
    node's requirements missed are a function of its facts and its platform:
    a pass judges again only the nodes that changed (or all, after a spec
    change). Handed the `Readings` of the facts (cluster/node_table.py) that
    follow the last ones it saw, it looks at the changed names alone; handed
    any other sequence, it compares every node with the one it holds.
    Before, a node pass at 5,000 nodes sorted, compared and grouped every
    node, placed every platform by walking its nodes and tallied every
    verdict: 57 of render's 61 samples per 24 node changes in the growth
    bench's churn profile at L.
    """

    def __init__(self) -> None:
        # Nodes judged, and nodes compared one by one, for tests that count the work.
        self.judged = 0
        self.compared = 0
        self._forget(None)

    def _forget(self, spec: AmbientMeshSpec | None) -> None:
        """Start over for `spec`: every verdict depends on it."""
        self._spec = spec
        self._tolerations: dict[str, Sequence[Mapping[str, Any]]] | None = None
        self._requirements: dict[str, list[pl.Requirement]] = {}
        self._held: dict[str, tuple[NodeFacts, NodeVerdict]] = {}
        # Every node's verdict, in name order.
        self._verdicts: list[NodeVerdict] = []
        self._groups: dict[str, _Group] = {}
        # The tally's parts (render/model.py's VerdictTally).
        self._counts: Counter[tuple[str | None, str | None, bool]] = Counter()
        self._unsupported: list[NodeVerdict] = []
        self._served: list[str] = []
        # The last assignment, and the serial of the readings it came from.
        self._last: Assignment | None = None
        self._placed: dict[str, Placed] = {}
        self._serial = 0

    def assignment(self, spec: AmbientMeshSpec, nodes: Sequence[NodeFacts]) -> Assignment:
        """The verdicts of `nodes` and the platforms' nodes, judging only changed nodes."""
        if self._spec is not spec and self._spec != spec:
            self._forget(spec)
        todo = self._changes(nodes)
        self._serial = nodes.serial if isinstance(nodes, Readings) else 0
        if not todo and self._last is not None:
            return self._last
        touched: set[str] = set()
        for name, node in todo.items():
            self._move(spec, name, node, touched)
        for platform in touched:
            group = self._groups.get(platform)
            if group is None or not group.names:
                self._groups.pop(platform, None)
                self._placed.pop(platform, None)
            else:
                self._placed[platform] = group.placed()
        self._last = Assignment(
            tuple(self._verdicts),
            dict(self._placed),
            VerdictTally(
                {k: n for k, n in self._counts.items() if n},
                tuple(self._unsupported),
                tuple(self._served),
            ),
        )
        return self._last

    def _changes(self, nodes: Sequence[NodeFacts]) -> dict[str, NodeFacts | None]:
        """The nodes to judge again, by name (None: the node went)."""
        held = self._held
        changed = nodes.changed_since(self._serial) if isinstance(nodes, Readings) else None
        if changed is None or self._last is None:
            # The last node of a name wins, as a cluster's list never has two.
            given = {node.name: node for node in nodes}
            self.compared += len(given)
            todo: dict[str, NodeFacts | None] = {n: None for n in held if n not in given}
            for name, node in given.items():
                was = held.get(name)
                if was is None or (was[0] is not node and was[0] != node):
                    todo[name] = node
            return todo
        todo = {}
        for name in changed:
            at = bisect.bisect_left(nodes, name, key=_NAME)
            now = nodes[at] if at < len(nodes) and nodes[at].name == name else None
            was = held.get(name)
            if now is None:
                if was is not None:
                    todo[name] = None
            elif was is None or (was[0] is not now and was[0] != now):
                todo[name] = now
        return todo

    def _move(
        self, spec: AmbientMeshSpec, name: str, node: NodeFacts | None, touched: set[str]
    ) -> None:
        """Forget node `name`'s last verdict, and judge `node` in its place."""
        was = self._held.pop(name, None)
        if was is not None:
            self._tallied(was[1], -1, touched)
            _drop(self._verdicts, name)
            if was[1].supported:
                self._groups[was[1].platform or ""].remove(name)
        if node is None:
            return
        if self._tolerations is None:
            self._tolerations = _tolerations(spec)
        verdict = _verdict(spec, node, self._tolerations)
        self.judged += 1
        self._held[name] = (node, verdict)
        bisect.insort(self._verdicts, verdict, key=_NODE)
        self._tallied(verdict, 1, touched)
        if verdict.supported:
            platform = verdict.platform or ""
            requirements = self._requirements_of(spec, platform)
            missed = tuple(r for r in requirements if r.missed_by(node))
            self._groups.setdefault(platform, _Group()).add(node, missed)

    def _tallied(self, verdict: NodeVerdict, step: int, touched: set[str]) -> None:
        """Count `verdict` in (step 1) or out (-1) of the tally; a supported one touches
        its platform."""
        self._counts[TALLIED(verdict)] += step
        name = verdict.node
        if not verdict.supported:
            if step > 0:
                bisect.insort(self._unsupported, verdict, key=_NODE)
            else:
                _drop(self._unsupported, name)
            return
        platform = verdict.platform or ""
        touched.add(platform)
        if verdict.os == "windows":
            if step > 0:
                bisect.insort(self._served, name)
            else:
                del self._served[bisect.bisect_left(self._served, name)]

    def _requirements_of(self, spec: AmbientMeshSpec, platform: str) -> list[pl.Requirement]:
        reqs = self._requirements.get(platform)
        if reqs is None:
            reqs = (
                pl.linux_requirements(spec)
                if platform == PLATFORM_LINUX
                else pl.windows_requirements(spec, platform)
            )
            self._requirements[platform] = reqs
        return reqs


def _drop(verdicts: list[NodeVerdict], name: str) -> None:
    """Take node `name`'s verdict out of `verdicts` (in name order)."""
    del verdicts[bisect.bisect_left(verdicts, name, key=_NODE)]


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
    return (memo if memo is not None else VerdictMemo()).assignment(spec, nodes)
