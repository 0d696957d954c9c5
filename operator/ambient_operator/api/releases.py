"""Istio releases the operator knows, with where each fact comes from.

The default agent version is the release tagged at the commit of istio.io/istio
that hack/cluster/istio/go.mod pins (tests/test_default_version.py holds the
two together, so a pin bump without its row here fails the suite).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """One Istio release: its version, when it came out, and the commit its tag names."""

    version: str
    date: str
    # The git tag at `commit`, where the release was cut from a candidate's commit.
    tag: str
    commit: str
    source: str


RELEASES: tuple[Release, ...] = (
    Release(
        version="1.31.0",
        date="2026-08-31",
        # Tagged 1.31.0-rc.4 on 2026-08-27, then released as 1.31.0 unchanged.
        tag="1.31.0",
        commit="eed52ebb66ad",
        source="github.com/istio/istio/releases/tag/1.31.0",
    ),
)
