"""Helpers for the CLI, embedded-Redis and demo tests (no tests here).

Run ``celery-ha`` in-process and check the one-line error contract; find processes by a marker in
their environment, to prove a command left nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from celery_ha.cli import main

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


def poll(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Return predicate()'s first truthy value, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s {what}")
        time.sleep(interval)


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


def kill_all(pids: list[int]) -> None:
    """Last-resort cleanup in a test's finally: SIGKILL the given pids (started by this test)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
