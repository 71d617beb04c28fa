"""robots.txt answers shared by every process of a namespace: one string key per origin, with a PX
expiry, and a short fetch lock so one process of the fleet fetches a missing file.

Why in Redis: a per-process cache makes every pool process of every worker fetch each site's
robots.txt once per TTL (2 workers x 4 children: 8 requests where one would do, each a spaced
request through the host gate). The value is opaque here (``fetch/robots.py`` encodes it); this
module only names the keys and reads, writes and locks them.

Keys (namespace-wide, under the namespace's own hash tag, so a cluster keeps them on the
namespace's slot and a purge of the namespace removes them): ``cha:{ns}:robots:<origin>`` (the
answer; it expires by itself) and ``cha:{ns}:lock:robots:<origin>`` (the fetch lock, the same
``SET NX PX`` lock as the maintenance locks). ``<origin>`` is ``scheme://host[:port]``.
"""

from __future__ import annotations

import contextlib

import redis

from celery_ha.redisio.lock import extend_lock, try_lock, unlock
from celery_ha.state.keys import QueueKeys, prefix


class RobotsStore:
    """The namespace's robots.txt answers in Redis (``client`` is the namespace's state client)."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._prefix = prefix(namespace) + "robots:"
        self._lock_prefix = QueueKeys(namespace).lock("robots:")

    def __repr__(self) -> str:
        return f"RobotsStore(namespace={self.namespace!r})"

    def key(self, origin: str) -> str:
        """The key holding ``origin``'s answer."""
        return self._prefix + origin

    def lock_key(self, origin: str) -> str:
        """The key of ``origin``'s fetch lock."""
        return self._lock_prefix + origin

    def read(self, origin: str) -> tuple[str, float] | None:
        """``origin``'s stored answer and the seconds it has left (one round trip); None when absent."""
        key = self.key(origin)
        pipe = self.client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        value, left_ms = pipe.execute()
        if value is None or left_ms is None or int(left_ms) == -2:
            return None
        if isinstance(value, bytes):  # a client without decode_responses
            value = value.decode("utf-8", "replace")
        # -1 (no expiry) cannot come from write(); read as "expires now" so the caller re-reads.
        return value, max(0.0, int(left_ms) / 1000.0)

    def write(self, origin: str, value: str, seconds: float) -> None:
        """Store ``origin``'s answer for ``seconds`` (PX: it expires by itself, so the TTL and the
        body cap bound what the store holds)."""
        self.client.set(self.key(origin), value, px=max(1, int(seconds * 1000)))

    def lock(self, origin: str, seconds: float) -> str | None:
        """Take ``origin``'s fetch lock for ``seconds``; its token, or None when another holds it."""
        return try_lock(self.client, self.lock_key(origin), seconds)

    def extend(self, origin: str, token: str, seconds: float) -> bool:
        """Keep the fetch lock ``seconds`` more while ``token`` holds it; False when it does not (or
        Redis did not answer: the holder stops trying, the lock lapses)."""
        try:
            return extend_lock(self.client, self.lock_key(origin), token, seconds)
        except redis.RedisError:
            return False

    def unlock(self, origin: str, token: str) -> None:
        """Free the fetch lock if ``token`` still holds it (an error leaves it to expire)."""
        with contextlib.suppress(redis.RedisError):
            unlock(self.client, self.lock_key(origin), token)
