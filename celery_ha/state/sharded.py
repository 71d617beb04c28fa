"""The operations of a sharded namespace that read or move several shards (see ``state/shards.py``).

A task's own transitions go to its shard alone (its id says which). What spans shards is here:
dispatch (the window shared fairly), the dead-letter list (merged in death order), record lookups
(grouped by shard), and the counts (summed). With one shard every function reduces to the unsharded
single call, so ``CELERY_HA_SHARDS=1`` costs nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

import redis

from celery_ha.state.counts import queue_stats_many
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import Dispatched
from celery_ha.state.replies import dispatched_from
from celery_ha.state.shards import shard_of

#: ``run(shard, window) -> dispatch.lua's reply`` for one shard.
DispatchOne = Callable[[int, int], Any]


def by_shard(ids: Iterable[str], count: int) -> dict[int, list[int]]:
    """Positions of ``ids`` grouped by shard, in input order within each shard."""
    out: dict[int, list[int]] = {}
    for position, task_id in enumerate(ids):
        out.setdefault(shard_of(task_id, count), []).append(position)
    return out


def rotation(count: int, start: int) -> list[int]:
    """Every shard once, beginning at ``start`` (callers rotate it so no shard is always first)."""
    start %= count
    return [*range(start, count), *range(start)]


def _shares(total: int, shards: list[int], start: int) -> dict[int, int]:
    """``total`` split evenly over ``shards``; the remainder goes one each from ``start`` on."""
    if not shards:
        return {}
    base, extra = divmod(max(0, total), len(shards))
    order = rotation(len(shards), start)
    return {shards[i]: base + (1 if rank < extra else 0) for rank, i in enumerate(order)}


def dispatch_shards(client: redis.Redis, keys: list[QueueKeys], run: DispatchOne, window: int,
                    start: int) -> list[Dispatched]:
    """Fill ``window`` from every shard fairly: each shard's ``dispatch`` gets its share of the room
    left (the window minus what is dispatched in all shards), then the room a short shard left goes
    to the shards that filled their share. Every shard is called at least once, so each promotes its
    due retries and re-sends its stale dispatched tasks. Priority holds within a shard; across shards
    each contributes its best tasks, so a shard's priority-9 task may wait behind another shard's
    priority-0 ones of the same round (documented approximation)."""
    count = len(keys)
    if count == 1:
        return dispatched_from(run(0, window))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.zcard(k.inflight)
    inflight = [int(n) for n in pipe.execute()]
    room = window - sum(inflight)
    out: list[Dispatched] = []
    shares = _shares(room, list(range(count)), start)
    full: list[int] = []
    for shard in rotation(count, start):
        got = dispatched_from(run(shard, inflight[shard] + shares[shard]))
        fresh = sum(1 for d in got if not d.resent)
        inflight[shard] += fresh
        room -= fresh
        out += got
        if shares[shard] and fresh >= shares[shard]:
            full.append(shard)
    # The room short shards left. A re-send with a short redispatch_after may take again what the
    # first pass re-stamped moments ago; one message per id is enough (a second would be dropped by
    # the claim), so an id already sent this call is not sent twice.
    taken = {d.task_id for d in out}
    for shard, extra in _shares(room, full, start).items():
        if extra:
            out += [d for d in dispatched_from(run(shard, inflight[shard] + extra)) if d.task_id not in taken]
    return out


def records(client: redis.Redis, keys: list[QueueKeys], ids: list[str]) -> list[str | None]:
    """The raw records of ``ids`` (None where unknown), one script call per shard involved."""
    if len(keys) == 1:
        return read_records(client, keys[0], ids)
    out: list[str | None] = [None] * len(ids)
    for shard, positions in by_shard(ids, len(keys)).items():
        raws = read_records(client, keys[shard], [ids[p] for p in positions])
        for p, raw in zip(positions, raws, strict=True):
            out[p] = raw
    return out


def dead_page(client: redis.Redis, keys: list[QueueKeys], offset: int, limit: int) -> list[str]:
    """Dead ids ``offset .. offset + limit - 1`` in death order, merged across shards."""
    if len(keys) == 1:
        return list(client.zrange(keys[0].dead, offset, offset + limit - 1))
    pages = [client.zrange(k.dead, 0, offset + limit - 1, withscores=True) for k in keys]
    merged = heapq.merge(*pages, key=lambda pair: pair[1])
    return [task_id for task_id, _ in list(merged)[offset:offset + limit]]


def summed_stats(client: redis.Redis, keys: list[QueueKeys]) -> dict[str, int]:
    """``queue_stats`` of every shard, added up (two round trips for all of them)."""
    total: dict[str, int] = {}
    for shard in queue_stats_many(client, keys):
        for name, value in shard.items():
            total[name] = total.get(name, 0) + value
    return total
