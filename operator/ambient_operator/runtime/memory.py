"""Where the operator's memory goes, when asked: tracemalloc's largest holders.

Tracing costs memory and time, so it is off unless Python is started with
`PYTHONTRACEMALLOC` (for example `=25`, the frames kept per allocation).
While it traces, SIGUSR2 appends one JSON line to the file named by
`AMBIENT_OPERATOR_MEMORY_REPORT` (the log when unset): the traced size now
and at its peak, and the largest holders two ways. `files` charges each
allocation to the file that made it (json's decoder, say); `callers`
charges it to the innermost frame of the operator or of kopf above it,
which tells whose data it is. bench/scale.py asks for one at convergence.
With `AMBIENT_OPERATOR_MEMORY_TOP=0` a report holds the sizes only: no
snapshot, which takes minutes at 50,000 pods (bench/growth.py asks for
many, between additions of objects).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import logging
import os
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
REPORT_ENV = "AMBIENT_OPERATOR_MEMORY_REPORT"
TOP_ENV = "AMBIENT_OPERATOR_MEMORY_TOP"
TOP = 25
# Frames of these packages name who holds memory allocated below them.
OWNERS = ("/ambient_operator/", "/kopf/")


def _owner(frames: Sequence[tracemalloc.Frame]) -> str:
    # A traceback runs from the oldest frame kept to the most recent one.
    for frame in reversed(frames):
        if any(part in frame.filename for part in OWNERS):
            return f"{_short(frame.filename)}:{frame.lineno}"
    return "(outside the operator and kopf)"


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/operator/", "/lib/python"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename


def report(top: int = TOP) -> dict[str, Any]:
    """The traced memory now and at its peak, with the `top` largest holders; {} untraced."""
    if not tracemalloc.is_tracing():
        return {}
    if top <= 0:
        # Sizes alone are compared between reports (bench/growth.py): garbage
        # in cycles that a later collection would free must not count.
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        return {"time": time.time(), "traced_bytes": current, "traced_peak_bytes": peak}
    current, peak = tracemalloc.get_traced_memory()
    # Unfiltered: a filter matches every frame of millions of traces by pattern.
    snapshot = tracemalloc.take_snapshot()
    files: Counter[str] = Counter()
    callers: Counter[str] = Counter()
    for trace in snapshot.traces:
        frames = list(trace.traceback)
        files[_short(frames[-1].filename) if frames else "?"] += trace.size
        callers[_owner(frames)] += trace.size
    return {
        "time": time.time(),
        "traced_bytes": current,
        "traced_peak_bytes": peak,
        "files": files.most_common(top),
        "callers": callers.most_common(top),
    }


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    try:
        top = int(os.environ.get(TOP_ENV, TOP))
    except ValueError:
        top = TOP
    line = json.dumps(report(top))
    path = os.environ.get(REPORT_ENV)
    if not path:
        log.warning("memory report: %s", line)
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def install() -> None:
    """Answer SIGUSR2 with a report, if Python traces allocations; otherwise do nothing."""
    if tracemalloc.is_tracing():
        signal.signal(signal.SIGUSR2, _on_signal)


# glibc's mallopt parameter for the number of arenas (malloc.h).
M_ARENA_MAX = -8
ARENAS = 2
arenas_limited = False


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before any thread starts. False where it cannot.

    glibc gives each thread that allocates its own arena, up to eight per
    core. The API calls run in a thread pool, so the large strings of every
    response land in arenas that are rarely empty enough to hand memory back:
    measured at 500 nodes and 6,000 pods, a restart's resident set was 206 MiB
    with the default and 183-188 MiB with two arenas, for no measurable
    change in speed (the GIL serialises the allocations anyway). This is the
    `MALLOC_ARENA_MAX` environment variable, set from inside so that the
    image, the chart and a development run all get it.
    """
    global arenas_limited  # noqa: PLW0603 - one process-wide fact, set once at start
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no arenas to cap)
    arenas_limited = bool(mallopt(M_ARENA_MAX, arenas))
    return arenas_limited
