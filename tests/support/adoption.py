"""Helpers of the adoption tests (tests/celery_app/test_adoption_*.py; no tests here): a team's app
module on disk, and ``celery`` processes started from its folder with a clean environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.polling import wait_until

CELERY = str(Path(sys.executable).parent / "celery")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Celery's, celery-ha's and Django's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELERY_", "DJANGO_")) and k != "PYTHONPATH"}
    return {**env, **extra}


def write_app(folder: Path, name: str, source: str) -> None:
    """The team's module ``name`` in ``folder`` (the processes start there, with it on their path)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def worker_args(node: str, *extra: str, pool: str = "solo") -> tuple[str, ...]:
    return ("worker", "-P", pool, "-l", "info", "-n", node, "--without-gossip", "--without-mingle",
            "--without-heartbeat", *extra)


class CeleryProcess:
    """``celery -A app ARGS`` started from ``folder``, its output in ``<folder>/<label>.log``."""

    def __init__(self, folder: Path, app: str, *args: str, label: str = "", **env: str) -> None:
        self.log = folder / f"{label or args[0]}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([CELERY, "-A", app, *args], cwd=folder,
                                         env=clean_env(PYTHONPATH=str(folder), **env),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def lines(self) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip()]

    def wait_for(self, text: str, timeout: float = 60) -> None:
        """Until the output holds ``text`` (AssertionError if the process stops first, or at the deadline)."""
        wait_until(lambda: text in self.text or self.proc.poll() is not None, timeout, 0.1, repr(text))
        assert text in self.text, f"stopped (rc {self.proc.poll()}) without saying {text!r}:\n{self.text}"

    def exit_code(self, timeout: float = 60) -> int | None:
        """Its exit code once it stops by itself; None if it still runs at the deadline (then killed)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
