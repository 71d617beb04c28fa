"""Delete every key of one namespace, in batches that never block Redis for long."""

from __future__ import annotations

import redis

from celery_ha.state.keys import prefix


def purge_namespace(client: redis.Redis, namespace: str, batch: int = 500) -> int:
    """SCAN + UNLINK every ``cha:{namespace}:*`` key in batches; returns how many were deleted.

    Not one Lua script on purpose: a big namespace would block Redis for seconds; batches keep
    every other client served. Glob characters cannot occur in a namespace (validated), so the
    pattern matches this namespace only.
    """
    pattern = prefix(namespace) + "*"
    deleted = 0
    pending: list[str] = []
    for key in client.scan_iter(match=pattern, count=batch):
        pending.append(key)
        if len(pending) >= batch:
            deleted += int(client.unlink(*pending))
            pending.clear()
    if pending:
        deleted += int(client.unlink(*pending))
    return deleted
