"""Carried dedup memory: the remembered URLs of a namespace this one was migrated from
(``celery-ha migrate``), when their ids cannot be moved as they are.

A remembered finished URL is only its task id (``_remembered.lua``). With the host gate on in a
sharded namespace, a task's id is chosen so that it lands on its host's shard
(``enqueue_args.on_host_shard``), so it depends on the shard count: after a migration to another
count, an enqueue of the same URL computes another id and would not find the remembered one. Those
ids are carried instead: kept in buckets of the same layout under ``cd:`` (``migrate_in.lua``, mode
'c'; ~13-15 B per id, in the shard of the id under the new count), and the namespace's meta hash
lists the ancestors they come from (field ``carry``: their shard count and whether their gate placed
tasks by host, one entry per migration that carried ids). An enqueue of a dedup task with a host
then computes the ids each ancestor may have given it and looks them up here, in one pipelined round
trip per call, before the enqueue script runs. An id found within the recrawl window (the dedup TTL
by default: the completion hour, as for remembered ids) is a duplicate; carried ids only ever leave
when the namespace is purged or the dedup sweep forgets them past the dedup TTL (``forget_carried.lua``;
``carry`` goes with the last of them), so the look-up is never too generous. Namespaces with no ancestor
carrying ids pay nothing: the queue reads the meta hash's field with the URL rules, in the round
trip of its first dedup enqueue's rule check (``url_rules.check_rules_reading``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

import redis

from celery_ha.state.done_times import done_slot, hour_ms
from celery_ha.state.enqueue_args import KeySource, Row, on_host_shard
from celery_ha.state.ids import dedup_id
from celery_ha.state.keys import QueueKeys
from celery_ha.state.shards import shard_of

META_FIELD = "carry"
#: Every ancestor whose ids meant something else, kept for good (``carry`` goes once the dedup sweep
#: forgot every carried id): the outbox's replay maps an id an ancestor gave to this namespace's.
ANCESTORS_FIELD = "ancestors"


class Carry(NamedTuple):
    """One ancestor whose remembered ids a namespace carries."""

    shards: int
    by_host: bool  # its gate placed gated tasks on their host's shard (gate on, shards > 1)


def parse_carries(raw: str | bytes | None) -> list[Carry]:
    """The ancestors recorded in a meta hash's ``carry`` (or ``ancestors``) field (None: none)."""
    return [Carry(int(c["shards"]), bool(c["by_host"])) for c in json.loads(raw)] if raw else []


def stored_carries(client: redis.Redis, namespace: str, field: str = META_FIELD) -> list[Carry]:
    """The ancestors ``namespace`` carries remembered ids of (none for most namespaces); with
    ``field`` :data:`ANCESTORS_FIELD`, every ancestor whose ids meant something else."""
    return parse_carries(client.hget(QueueKeys(namespace).meta, field))


def set_carries(client: redis.Redis, namespace: str, carries: Sequence[Carry], field: str = META_FIELD
                ) -> None:
    """Record the ancestors ``namespace`` carries remembered ids of (or, with ``field``
    :data:`ANCESTORS_FIELD`, whose ids meant something else)."""
    meta = QueueKeys(namespace).meta
    if carries:
        client.hset(meta, field, json.dumps([c._asdict() for c in carries]))
    else:
        client.hdel(meta, field)


def carried_slot(keys: QueueKeys, task_id: str) -> tuple[str, bytes]:
    """(bucket key, field) of a carried id in one shard (``cd:`` beside the remembered ``d:``)."""
    return done_slot(keys.prefix + "c", task_id)


def ancestor_ids(row: Row, carry: Carry) -> list[str]:
    """The ids an ancestor may have given the dedup task of ``row`` (``build_row``'s rule under its
    count): the plain digest, and, where its gate placed tasks by host, the one on the host's shard
    (a URL finished while its gate was off kept the plain one)."""
    source: KeySource = row[8]
    base = dedup_id(row[3], source.canonical)
    if carry.by_host and row[7]:
        placed = on_host_shard(base, row[7], True, row[3], source.canonical, carry.shards)
        if placed != base:
            return [base, placed]
    return [base]


def carried_times(client: redis.Redis, shards: list[QueueKeys], carries: Sequence[Carry], rows: list[Row]
                  ) -> tuple[int, list[int | None]]:
    """(now, when an ancestor finished each dedup row's URL): the start of its completion hour (ms,
    Redis clock), the latest where several ancestors did; None where none did (or not a dedup row)."""
    looked: list[tuple[int, str]] = [(i, old) for i, row in enumerate(rows) if row[2] == "1"
                                     for carry in carries for old in ancestor_ids(row, carry)]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for _, old in looked:
        pipe.hget(*carried_slot(shards[shard_of(old, len(shards))], old))
    clock, *hours = pipe.execute()
    times: list[int | None] = [None] * len(rows)
    for (i, _), hour in zip(looked, hours, strict=True):
        if hour is not None:
            at = hour_ms(hour)
            times[i] = max(at, times[i] or at)
    return clock[0] * 1000 + clock[1] // 1000, times


def carried_duplicates(client: redis.Redis, shards: list[QueueKeys], carries: Sequence[Carry],
                       rows: list[Row], window_ms: int) -> set[int]:
    """Positions of the dedup ``rows`` whose URL an ancestor finished within ``window_ms`` (-1: ever)."""
    if not any(row[2] == "1" for row in rows):
        return set()
    now_ms, times = carried_times(client, shards, carries, rows)
    return {i for i, at in enumerate(times) if at is not None and (window_ms < 0 or at > now_ms - window_ms)}


def count_duplicates(client: redis.Redis, shards: list[QueueKeys], ids: Sequence[str]) -> None:
    """Count a duplicate for each of ``ids`` (found carried: no script saw them) in stats
    ``duplicates`` of its shard, as the enqueue script counts the duplicates it finds."""
    per_shard: dict[int, int] = {}
    for task_id in ids:
        shard = shard_of(task_id, len(shards))
        per_shard[shard] = per_shard.get(shard, 0) + 1
    pipe = client.pipeline(transaction=False)
    for shard, n in per_shard.items():
        pipe.hincrby(shards[shard].stats, "duplicates", n)
    pipe.execute()
