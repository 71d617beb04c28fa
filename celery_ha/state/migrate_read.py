"""How ``celery-ha migrate`` (``state/migrate.py``) reads its source: the queued records in hand-out
order, the leases still held, and a fingerprint of each shard that tells whether anything worked on
the source while it was read.

The source is meant to be stopped, and ``Migration.check`` refuses while a worker heartbeats or a
task holds a lease. A process that does neither between two of its calls (a standalone worker
looping over ``claim_next``, a producer) still gets through, and a migration that reads a source that
changes cannot prove it took everything: a task moved as queued may finish in the source meanwhile,
and one queued where the passes had already read goes unseen. So every transition a task makes is
in the fingerprint (each bumps a lifetime counter in ``stats``, or changes the size of a state's
index), a migration compares the fingerprints taken before and after its reads, and one that saw a
change leaves the target open (``unseen``) for a run once the source is stopped. Counting what the
passes saw cannot tell: a task read as queued and again as completed counts twice, and hides one
the passes missed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import redis

from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.counts import SWEEP_FIELDS
from celery_ha.state.host_queues import as_text, host_queue_parts, read_part
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import TaskInfo

PAGE = 500  # entries read from the source per round trip

#: What a migration compares: per shard, every lifetime counter, and the size of each state's index.
Fingerprint = dict[str, str]


def paged(read: Callable[[int, int], list[str]], page: int = PAGE) -> Iterator[list[str]]:
    """The entries of a list (or a sorted set by rank) in pages, ``read(start, stop)`` reading one
    range (inclusive). A queue changes at its head while it is read (a claim pops it, a release or a
    reclaim pushes to it), so a page does not start at a fixed index: each read takes the last entry
    of the page before as well, and where that entry is no longer in its place, it is looked for
    around it; gone (popped, and everything before it too), the head is what comes next. A shift
    can make a page read entries again (the target skips what it holds), never skip one."""
    start, last = 0, None
    while True:
        if last is None:
            got = read(0, page - 1)
        else:
            got = read(start - 1, start + page - 1)
            if got and got[0] == last:
                got = got[1:]
            else:
                low = max(0, start - 1 - page)
                window = read(low, start + page - 1)
                places = [i for i, tid in enumerate(window) if tid == last]
                if places:  # the one nearest to where it was (an id may sit twice: a stale entry)
                    at = min(places, key=lambda i: abs(low + i - (start - 1)))
                    start, got = low + at + 1, window[at + 1:]
                else:
                    start, got = 0, read(0, page - 1)
        if not got:
            return
        yield got
        start += len(got)
        last = got[-1]


def queued_records(client: redis.Redis, k: QueueKeys) -> Iterator[tuple[str, str, TaskInfo]]:
    """The source shard's queued records in hand-out order, parsed: the ready bands, best first,
    then each host's queue (stale entries, whose records are not queued there, are skipped)."""
    for band in client.zrange(k.ready_bands, 0, -1):
        key = k.ready_list(band)
        for page in paged(lambda a, b, key=key: [as_text(i) for i in client.lrange(key, a, b)]):
            for tid, raw in zip(page, read_records(client, k, page), strict=True):
                if raw is not None and (info := queued_in(tid, raw, band, None)):
                    yield tid, raw, info
    for host in sorted(client.sscan_iter(k.hosts, count=1000)):
        for part in host_queue_parts(client, k, [host])[0]:
            for page in paged(lambda a, b, part=part: read_part(client, part, a, b)):
                for tid, raw in zip(page, read_records(client, k, page), strict=True):
                    if raw is not None and (info := queued_in(tid, raw, None, host)):
                        yield tid, raw, info


def queued_in(tid: str, raw: str, band: str | None, host: str | None) -> TaskInfo | None:
    """The record parsed when it is queued where it was found (``band``, or ``host``'s queue)."""
    info = TaskInfo.parse(tid, raw)
    if info.state != "queued" or info.host != host:
        return None
    return info if band is None or str(info.priority) == str(band) else None


def fingerprints(client: redis.Redis, shards: list[QueueKeys]) -> list[Fingerprint]:
    """Per shard: its lifetime counters (a claim, a completion, a failure, a release, an enqueue,
    a cancel each bump one; not the dedup sweeps' places) and the sizes of its records and of each
    state's index (a dispatch and a due retry change them), read in one round trip."""
    pipe = client.pipeline(transaction=False)
    for k in shards:
        pipe.hgetall(k.stats)
        pipe.hget(k.record_geometry, "n")
        pipe.hlen(k.tasks)
        for key in (k.inflight, k.running, k.delayed, k.dead, k.completed):
            pipe.zcard(key)
        pipe.hget(k.host_config, "nq")
    replies = pipe.execute()
    out = []
    for i in range(len(shards)):
        stats, *sizes = replies[i * 9:(i + 1) * 9]
        shape = {f"#{n}": as_text(v or 0) for n, v in enumerate(sizes)}
        out.append({**{as_text(f): as_text(v) for f, v in stats.items() if as_text(f) not in SWEEP_FIELDS},
                    **shape})
    return out


def changes(before: list[Fingerprint], after: list[Fingerprint]) -> int:
    """How many transitions the source went through between two fingerprints, about (the changes of
    its counters; at least 1 when anything differs)."""
    moved = 0
    for old, new in zip(before, after, strict=True):
        diff = sum(_delta(old.get(f, "0"), new.get(f, "0")) for f in old.keys() | new.keys() if f[0] != "#")
        moved += diff or int(old != new)
    return moved


def _delta(old: str, new: str) -> int:
    """How far a counter moved (1 for a field that is not a count and changed)."""
    try:
        return abs(int(new) - int(old))
    except ValueError:
        return int(old != new)


def live_leases(client: redis.Redis, shards: list[QueueKeys]) -> int:
    """How many tasks of the shards hold a lease that has not expired (``running``: id -> expiry)."""
    now = redis_now_ms(client)
    pipe = client.pipeline(transaction=False)
    for k in shards:
        pipe.zcount(k.running, f"({now}", "+inf")
    return sum(int(n) for n in pipe.execute())
