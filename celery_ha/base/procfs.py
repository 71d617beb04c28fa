"""Process facts read from Linux ``/proc``: liveness, parent and children of a pid.

Failover asks whether a lease holder still runs and whether a process is one of this worker's pool
children; the embedded Redis asks before it signals a pid; the demo finds a worker's pool children.
Off Linux, liveness falls back to ``kill(pid, 0)`` and the other answers are "unknown".
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    """Fields of ``/proc/PID/stat`` after the command name (which may contain spaces and parens)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie (a zombie has exited; only its parent must reap it)."""
    try:
        return _stat_fields(pid)[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:  # no /proc (not Linux): existence is the best we can tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``, or None when it is gone or cannot be read."""
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``, e.g. the prefork pool of a Celery worker."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    out = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and parent_pid(int(entry.name)) == pid:
                out.append(int(entry.name))
    return out


def command_line(pid: int) -> bytes:
    """The raw NUL-separated command line of ``pid`` (empty when it cannot be read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
