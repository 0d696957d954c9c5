"""Pure rendering of the ambient data plane: spec + cluster facts -> desired objects."""

from __future__ import annotations

from ambient_operator.render.dataplane import render_dataplane
from ambient_operator.render.model import (
    PLATFORM_ALL,
    PLATFORM_LINUX,
    DaemonSetPlan,
    NodeVerdict,
    RenderResult,
)

__all__ = [
    "PLATFORM_ALL",
    "PLATFORM_LINUX",
    "DaemonSetPlan",
    "NodeVerdict",
    "RenderResult",
    "render_dataplane",
]
