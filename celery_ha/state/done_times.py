"""When finished dedup tasks finished: a batched read of the remembered ids for callers that decide per
URL, and the Python side of their layout (``_remembered.lua``, whose header describes it).

Every finished dedup id is remembered in one of ~119,000 small hashes per shard, its field 7 bytes
of the id, its value the completion hour (whole hours since 2026-01-01, Redis clock): ~13 bytes per
URL in a listpack instead of a sorted-set entry's ~110. Enqueue's recrawl window is one age for a whole
call; a sitemap knows a different ``lastmod`` per URL, so its ingestion reads the completion times of a
batch first (one HGET per id, pipelined per shard: one round trip per batch, a second one for the
exact time of those the completed history still holds) and decides per URL. Read-only: the enqueue
that follows stays the atomic judge of what is new.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from celery_ha.state.ids import ALPHABET, ID_LEN
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import TaskInfo
from celery_ha.state.refetch_index import waiting_due
from celery_ha.state.sharded import by_shard
from celery_ha.state.shards import shard_keys

DONE_EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: hour 0 (must match _remembered.lua)
HOUR_MS = 3_600_000
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def done_slot(prefix: str, task_id: str) -> tuple[str, bytes]:
    """(bucket key, field) that remember ``task_id`` under ``prefix`` (``done_slot`` of _remembered.lua)."""
    v = [_INDEX.get(c, -1) for c in task_id]
    if len(v) != ID_LEN or min(v) < 0:
        return prefix + "d:~", task_id.encode()
    a = ((v[3] * 62 + v[4]) * 62 + v[5]) * 62 + v[6]
    b = 0
    for x in v[7:]:
        b = b * 62 + x
    b = b * 2 + v[2] % 2
    return prefix + "d:" + task_id[:2] + ALPHABET[v[2] // 2], a.to_bytes(3, "big") + b.to_bytes(4, "big")


def done_bit(task_id: str) -> int | None:
    """The bit of ``task_id``'s bucket in the bitmap ``dk`` of the buckets that may hold ids (None for
    the bucket ``d:~`` of ids of another shape, which has none)."""
    v = [_INDEX.get(c, -1) for c in task_id]
    if len(v) != ID_LEN or min(v) < 0:
        return None
    return (v[0] * 62 + v[1]) * 31 + v[2] // 2


def hour_ms(hour: int | str | bytes) -> int:
    """The start (ms, Redis clock) of a remembered completion hour."""
    return DONE_EPOCH_MS + int(hour) * HOUR_MS


def done_hour(ms: float) -> int:
    """The remembered completion hour of a time (ms, Redis clock): done_hour of _remembered.lua."""
    return int((ms - DONE_EPOCH_MS) // HOUR_MS)


def finished_at(client: redis.Redis, namespace: str, shard_count: int, ids: Sequence[str]
                ) -> list[int | None]:
    """The completion time (ms, Redis clock) of each remembered dedup id, None where it has not
    finished (or the sweep already forgot it), in the order of ``ids``; a task whose completed record
    waits for a scheduled refetch is not remembered apart, its record says it (``_refetch.lua``). Exact
    while the completed history holds the task's record (or a refetch schedule keeps it), else the
    start of its completion hour (up to an hour early: a sitemap lastmod within the hour of the crawl
    counts as newer, so the page is fetched again)."""
    if not ids:
        return []
    keys = shard_keys(namespace, shard_count)
    groups = by_shard(ids, shard_count)
    pipe = client.pipeline(transaction=False)
    for shard, positions in groups.items():
        for p in positions:
            pipe.hget(*done_slot(keys[shard].prefix, ids[p]))
        pipe.zmscore(keys[shard].done, [ids[p] for p in positions])  # the layout before the buckets
        # whether a record may wait for a scheduled run (a refetch index exists): one read per shard
        pipe.exists(keys[shard].refetch_buckets, keys[shard].refetch)
    replies = iter(pipe.execute())
    out: list[int | None] = [None] * len(ids)
    # (position, shard) of hour starts (the record, while the history holds it, says better: exactly),
    # and of the ids no time was found for on a shard where records may wait (a waiting record says it).
    hourly: list[tuple[int, int]] = []
    unknown: set[int] = set()
    for shard, positions in groups.items():
        hours = [next(replies) for _ in positions]
        scores, may_wait = next(replies), next(replies)
        for p, hour, score in zip(positions, hours, scores, strict=True):
            if hour is not None:
                out[p] = hour_ms(hour)
                hourly.append((p, shard))
            elif score is not None:
                out[p] = int(score)
            elif may_wait:
                hourly.append((p, shard))
                unknown.add(p)
    if hourly:
        by_shard_hourly: dict[int, list[int]] = {}
        for p, shard in hourly:
            by_shard_hourly.setdefault(shard, []).append(p)
        for shard, positions in by_shard_hourly.items():
            for p, raw in zip(positions, read_records(client, keys[shard], [ids[p] for p in positions]),
                              strict=True):
                if not raw:
                    continue
                info = TaskInfo.parse(ids[p], raw)
                if info.state == "completed" and info.updated_at is not None and (
                        p not in unknown or waiting_due(info) is not None):
                    out[p] = round(info.updated_at * 1000)
    return out


def remembered(client: redis.Redis, keys: QueueKeys, task_id: str) -> bool:
    """Whether one shard remembers ``task_id`` as finished (tests, tooling)."""
    return (client.hexists(*done_slot(keys.prefix, task_id))
            or client.zscore(keys.done, task_id) is not None)


def count_remembered(client: redis.Redis, keys: QueueKeys) -> int:
    """How many ids one shard remembers, counted in the buckets (SCAN: O(keys); tests, tooling; the
    ``remembered`` count of ``stats()`` is the O(1) one) plus the layout before them."""
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(match=keys.prefix + "d:*", count=1000):
        pipe.hlen(key)
    return sum(pipe.execute()) + int(client.zcard(keys.done))


def done_id(bucket: str, field: bytes) -> str:
    """The id that bucket ``bucket`` (its name past the prefix: ``d:<3 chars>`` or ``d:~``) holds as
    ``field``: the inverse of :func:`done_slot` (done_id of _remembered.lua), for walks of the
    remembered ids (``celery-ha migrate``)."""
    if bucket == "d:~":
        return field.decode()
    a, b = int.from_bytes(field[:3], "big"), int.from_bytes(field[3:7], "big")
    low, b = b % 2, b // 2
    tail = []
    for _ in range(5):
        b, digit = divmod(b, 62)
        tail.append(ALPHABET[digit])
    middle = []
    for _ in range(4):
        a, digit = divmod(a, 62)
        middle.append(ALPHABET[digit])
    third = ALPHABET[_INDEX[bucket[4]] * 2 + low]
    return bucket[2:4] + third + "".join(reversed(middle)) + "".join(reversed(tail))
