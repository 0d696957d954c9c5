"""Child processes that cannot outlive their parent.

Every component runs in its own process group (so a stop reaches anything it
might fork) and with ``PR_SET_PDEATHSIG`` set to SIGKILL, so the kernel kills it
even when the Python parent is SIGKILLed and no cleanup code runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None = None


def _prctl() -> ctypes.CDLL:
    # Loaded once in the parent: loading a library between fork and exec is
    # not async-signal-safe.
    global _libc  # noqa: PLW0603
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def die_with_parent_preexec(parent_pid: int) -> Callable[[], None]:
    """Return a ``preexec_fn`` that ties the child's life to ``parent_pid``."""
    libc = _prctl()

    def preexec() -> None:
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        # The parent may have died between fork() and prctl(); the death
        # signal would then never come, so give up right away.
        if os.getppid() != parent_pid:
            os._exit(125)

    return preexec


def tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a text file, or a note that it is missing."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log file {path})"
    return "\n".join(data.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a process that has not been reaped and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the parenthesised command name, which may
    # itself contain spaces or parentheses.
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


@dataclass(frozen=True)
class ProcInfo:
    """A process found by :func:`find_processes`."""

    pid: int
    exe: str
    cmdline: tuple[str, ...]


def find_processes(
    *, exe_in: Iterable[Path] = (), cmdline_contains: str | None = None
) -> list[ProcInfo]:
    """Live processes whose executable is one of ``exe_in`` and/or whose
    command line mentions ``cmdline_contains``; both filters must match when
    both are given."""
    exes = {str(p.resolve()) for p in exe_in}
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            exe = os.readlink(entry / "exe") if exes else ""
        except OSError:
            continue
        cmdline = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        if exes and exe not in exes:
            continue
        if cmdline_contains is not None and not any(cmdline_contains in a for a in cmdline):
            continue
        if not pid_alive(int(entry.name)):
            continue
        found.append(ProcInfo(int(entry.name), exe, cmdline))
    return found


class ManagedProcess:
    """One long-running component with its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        self.cwd = cwd
        self.env = env
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the running process, if started."""
        return self._popen.pid if self._popen is not None else None

    def start(self) -> None:
        """Start the process, appending its output to the log file."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n===== starting {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                # Nothing but a pre-exec hook can set PR_SET_PDEATHSIG in the
                # child; the hook only calls prctl/getppid, which is safe after
                # fork even with other threads running.
                preexec_fn=die_with_parent_preexec(os.getpid()),  # noqa: PLW1509
                close_fds=True,
            )

    def running(self) -> bool:
        """Whether the process is started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    def returncode(self) -> int | None:
        """Exit status once exited (negative for a signal), else None."""
        return None if self._popen is None else self._popen.poll()

    def stop(self, timeout: float = 10.0, *, graceful: bool = True) -> None:
        """SIGTERM the process group, then SIGKILL it after ``timeout`` seconds
        (straight SIGKILL when not ``graceful``)."""
        popen = self._popen
        if popen is None:
            return
        pgid = popen.pid  # start_new_session makes the child its group leader
        if popen.poll() is None:
            if graceful:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            popen.wait(timeout=timeout)
        # Anything the leader forked and left behind in its group goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self._wait_group_gone(pgid, timeout)

    @staticmethod
    def _wait_group_gone(pgid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                return
            time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of this component's log."""
        return tail(self.log_file, lines)
