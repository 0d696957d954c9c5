"""What rendering returns: the desired objects and the reasons behind them."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import Problem
from ambient_operator.api.v1alpha1 import BuildCount, NodeInventory, UnsupportedNode

Component = Literal["ztunnel", "istio-cni"]
PLATFORM_LINUX = "linux"
# Platform label of objects every platform shares (ServiceAccounts, RBAC).
PLATFORM_ALL = "all"
UNKNOWN_BUILD = "unknown"
# The status field keeps a handful of examples; the count says how many there are.
MAX_UNSUPPORTED_EXAMPLES = 20


@dataclass(frozen=True)
class NodeVerdict:
    """Whether one node gets the data-plane agents, and if not, why."""

    node: str
    os: str | None
    build: str | None
    supported: bool
    reason: str | None = None
    message: str | None = None
    # "linux" or the Windows build whose DaemonSets run on the node.
    platform: str | None = None


@dataclass(frozen=True)
class DaemonSetPlan:
    """One rendered DaemonSet and the nodes it is meant to run on."""

    name: str
    component: Component
    platform: str
    nodes: tuple[str, ...]


# How one platform's agents stand in a change of their images (a version change).
# current: rendered as the spec asks, and Ready at it (or not yet created);
# rolling: rendered as the spec asks, its pods not all updated and available;
# waiting: kept at the images it runs until the platform before it is Ready.
PlatformState = Literal["current", "rolling", "waiting"]


@dataclass(frozen=True)
class PlatformRollout:
    """Where one platform ("linux" or a Windows build) stands in a rollout of agent images."""

    platform: str
    state: PlatformState
    # Per component: the image rendered this pass, and what the DaemonSet runs now.
    images: Mapping[Component, str] = field(default_factory=dict, hash=False)
    running: Mapping[Component, str] = field(default_factory=dict, hash=False)
    # rolling: its progress; waiting: the platform it waits for.
    why: str = ""
    # rolling only because its pods are not all available yet, with no new template.
    settling: bool = False
    # The istiod revision its ztunnel is rendered with this pass (None: the Service
    # istiod); a waiting platform keeps the one it runs.
    revision: str | None = None


@dataclass(frozen=True)
class OrderedRollout:
    """The platforms in rollout order: Linux, then each Windows build, oldest first."""

    platforms: tuple[PlatformRollout, ...] = ()

    def first(self, state: PlatformState) -> PlatformRollout | None:
        """The first platform in that state."""
        return next((p for p in self.platforms if p.state == state), None)

    def waiting(self) -> tuple[PlatformRollout, ...]:
        """The platforms kept at the images they run."""
        return tuple(p for p in self.platforms if p.state == "waiting")


# A verdict's key in the tally's counts.
TALLIED = attrgetter("os", "build", "supported")


@dataclass(frozen=True)
class VerdictTally:
    """What the status and the metrics read of a pass's verdicts, from one walk of them."""

    # Nodes by (os, build, supported).
    counts: Mapping[tuple[str | None, str | None, bool], int]
    # The verdicts of the nodes that get no agent, in name order.
    unsupported: tuple[NodeVerdict, ...]
    # The Windows nodes that get agents, in name order.
    windows_served: tuple[str, ...]

    @classmethod
    def of(cls, verdicts: Sequence[NodeVerdict]) -> VerdictTally:
        """The tally of `verdicts` (in name order)."""
        # Counted in C (Counter over attrgetter's tuples): a Python loop over
        # 5,000 verdicts took twice as long.
        return cls(
            dict(Counter(map(TALLIED, verdicts))),
            tuple(v for v in verdicts if not v.supported),
            tuple(v.node for v in verdicts if v.supported and v.os == "windows"),
        )

    def nodes(self, os_name: str | None = None) -> int:
        """How many nodes (of one OS)."""
        return sum(n for (node_os, _, _), n in self.counts.items() if os_name in (None, node_os))


@dataclass(frozen=True)
class RenderResult:
    """Desired objects in apply order, plus what the status needs to explain them."""

    objects: tuple[dict[str, Any], ...]
    verdicts: tuple[NodeVerdict, ...]
    daemonsets: tuple[DaemonSetPlan, ...]
    warnings: tuple[str, ...]
    rollout: OrderedRollout = OrderedRollout()
    # What the spec asks for and the cluster cannot have, each with its own reason.
    problems: tuple[Problem, ...] = ()
    # The verdicts' tally, when the render kept it as nodes changed (render/verdicts.py).
    counted: VerdictTally | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def tally(self) -> VerdictTally:
        """The verdicts' tally, walked at most once for every reader of this result (a
        status-only pass reads the last full pass's)."""
        return self.counted if self.counted is not None else VerdictTally.of(self.verdicts)

    def unsupported(self) -> tuple[NodeVerdict, ...]:
        """Verdicts of the nodes that get no agent."""
        return self.tally.unsupported

    def inventory(self) -> NodeInventory:
        """Node counts by OS and build, and examples of unsupported nodes, for the status."""
        tally = self.tally
        per_build: Counter[str] = Counter()
        for (os_name, build, _), count in tally.counts.items():
            if os_name == "windows":
                per_build[build or UNKNOWN_BUILD] += count
        unsupported = tally.unsupported
        return NodeInventory(
            total=len(self.verdicts),
            linux=tally.nodes("linux"),
            windows=tally.nodes("windows"),
            supported=len(self.verdicts) - len(unsupported),
            unsupported=len(unsupported),
            windows_builds=[
                BuildCount(
                    build=build,
                    release=c.WINDOWS_BUILD_NAMES.get(build, UNKNOWN_BUILD),
                    nodes=count,
                    supported=build in c.SUPPORTED_WINDOWS_BUILDS,
                )
                for build, count in sorted(per_build.items())
            ],
            unsupported_nodes=[
                UnsupportedNode(name=v.node, reason=v.reason or "", message=v.message or "")
                for v in unsupported[:MAX_UNSUPPORTED_EXAMPLES]
            ],
        )
