"""Helpers for the CLI, embedded-Redis and demo tests (no tests here).

Run ``celery-ha`` in-process and check the one-line error contract; find processes by a marker in
their environment, to prove a command left nothing behind (also after a Ctrl-C: :func:`interrupt`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from celery_ha.cli import main
from tests.support.polling import wait_until

SECRET = "s3cr3t-pw"


def run(args: Sequence[str], input: str | None = None, env: dict[str, str | None] | None = None) -> Result:
    """Invoke the CLI like a shell would (no exceptions swallowed into the result silently)."""
    runner = CliRunner()
    return runner.invoke(main, list(args), input=input, env=env, catch_exceptions=True)


def assert_one_line_error(result: Result, *, code: int | None = None, contains: str = "") -> str:
    """Non-zero exit, exactly one non-empty stderr line starting with 'Error:', no traceback, masked."""
    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), lines
    assert "Traceback" not in result.output
    assert SECRET not in result.output
    assert contains.lower() in lines[0].lower(), lines[0]
    return lines[0]


def poll(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
         what: str = "condition") -> Any:
    """:func:`tests.support.polling.wait_until` with this module's longer defaults (test_embedded uses it)."""
    return wait_until(predicate, timeout, interval, what)


def pids_with_env(marker: str) -> list[int]:
    """Live (non-zombie) processes whose environment contains ``marker`` (e.g. 'CELERY_HA_NAMESPACE=x')."""
    needle = marker.encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError, IndexError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    out.append(int(entry.name))
    return out


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[str], marker: str) -> Iterator[subprocess.Popen[str]]:
    """Run the body; then kill ``proc`` if it still runs and SIGKILL whatever carries ``marker``."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(pids_with_env(marker))


def interrupt(proc: subprocess.Popen[str], marker: str, *, returncode: int, says: str, what: str) -> str:
    """Ctrl-C ``proc``: it must exit with ``returncode``, print ``says`` and no traceback, and leave no
    process carrying ``marker`` behind. Returns its output."""
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == returncode, out[-3000:]
    assert says in out and "Traceback" not in out
    wait_until(lambda: pids_with_env(marker) == [], timeout=15, what=what)
    return out


def kill_all(pids: list[int]) -> None:
    """Last-resort cleanup in a test's finally: SIGKILL the given pids (started by this test)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
