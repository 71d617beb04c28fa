"""Redis clients built from URLs: the one way any layer gets a connection."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.redisio.urls import mask_url


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
