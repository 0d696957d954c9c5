"""status.platform: the platform the agents are rendered for, and why."""

from __future__ import annotations

from typing import cast

from ambient_operator.api.v1alpha1 import PlatformName, PlatformStatus
from ambient_operator.cluster.platform import MAX_EVIDENCE, PlatformChoice


def platform_status(choice: PlatformChoice) -> PlatformStatus:
    """The status field of a platform choice (cluster/platform.py made it)."""
    return PlatformStatus(
        name=cast(PlatformName, choice.name),
        detected=cast(PlatformName, choice.detected),
        source="spec" if choice.source == "spec" else "detected",
        evidence=[line[:512] for line in choice.evidence[:MAX_EVIDENCE]],
    )
