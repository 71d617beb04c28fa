"""Run a set of child processes together and make sure every one of them is gone at the end.

Used by ``celery-ha up`` and ``celery-ha demo``. Each child starts in its own session (so its own
process group): a Celery worker's pool children share that group, so one ``killpg`` reaches the whole
tree, and a terminal's Ctrl-C reaches only us, letting us stop children in order. Cleanup runs from
``stop_all``, from an ``atexit`` hook and from SIGTERM/SIGHUP handlers, so no path leaves orphans.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class Child:
    """One supervised process (and the process group it leads)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    expected_exit: bool = False
    _log_handle: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of ours are reaped by Popen.poll)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervisor:
    """Start, watch, restart and stop named child processes."""

    def __init__(self, stop_timeout: float = 10.0) -> None:
        self.children: dict[str, Child] = {}
        self.stop_timeout = stop_timeout
        self._stopped = False
        self._old_handlers: dict[int, Any] = {}
        atexit.register(self.stop_all)

    # ------------------------------------------------------------------ starting
    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log: Path | None = None, cwd: str | Path | None = None) -> Child:
        """Start (or restart) ``name``; output goes to ``log`` (appended) or to our own stdout/stderr."""
        child = self.children.get(name) or Child(name, list(argv), dict(env or os.environ), log)
        if child.alive():
            raise RuntimeError(f"{name} is already running (pid {child.pid})")
        out: int | IO[bytes] | None = None
        if child.log is not None:
            child.log.parent.mkdir(parents=True, exist_ok=True)
            if child._log_handle is None:
                child._log_handle = open(child.log, "ab")
            out = child._log_handle
        child.proc = subprocess.Popen(child.argv, env=child.env, cwd=cwd, stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT if out else None,
                                      start_new_session=True)
        child.started_at = time.monotonic()
        child.expected_exit = False
        self.children[name] = child
        return child

    def restart(self, name: str) -> Child:
        child = self.children[name]
        self.kill(name, signal.SIGKILL)
        child.restarts += 1
        return self.start(name, child.argv, child.env, child.log)

    # ------------------------------------------------------------------ watching
    def exited(self) -> list[Child]:
        """Children that exited without being asked to."""
        return [c for c in self.children.values()
                if c.proc is not None and c.proc.poll() is not None and not c.expected_exit]

    def kill(self, name: str, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
        """Signal a child's whole group and wait (bounded) until the group is gone."""
        child = self.children[name]
        if child.proc is None:
            return
        child.expected_exit = True
        _signal_group(child.proc.pid, sig)
        self._wait_group(child, wait)

    def _wait_group(self, child: Child, timeout: float) -> bool:
        assert child.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            child.proc.poll()  # reap the leader so it stops counting as a member
            if not group_alive(child.proc.pid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    # ------------------------------------------------------------------ stopping
    def stop_all(self, timeout: float | None = None, order: Sequence[str] | None = None) -> None:
        """SIGTERM every leader, wait up to ``timeout`` for each whole group to exit, then SIGKILL the
        groups that are left. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not abort the cleanup
            with contextlib.suppress(ValueError, OSError):  # not the main thread: leave as is
                old = signal.signal(sig, signal.SIG_IGN)
                self._old_handlers.setdefault(sig, old)
        try:
            self._stop_children(self.stop_timeout if timeout is None else timeout, order)
        finally:
            self.restore_signals()

    def _stop_children(self, timeout: float, order: Sequence[str] | None) -> None:
        names = list(order or []) + [n for n in reversed(list(self.children)) if n not in (order or [])]
        live = [self.children[n] for n in names if n in self.children and self.children[n].proc]
        for child in live:
            child.expected_exit = True
            assert child.proc is not None
            if child.proc.poll() is None:
                # The leader only: a Celery worker's main process stops its pool itself (warm
                # shutdown). Signalling the pool children directly makes it try to respawn them.
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
            else:  # the leader is gone but members may remain (orphaned pool children)
                _signal_group(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in live:
            if not self._wait_group(child, max(0.0, deadline - time.monotonic())):
                _signal_group(child.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
                self._wait_group(child, 5.0)
        for child in self.children.values():
            if child._log_handle is not None:
                child._log_handle.close()
                child._log_handle = None

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children.values() if c.proc is not None]

    # ------------------------------------------------------------------ signals
    def install_signals(self) -> None:
        """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt so the caller's cleanup path runs once.

        SIGINT too, explicitly: a shell starts background jobs with SIGINT ignored, and Python then
        never raises KeyboardInterrupt — `kill -INT` would silently do nothing.
        """

        def handler(signum: int, _frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):  # not the main thread: skip
                self._old_handlers[sig] = signal.signal(sig, handler)

    def restore_signals(self) -> None:
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, old)
        self._old_handlers.clear()

    @contextlib.contextmanager
    def running(self) -> Iterator[Supervisor]:
        """``with Supervisor().running() as sup:`` — signals handled, everything stopped on exit."""
        self.install_signals()
        try:
            yield self
        finally:
            self.stop_all()


def celery_argv(app: str, *args: str) -> list[str]:
    """``python -m celery -A app ...`` with this interpreter (the venv that has celery-ha)."""
    return [sys.executable, "-m", "celery", "-A", app, *args]
