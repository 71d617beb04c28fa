"""``celery-ha enqueue -f`` shows a progress bar on a terminal, and only there.

Why a real terminal: the bar is decided by ``sys.stderr.isatty()``, which CliRunner's captured streams
never are. The command runs as a child process whose stderr is the slave side of a pseudo-terminal
(its stdout stays a pipe, as in ``celery-ha enqueue -f urls.txt > result.txt``).
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from celery_ha import TaskQueue

pytestmark = pytest.mark.skipif(not sys.platform.startswith(("linux", "darwin")), reason="needs a pty")

URLS = 2_500


def _listing(tmp_path: Path) -> Path:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"https://example.com/p/{i}\n" for i in range(URLS)))
    return path


def _argv(redis_url: str, listing: Path) -> list[str]:
    return [sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "enqueue", "-f", str(listing),
            "--batch-size", "500"]


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "100", "TERM": "xterm"}


def test_progress_bar_on_a_terminal_stderr(redis_url: str, tmp_path: Path) -> None:
    master, slave = pty.openpty()
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(_argv(redis_url, _listing(tmp_path)), stdout=subprocess.PIPE, stderr=slave,
                              stdin=subprocess.DEVNULL, env=_env(), timeout=120, check=False)
    finally:
        os.close(slave)
    reader.join(timeout=30)
    os.close(master)
    assert proc.returncode == 0, (proc.stdout, bytes(seen))
    bar = bytes(seen).decode("utf-8", "replace")
    assert "queueing" in bar and "100%" in bar, bar
    # stdout is what it always was: one line, no bar.
    assert proc.stdout.decode() == f"queued {URLS} new task(s), 0 duplicate(s) (task fetch_page, namespace " \
                                   "default)\n"
    assert TaskQueue.from_url(redis_url).stats()["queued"] == URLS


def test_no_progress_bar_when_stderr_is_not_a_terminal(redis_url: str, tmp_path: Path) -> None:
    proc = subprocess.run(_argv(redis_url, _listing(tmp_path)), capture_output=True, stdin=subprocess.DEVNULL,
                          env=_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert proc.stdout.decode().startswith(f"queued {URLS} new task(s)")
