"""The marks a migration (``state/migrate.py``) leaves on its two namespaces, and what they close.

* Meta ``migrating_from`` / ``migrated_from`` on the target, ``migrating_to`` / ``migrated_to`` on the
  source: which migration owns them. A run takes both before it writes anything else (:func:`take`):
  the target with ``HSETNX``, the source in a ``WATCH`` transaction, so of two runs into two targets
  that both passed their checks (two operators at their prompts) one takes the source and the other
  is refused, with nothing of its own left behind. A source whose migration was abandoned (its
  target purged since) may be taken by a migration into another target.
* Field ``mv`` (:data:`CLOSED`) of each source shard's record geometry hash (``tg``, ``_records.lua``),
  written right after: ``claim.lua`` reads it with the geometry, in the read every claim makes
  anyway (no extra command), and refuses the claim. So from then on no message of the source (those
  of its dispatched tasks are still in its broker queue) starts a task there, whatever consumes it:
  the task runs once, in the target. The meta marks alone did not stop that: only the enqueue read
  them. A resume of a source whose migration was abandoned takes the marks back (:func:`abandon`).
* The migration registers the target (``state/namespaces.py``) before the last marks, so the workers
  of a pattern (``CELERY_HA_NAMESPACES=crawl-*``) and ``celery-ha web`` find it; a pattern's workers
  do not serve the source (``servable_matches`` reads :func:`moved_to`), and ``celery-ha resume``
  refuses it (``state/pause.py``).

The last marks are written source first (:func:`mark_done`), so a run cut short between them left a
source that already refuses new tasks, and the next run writes the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.state.host_queues import as_text
from celery_ha.state.keys import QueueKeys
from celery_ha.state.shards import namespace_keys

MIGRATING_FROM, MIGRATED_FROM = "migrating_from", "migrated_from"
MIGRATING_TO, MIGRATED_TO = "migrating_to", "migrated_to"
#: The field of a source shard's ``tg`` hash that closes it to claims (its value: the target).
CLOSED = "mv"


def _text(value: object) -> str | None:
    return None if value is None else as_text(value)


def source_marks(client: redis.Redis, namespace: str) -> tuple[str | None, str | None]:
    """``namespace``'s marks as a source: (``migrated_to``, ``migrating_to``)."""
    moved, moving = client.hmget(QueueKeys(namespace).meta, [MIGRATED_TO, MIGRATING_TO])
    return _text(moved), _text(moving)


def moved_to(client: redis.Redis, namespace: str) -> str | None:
    """Where a migration moved ``namespace`` (meta ``migrated_to``), or is moving it (``migrating_to``),
    or None."""
    moved, moving = source_marks(client, namespace)
    return moved or moving


#: The field of the meta hash that pauses a namespace (``state/pause.py``, which imports this module).
PAUSED = "paused"


def pump_marks(client: redis.Redis, namespace: str) -> tuple[bool, str | None]:
    """Whether ``namespace`` is paused, and :func:`moved_to`, in one read: what a pump reads once per
    heartbeat interval (``integration/dispatch/pump.py``), which dispatches nothing of a namespace a
    migration moved away or is moving, not even a re-send of a dispatched task (its claim is refused)."""
    since, moved, moving = client.hmget(QueueKeys(namespace).meta, [PAUSED, MIGRATED_TO, MIGRATING_TO])
    return bool(since), _text(moved) or _text(moving)


def dropped_for(client: redis.Redis, namespace: str) -> str | None:
    """:func:`moved_to`, for the line of a worker that drops a message its claim refused: None also
    when Redis cannot say now (the message is dropped all the same)."""
    try:
        return moved_to(client, namespace)
    except redis.RedisError:
        return None


def filling(client: redis.Redis, target: str, source: str) -> bool:
    """Whether ``target`` is still being filled from ``source`` (its migration is not abandoned)."""
    return _text(client.hget(QueueKeys(target).meta, MIGRATING_FROM)) == source


def finished(client: redis.Redis, source: str, target: str) -> bool:
    """Whether the migration of ``source`` into ``target`` ended with every mark written."""
    running, done = client.hmget(QueueKeys(target).meta, [MIGRATING_FROM, MIGRATED_FROM])
    moved, moving = client.hmget(QueueKeys(source).meta, [MIGRATED_TO, MIGRATING_TO])
    return (_text(done), _text(moved), running, moving) == (source, target, None, None)


def cut_short(client: redis.Redis, source: str, target: str) -> bool:
    """Whether a run of this migration wrote the target's ``migrated_from`` but stopped before the
    rest of the last marks (a crash, or a release that wrote the target's mark first)."""
    running, done = client.hmget(QueueKeys(target).meta, [MIGRATING_FROM, MIGRATED_FROM])
    moved = _text(client.hget(QueueKeys(source).meta, MIGRATED_TO))
    return _text(done) == source and (running is not None or moved != target)


def take(client: redis.Redis, source: str, target: str) -> None:
    """Take ``target`` (meta ``migrating_from``) and then ``source`` (``migrating_to``) for this
    migration, or raise ConfigurationError naming the migration that holds one (the target's mark is
    then taken back when this call wrote it)."""
    tmeta = QueueKeys(target).meta
    while not (wrote := bool(client.hsetnx(tmeta, MIGRATING_FROM, source))):
        running, done = client.hmget(tmeta, [MIGRATING_FROM, MIGRATED_FROM])
        origin = _text(running) or _text(done)
        if origin == source:
            break
        if origin is not None:
            raise ConfigurationError(f"namespace {target!r} was migrated from {origin!r}, not {source!r}")
        # the mark went between the two calls (a run finishing its last marks): take it again
    try:
        _take_source(client, source, target)
    except ConfigurationError:
        if wrote:
            client.hdel(tmeta, MIGRATING_FROM)
        raise


def _take_source(client: redis.Redis, source: str, target: str) -> None:
    smeta = QueueKeys(source).meta
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(smeta)
                moved, moving = (_text(v) for v in pipe.hmget(smeta, [MIGRATED_TO, MIGRATING_TO]))
                if moved is not None and moved != target:
                    raise ConfigurationError(f"namespace {source!r} was migrated to {moved!r} already: "
                                             f"migrate {moved!r} instead")
                if moving not in (None, target) and filling(client, moving, source):
                    raise ConfigurationError(
                        f"namespace {source!r} is being migrated to {moving!r}: finish that migration "
                        f"(run it again) or purge {moving!r} first")
                pipe.multi()
                pipe.hset(smeta, MIGRATING_TO, target)
                pipe.execute()
                return
            except redis.WatchError:
                continue  # another run wrote the source's marks meanwhile: read them again


def close(client: redis.Redis, shards: Iterable[QueueKeys], target: str) -> None:
    """Close every shard of the source to claims (``claim.lua`` refuses them, naming nothing: the
    worker that drops the message names ``target``, read from the meta)."""
    pipe = client.pipeline(transaction=False)
    for k in shards:
        pipe.hset(k.record_geometry, CLOSED, target)
    pipe.execute()


def abandon(client: redis.Redis, source: str, target: str) -> None:
    """Take back the marks of a migration of ``source`` into ``target`` that was abandoned (the target
    purged): the source's shards open to claims again, then its ``migrating_to`` goes; each only while
    it still names ``target`` (another migration may have taken the source since)."""
    for k in namespace_keys(client, source):
        _delete_if(client, k.record_geometry, CLOSED, target)
    _delete_if(client, QueueKeys(source).meta, MIGRATING_TO, target)


def _delete_if(client: redis.Redis, key: str, field: str, value: str) -> None:
    """Delete ``field`` of hash ``key`` when it holds ``value``, in a ``WATCH`` transaction."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            if _text(pipe.hget(key, field)) == value:
                pipe.multi()
                pipe.hdel(key, field)
                pipe.execute()
        except redis.WatchError:
            pass  # written meanwhile: another migration's mark, left as it is


def mark_done(client: redis.Redis, source: str, target: str) -> None:
    """The last marks, source first: from its ``migrated_to`` on, the source refuses new tasks, and a
    run that stops after it (the target still ``migrating_from``) is let through by the checks and
    finishes; one that stops after the target's ``migrated_from`` is finished by the run alone."""
    tmeta, smeta = QueueKeys(target).meta, QueueKeys(source).meta
    client.hset(smeta, MIGRATED_TO, target)
    client.hdel(smeta, MIGRATING_TO)
    client.hset(tmeta, MIGRATED_FROM, source)
    client.hdel(tmeta, MIGRATING_FROM)
