"""What kopf needs from us besides the handlers: its logging."""

from __future__ import annotations

import logging

import kopf


def configure_logging(fmt: str, level: str) -> None:
    """Structured (json) or text logs at the given level."""
    kopf.configure(
        debug=level == "debug",
        quiet=level in ("warning", "error"),
        log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(level.upper())
