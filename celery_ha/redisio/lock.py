"""The one short coordination lock: ``SET NX PX`` with a random token, freed by compare-and-delete.

Used wherever two processes may try the same housekeeping at once (two beats, a beat and a worker
watchdog, two workers refreshing one proxy provider): the loser skips instead of doubling the work.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import redis

from celery_ha.redisio.scripts import SHARED_LUA, eval_script


def try_lock(client: redis.Redis, key: str, ttl: float) -> str | None:
    """Take the lock for ``ttl`` seconds; returns its token, or None when someone else holds it."""
    token = secrets.token_hex(8)
    return token if client.set(key, token, nx=True, px=max(1, int(ttl * 1000))) else None


def unlock(client: redis.Redis, key: str, token: str) -> bool:
    """Free the lock if ``token`` still holds it; True when freed."""
    return bool(eval_script(client, SHARED_LUA, "unlock", [key], [token]))


def extend_lock(client: redis.Redis, key: str, token: str, ttl: float) -> bool:
    """Give the lock ``ttl`` seconds more to live if ``token`` still holds it; True when extended."""
    return bool(eval_script(client, SHARED_LUA, "extend", [key], [token, str(max(1, int(ttl * 1000)))]))


@contextlib.contextmanager
def short_lock(client: redis.Redis, key: str, ttl: float) -> Iterator[bool]:
    """Context manager over :func:`try_lock`; yields whether we got it, frees it on exit."""
    token = try_lock(client, key, ttl)
    try:
        yield token is not None
    finally:
        if token is not None:
            with contextlib.suppress(redis.RedisError):
                unlock(client, key, token)
