"""Turn exceptions into the one masked line an operator sees (never a traceback, never a password)."""

from __future__ import annotations

import json
import os
import sys

import redis

from celery_ha.base.errors import CeleryHAError, ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings

#: Exit codes: 1 = the operation failed, 2 = bad usage (click's own), 3 = Redis unreachable.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def one_line(text: str) -> str:
    """Masked, single-line version of ``text`` (multi-line messages are joined with ' | ')."""
    parts = [p.strip() for p in mask_url(str(text)).splitlines() if p.strip()]
    return " | ".join(parts) if parts else "unknown error"


def debug_enabled() -> bool:
    """``CELERY_HA_DEBUG``: print tracebacks. Read alone, so a bad unrelated knob cannot hide them;
    an unreadable value counts as asking for them."""
    try:
        return bool(Settings.one("debug"))
    except ConfigurationError:
        return True


def describe(exc: BaseException, redis_url: str | None = None) -> tuple[str, int]:
    """The message and exit code for an exception escaping a command."""
    where = f" at {mask_url(redis_url)}" if redis_url else ""
    # AuthenticationError is a ConnectionError in redis-py: it must be tested first.
    if isinstance(exc, redis.AuthenticationError):
        return one_line(f"Redis{where} refused the credentials: {exc}"), EXIT_UNREACHABLE
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return one_line(f"cannot reach Redis{where}: {exc}"), EXIT_UNREACHABLE
    if isinstance(exc, redis.RedisError):
        return one_line(f"Redis error{where}: {exc}"), EXIT_FAILURE
    if isinstance(exc, CeleryHAError):
        return one_line(str(exc)), EXIT_FAILURE
    if isinstance(exc, json.JSONDecodeError):
        return one_line(f"invalid JSON: {exc}"), EXIT_FAILURE
    if isinstance(exc, OSError):
        name = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return one_line(f"{name}{exc.strerror or exc}"), EXIT_FAILURE
    hint = "" if debug_enabled() else " (set CELERY_HA_DEBUG=1 for the traceback)"
    return one_line(f"unexpected {type(exc).__name__}: {exc}{hint}"), EXIT_FAILURE


def silence_stdout() -> None:
    """After EPIPE on stdout: point fd 1 at /dev/null, so the interpreter's last flush of what is
    still buffered cannot fail ('Exception ignored ... BrokenPipeError', exit 120)."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real stream (click's test runner)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fileno)
    finally:
        os.close(devnull)
