"""Redis connections from URLs, and credential masking for anything that gets printed or logged.

AUTH, ACL users and TLS all come through the URL (``redis://user:pass@host:6379/0``, ``rediss://…``),
which redis-py understands natively; celery-ha adds nothing of its own there.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import redis

from .errors import ConfigurationError
from .settings import Settings

_CREDENTIALS_IN_TEXT = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]*(?::[^/@\s]*)?)@", re.I)


def mask_url(url: str) -> str:
    """Replace the password of a URL (and any user:pass@ inside free text) by ``***``."""

    def repl(match: re.Match[str]) -> str:
        cred = match.group("cred")
        user = cred.split(":", 1)[0] if ":" in cred else ""
        masked = f"{user}:***" if user else "***"
        return f"{match.group('scheme')}{masked}@"

    return _CREDENTIALS_IN_TEXT.sub(repl, url)


def redis_client(url: str, **kwargs: object) -> redis.Redis:
    """A decoded Redis client for ``url``; a malformed URL becomes a one-line ConfigurationError."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"unsupported Redis URL {mask_url(url)!r}: use redis://, rediss:// or unix://")
    options: dict[str, object] = {"decode_responses": True, "health_check_interval": 30}
    options.update(kwargs)
    try:
        return redis.Redis.from_url(url, **options)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigurationError(f"bad Redis URL {mask_url(url)!r}: {exc}") from None


def resolve_redis_url(settings: Settings | None = None) -> str:
    """The state-layer URL: ``CELERY_HA_REDIS_URL``, else the embedded Redis (started on demand)."""
    settings = settings or Settings.from_env()
    if settings.redis_url:
        return settings.redis_url
    from .embedded import EmbeddedRedis

    return EmbeddedRedis(settings.data_dir).ensure_running()
