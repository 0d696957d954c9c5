"""Istio releases the operator knows, with where each fact comes from.

The default agent version is the release tagged at the commit of istio.io/istio
that hack/cluster/istio/go.mod pins (tests/test_default_version.py holds the
two together, so a pin bump without its row here fails the suite).

The other rows tell users which patch of their istiod's minor is the newest
the operator knows, and what it fixes for the node agents (precheck and
status.versions name it; docs/versions.md shows the table). Dates are the
release announcements' (istio.io/latest/news/releases/<minor>.x/), checked
against the release's git tag where a tag was at hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

_NEWS = "istio.io/latest/news/releases"


@dataclass(frozen=True)
class Release:
    """One Istio release: its version, when it came out, and where that is said."""

    version: str
    # YYYY-MM-DD, or "" where no source could be read.
    date: str
    source: str
    # What it fixes in ztunnel, istio-cni or waypoints, briefly, with issue numbers.
    fixes: tuple[str, ...] = ()
    # The git tag at `commit`, where the release was cut from a candidate's commit.
    tag: str = ""
    commit: str | None = None

    @property
    def key(self) -> tuple[int, ...]:
        """The version as numbers, for ordering."""
        return tuple(int(part) for part in self.version.split("."))

    @property
    def line(self) -> str:
        """`1.30`: the minor line."""
        return ".".join(self.version.split(".")[:2])


def _note(minor: str, page: str) -> str:
    return f"{_NEWS}/{minor}.x/{page}/"


RELEASES: tuple[Release, ...] = (
    Release(
        "1.29.0",
        "2026-02-16",
        _note("1.29", "announcing-1.29"),
        (
            "istio-cni failed to start on MicroK8s with nftables (#58185)",
            "bypass-inbound-capture left inbound HBONE without its iptables mark (#58546)",
            "iptables did not wait for the xtables lock (#58507)",
            "istio-cni left CNI config behind on nodes its affinity no longer matched (#58768)",
            "defaults: dnsCapture and reconcileIptablesOnStartup on; istio-cni grace 30 s (#58572)",
        ),
    ),
    Release(
        "1.29.1",
        "2026-03-10",
        _note("1.29", "announcing-1.29.1"),
        ("waypoints lacked the TLS inspector with TLS-only ports (#59024)",),
    ),
    Release(
        "1.29.2",
        "2026-04-13",
        _note("1.29", "announcing-1.29.2"),
        (
            "several VirtualServices for one host on waypoints (#59483)",
            "ztunnel `h2 ping error: broken pipe` race (#59192, istio/ztunnel#1346)",
        ),
    ),
    Release(
        "1.29.3",
        "2026-05-18",
        _note("1.29", "announcing-1.29.3"),
        ("kubelet probes of ambient pods on EKS with branch ENIs (istio-cni ip rules)",),
    ),
    Release(
        "1.29.4",
        "2026-06-04",
        _note("1.29", "announcing-1.29.4"),
        (
            "istio-cni falls back to iptables when nft lacks JSON (#60328)",
            "istio-cni `concurrent map writes` panic with two pods enrolling at once (#60328)",
        ),
    ),
    Release(
        "1.29.5",
        "2026-06-24",
        _note("1.29", "announcing-1.29.5"),
        ("an ambient pod fell out of the host probe ipset after a node or kubelet restart",),
    ),
    Release(
        "1.29.6",
        "2026-07-16",
        _note("1.29", "announcing-1.29.6"),
        ("istio-cni ZDS deadlock on a pod delete during a ztunnel reconnect (ztunnel#1674)",),
    ),
    Release(
        "1.29.7",
        "2026-08-27",
        _note("1.29", "announcing-1.29.7"),
        (
            "istio-cni treated hostNetwork pods as ambient-eligible (#61168)",
            "istio-cni could pair a pod with another pod's netns: wrong identity (#61211)",
            "istio-cni leaked a netns file descriptor",
        ),
    ),
    Release(
        "1.29.8",
        "2026-09-21",
        _note("1.29", "announcing-1.29.8"),
        ("istio-cni's iptables backend could flip across restarts: duplicate rules (#61020)",),
    ),
    Release(
        "1.30.0",
        "2026-05-18",
        _note("1.30", "announcing-1.30"),
        (
            "istio-cni works with user-namespace pods (hostUsers: false) (#58750)",
            "the istio-cni agent honours excludeNamespaces (#59295)",
            "CNI config written 0600 by default (#59071)",
            "the ztunnel chart gains dnsPolicy and dnsConfig",
        ),
    ),
    Release(
        "1.30.1",
        "2026-06-04",
        _note("1.30", "announcing-1.30.1"),
        (
            "istio-cni falls back to iptables when nft lacks JSON (#60328)",
            "istio-cni `concurrent map writes` panic (#60328)",
        ),
    ),
    Release(
        "1.30.2",
        "2026-06-24",
        _note("1.30", "announcing-1.30.2"),
        ("an ambient pod fell out of the host probe ipset after a node or kubelet restart",),
    ),
    Release(
        "1.30.3",
        "2026-07-16",
        _note("1.30", "announcing-1.30.3"),
        ("istio-cni ZDS deadlock on a pod delete during a ztunnel reconnect (ztunnel#1674)",),
    ),
    Release(
        "1.30.4",
        "2026-08-27",
        _note("1.30", "announcing-1.30.4"),
        (
            "istio-cni could deadlock at start after a node reboot (#60668)",
            "istio-cni treated hostNetwork pods as ambient-eligible (#61168)",
            "istio-cni leaked a netns file descriptor",
        ),
    ),
    Release(
        "1.30.5",
        "2026-09-21",
        _note("1.30", "announcing-1.30.5"),
        ("istio-cni's iptables backend could flip across restarts: duplicate rules (#61020)",),
    ),
    # Their release notes could not be read here (istio.io's index stops at
    # 1.30.5 in every copy at hand); issue 30 of this project states that
    # patches through 1.30.7 exist, and a third party's release of
    # 2026-10-27 (linode/apl-core v6.4.3-rc.1) moves to 1.30.7.
    Release("1.30.6", "", "not read here: stated to exist by issue 30 of this project"),
    Release(
        "1.30.7",
        "",
        "not read here: stated by issue 30; github.com/linode/apl-core/releases/tag/v6.4.3-rc.1",
    ),
    Release(
        "1.31.0",
        "2026-08-31",
        # Tagged 1.31.0-rc.4 on 2026-08-27, then released as 1.31.0 unchanged.
        "github.com/istio/istio/releases/tag/1.31.0",
        (
            "istio-cni could pair a pod with another pod's netns: wrong identity (#61211)",
            "istio-cni could deadlock at start after a node reboot (#60668)",
            "IPv6 waypoint listener rejected by Envoy with a headless Service in scope (#60310)",
        ),
        tag="1.31.0",
        commit="eed52ebb66ad",
    ),
    Release(
        "1.31.1",
        "2026-09-21",
        _note("1.31", "announcing-1.31.1"),
        ("istio-cni's iptables backend could flip across restarts: duplicate rules (#61020)",),
    ),
)


def newest_patch(line: str, releases: Iterable[Release] = RELEASES) -> Release | None:
    """The newest release the operator knows of a minor line (`1.30`), or None."""
    found = [r for r in releases if r.line == line]
    return max(found, key=lambda r: r.key) if found else None


def fixed_since(line: str, patch: int, releases: Iterable[Release] = RELEASES) -> list[Release]:
    """The known releases of `line` newer than its patch `patch`, oldest first."""
    return sorted((r for r in releases if r.line == line and r.key[2] > patch), key=lambda r: r.key)


def markdown(releases: Iterable[Release] = RELEASES) -> str:
    """The table of docs/versions.md (no trailing newline)."""
    lines = [
        "| Release | Date | Fixes for the node agents and waypoints | Source |",
        "|---|---|---|---|",
    ]
    for r in sorted(releases, key=lambda r: r.key):
        fixes = "; ".join(r.fixes) or "—"
        lines.append(f"| {r.version} | {r.date or 'unknown'} | {fixes} | {r.source} |")
    return "\n".join(lines)
