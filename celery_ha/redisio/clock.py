"""The one clock every component agrees on: the Redis server's (``TIME``), never a worker's."""

from __future__ import annotations

import redis


def redis_now_ms(client: redis.Redis) -> int:
    """Redis server time in milliseconds."""
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000
