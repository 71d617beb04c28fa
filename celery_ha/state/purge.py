"""Delete every key of one namespace, in batches that never block Redis for long."""

from __future__ import annotations

import redis

from celery_ha.state.namespaces import forget
from celery_ha.state.shards import namespace_keys


def purge_namespace(client: redis.Redis, namespace: str, batch: int = 500) -> int:
    """SCAN + UNLINK every ``cha:{namespace}:*`` key (and every shard's) in batches; returns how many
    were deleted.

    Not one Lua script on purpose: a big namespace would block Redis for seconds; batches keep
    every other client served. Glob characters cannot occur in a namespace (validated), so the
    pattern matches this namespace only.
    """
    deleted = 0
    # The shards first: the namespace's own keys (shard 0, and the meta hash that records the shard
    # count) go last, so a purge cut short can be run again and still finds every shard.
    for keys in reversed(namespace_keys(client, namespace)):
        pending: list[str] = []
        for key in client.scan_iter(match=keys.prefix + "*", count=batch):
            pending.append(key)
            if len(pending) >= batch:
                deleted += _unlink(client, pending)
                pending.clear()
        if pending:
            deleted += _unlink(client, pending)
    forget(client, namespace)  # workers of a pattern stop looking for it
    return deleted


def _unlink(client: redis.Redis, keys: list[str]) -> int:
    """UNLINK ``keys`` (one slot: they share their prefix)."""
    return int(client.unlink(*keys))
