"""What kopf needs from us besides the handlers: logging, a diff base never built."""

from __future__ import annotations

import logging
from typing import Any

import kopf


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built: only `on.event` handlers are registered here.

    kopf builds an "essence" of every body it sees (a deep copy, then
    cleaned) to detect changes for create/update handlers; this operator has
    none, and those copies were a fifth of its CPU at scale. Nothing is ever
    stored, so `fetch` finds nothing either.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def configure_logging(fmt: str, level: str) -> None:
    """Structured (json) or text logs at the given level."""
    kopf.configure(
        debug=level == "debug",
        quiet=level in ("warning", "error"),
        log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(level.upper())
