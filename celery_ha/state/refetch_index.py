"""Python's side of the refetch index (``_refetch.lua``): which records wait for a scheduled run, how
many wait and how many are due, for ``refetch_pending``, the metrics, listings and recrawls.

A record waits iff it is completed or dead and keeps its interval (``TaskInfo.refetch_every``); it is
due at its last transition (completion or death) plus that interval. The record is the whole truth:
the index ``rfb`` holds record buckets, not ids (per bucket a lower bound of its waiting records' due
times, entries left early or stale by records that stopped waiting), so it is ~100 B per bucket of
16-32 records instead of ~100 B per waiting id, and readers go through the buckets it names. The index
of ids of earlier releases (``refetch``) is read too, until the sweep has drained it.

How many wait is exact: stats ``refetch_waiting``, which the scripts move at each start and end of a
wait, plus the ids of the earlier index. How many are due is read from the buckets: the due runs of
the first :data:`DUE_BUCKETS` buckets whose score is due (the longest due), plus the due ids of the
earlier index: exact while at most :data:`DUE_BUCKETS` buckets are due; beyond, an estimate (the runs
found, scaled by the due buckets over those read: an entry may be early or stale, so a due bucket may
hold fewer due runs than it says, or none).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from celery_ha.state.host_queues import as_text
from celery_ha.state.keys import QueueKeys
from celery_ha.state.records import TaskInfo

#: Buckets whose waiting records a count of the due runs reads (one HGETALL of a small hash each).
DUE_BUCKETS = 64
#: Buckets read per round trip by a walk of every waiting record.
WALK_PAGE = 200
_WAITING_STATES = frozenset(("completed", "dead"))


def waiting_due(info: TaskInfo) -> int | None:
    """When the task of ``info`` is due for its scheduled run (ms, Redis clock), None when it waits for
    none (waiting_due of _refetch.lua)."""
    if info.state in _WAITING_STATES and info.refetch_every is not None and info.updated_at is not None:
        return round(info.updated_at * 1000) + round(info.refetch_every * 1000)
    return None


def waiting_in_bucket(flat: dict[Any, Any]) -> Iterator[tuple[str, int]]:
    """(id, due ms) of each waiting record of one bucket (its HGETALL)."""
    for tid, raw in flat.items():
        tid = as_text(tid)
        due = waiting_due(TaskInfo.parse(tid, as_text(raw)))
        if due is not None:
            yield tid, due


def add_pending_reads(pipe: Any, k: QueueKeys, now_ms: int) -> None:
    """Queue on ``pipe`` the four reads :func:`pending_of` takes (the metrics' first round trip)."""
    pipe.zcard(k.refetch)
    pipe.zcount(k.refetch, "-inf", now_ms)
    pipe.zcount(k.refetch_buckets, "-inf", now_ms)
    pipe.zrangebyscore(k.refetch_buckets, "-inf", now_ms, start=0, num=DUE_BUCKETS)


def add_bucket_reads(pipe: Any, k: QueueKeys, buckets: list[Any]) -> None:
    """Queue on ``pipe`` the HGETALL of each of ``buckets`` (members of the index)."""
    for b in buckets:
        pipe.hgetall(k.record_bucket(int(as_text(b))))


def pending_of(stats_waiting: Any, reads: list[Any], bucket_hashes: list[dict[Any, Any]],
               now_ms: int) -> dict[str, int]:
    """``{"waiting", "due"}`` of one shard from stats ``refetch_waiting``, the replies of
    :func:`add_pending_reads` and the HGETALLs of :func:`add_bucket_reads` (see the module)."""
    legacy, legacy_due, due_buckets, buckets = reads
    due = sum(1 for flat in bucket_hashes for _tid, at in waiting_in_bucket(flat) if at <= now_ms)
    if buckets and int(due_buckets) > len(buckets):
        due = round(due * int(due_buckets) / len(buckets))
    return {"waiting": int(stats_waiting or 0) + int(legacy), "due": due + int(legacy_due)}


def pending(client: redis.Redis, shards: list[QueueKeys]) -> dict[str, int]:
    """How many runs wait (exact) and how many are due now (see the module), over ``shards``: two
    round trips."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    pipe = client.pipeline(transaction=False)
    for k in shards:
        pipe.hget(k.stats, "refetch_waiting")
        add_pending_reads(pipe, k, now_ms)
    replies = pipe.execute()
    rows = [replies[i * 5:(i + 1) * 5] for i in range(len(shards))]
    pipe = client.pipeline(transaction=False)
    for k, row in zip(shards, rows, strict=True):
        add_bucket_reads(pipe, k, row[4])
    hashes = iter(pipe.execute() if any(row[4] for row in rows) else [])
    total = {"waiting": 0, "due": 0}
    for row in rows:
        part = pending_of(row[0], row[1:], [next(hashes) for _ in row[4]], now_ms)
        total["waiting"] += part["waiting"]
        total["due"] += part["due"]
    return total


def waiting_ids(client: redis.Redis, k: QueueKeys) -> Iterator[str]:
    """The id of every task of shard ``k`` that waits for a scheduled run, once each, read in pages:
    the earlier index's ids, then the waiting records of the buckets the index names."""
    legacy = {as_text(member) for member, _score in client.zscan_iter(k.refetch, count=1000)}
    yield from legacy
    page: list[Any] = []
    seen: set[str] = set()  # a ZSCAN may name a bucket twice
    for member, _score in client.zscan_iter(k.refetch_buckets, count=1000):
        member = as_text(member)
        if member in seen:
            continue
        seen.add(member)
        page.append(member)
        if len(page) >= WALK_PAGE:
            yield from _waiting_of_buckets(client, k, page, legacy)
            page = []
    yield from _waiting_of_buckets(client, k, page, legacy)


def _waiting_of_buckets(client: redis.Redis, k: QueueKeys, buckets: list[Any], skip: set[str]
                        ) -> Iterator[str]:
    if not buckets:
        return
    pipe = client.pipeline(transaction=False)
    add_bucket_reads(pipe, k, buckets)
    for flat in pipe.execute():
        yield from (tid for tid, _due in waiting_in_bucket(flat) if tid not in skip)
