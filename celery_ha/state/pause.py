"""Pause a namespace: the pump stops dispatching new tasks; running ones finish, retries still come
due (they wait in the queue), and resume picks up where it stopped. A flag in the namespace's meta
hash, read by every pump at most once per heartbeat interval, so a pause takes effect everywhere
within that interval without costing the hot path a read per task.

A migration (``celery-ha migrate``) pauses its source for good: resuming one moved away, or being
moved, would dispatch again tasks that run in the target (and its claims are refused anyway,
``state/migrate_marks.py``), so :func:`resume` refuses it. Only a migration abandoned (its target
purged) leaves a source that resumes: the migration's marks go with the pause."""

from __future__ import annotations

from typing import Any

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.validation import MAX_ERROR_CHARS, clean_message
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.keys import QueueKeys
from celery_ha.state.migrate_marks import abandon, filling, source_marks


def pause(client: redis.Redis, namespace: str, reason: str = "") -> bool:
    """Pause ``namespace``; False when it already was (the first pause's time and reason stay)."""
    keys = QueueKeys(namespace)
    since = redis_now_ms(client)
    if not client.hsetnx(keys.meta, "paused", since):
        return False
    client.hset(keys.meta, "paused_reason", clean_message(reason, MAX_ERROR_CHARS))
    return True


def resume(client: redis.Redis, namespace: str) -> bool:
    """Resume ``namespace``; False when it was not paused. ConfigurationError for one a migration
    moved away or is moving (see the module docstring); an abandoned migration's marks go first."""
    moved, moving = source_marks(client, namespace)
    if moved is not None:
        raise ConfigurationError(
            f"namespace {namespace!r} was migrated to {moved!r} (celery-ha migrate): it stays paused for "
            f"good, its tasks run in {moved!r}; purge {namespace!r} once that runs well")
    if moving is not None:
        if filling(client, moving, namespace):
            raise ConfigurationError(
                f"namespace {namespace!r} is being migrated to {moving!r}: finish that migration (run it "
                f"again), or purge {moving!r} first to abandon it, then resume")
        abandon(client, namespace, moving)
    return bool(client.hdel(QueueKeys(namespace).meta, "paused", "paused_reason"))


def paused(client: redis.Redis, namespace: str) -> dict[str, Any] | None:
    """``{"since": epoch seconds (Redis clock), "reason": str}`` when paused, else None."""
    since, reason = client.hmget(QueueKeys(namespace).meta, ["paused", "paused_reason"])
    if not since:
        return None
    return {"since": int(since) / 1000.0, "reason": reason or ""}
