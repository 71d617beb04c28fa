"""Tasks by state, for operators (``celery-ha tasks``): ids read from the state's own structure, in
its natural order, then their records in one HMGET per page.

Orders: queued = claim order (highest priority band first, oldest first); dispatched = oldest
dispatch first; running = soonest lease expiry first; delayed = soonest retry first; completed =
oldest first (the bounded history only); dead = oldest death first. A sharded namespace lists shard
after shard, each in that order. Filtering by task name reads
pages of ``SCAN_PAGE`` ids until enough match, so its cost grows with how rare the name is.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import check_int, check_task_name, check_text, parse_duration
from celery_ha.state.counts import live_band_ids
from celery_ha.state.host_queues import host_queue_parts, read_part
from celery_ha.state.keys import QueueKeys
from celery_ha.state.records import TaskInfo
from celery_ha.state.taskqueue import TaskQueue

STATES = ("queued", "dispatched", "running", "delayed", "completed", "dead")
SCAN_PAGE = 1000
MAX_LIMIT = 100_000


def _ids(q: TaskQueue, state: str, start: int, count: int) -> list[str]:
    """``count`` ids of ``state`` from position ``start`` (a sharded namespace: shard after shard)."""
    out: list[str] = []
    skip = start
    for k in q.shard_keys():
        zset = {"dispatched": k.inflight, "running": k.running, "delayed": k.delayed,
                "completed": k.completed, "dead": k.dead}.get(state)
        if zset is not None:
            size = int(q.client.zcard(zset))
            if skip < size:
                out.extend(q.client.zrange(zset, skip, skip + count - len(out) - 1))
            skip = max(0, skip - size)
        else:
            skip = _queued(q, k, skip, count, out)
        if len(out) >= count:
            break
    return out


def _queued(q: TaskQueue, k: QueueKeys, skip: int, count: int, out: list[str]) -> int:
    """Append one shard's queued ids (claim order) past ``skip`` to ``out``; returns what is left
    of ``skip`` for the next shard. In the ready bands ``skip`` counts entries, stale ones included
    (ids a direct claim or a cancel left there for a pop to skip); the page shows live ids only."""
    for band in q.client.zrange(k.ready_bands, 0, -1):
        key = k.ready_list(band)
        length = int(q.client.llen(key))
        if skip >= length:
            skip -= length
            continue
        seen: set[str] = set()
        while skip < length and len(out) < count:
            page = q.client.lrange(key, skip, skip + max(count - len(out), SCAN_PAGE // 10) - 1)
            if not page:
                break
            skip += len(page)
            out.extend(live_band_ids(q.client, k, band, page, seen)[:count - len(out)])
        skip = 0
        if len(out) >= count:
            return skip
    # Then the host gate's queues, host by host. Their lengths are read a chunk of hosts per round trip,
    # 16 first (a first page seldom needs more), doubling up to SCAN_PAGE: one round trip per host
    # made a page deep in a crawl of 1,000 hosts take ~60 ms.
    hosts = sorted(q.client.smembers(k.hosts))
    first, size = 0, min(16, SCAN_PAGE)
    while first < len(hosts):
        chunk = hosts[first:first + size]
        first, size = first + size, min(size * 2, SCAN_PAGE)
        for parts in host_queue_parts(q.client, k, chunk):
            for part in parts:
                length = part[1]
                if skip >= length:
                    skip -= length
                    continue
                out.extend(read_part(q.client, part, skip, skip + count - len(out) - 1))
                skip = 0
                if len(out) >= count:
                    return skip
    return skip


def _scan(q: TaskQueue, state: str) -> Iterator[TaskInfo]:
    """Every task of ``state`` in order (records that vanished or moved meanwhile are skipped)."""
    position = 0
    while True:
        ids = _ids(q, state, position, SCAN_PAGE)
        if not ids:
            return
        position += len(ids)
        for info in q.get_many(ids):
            if info is not None and info.state == state:
                yield info


def list_tasks(q: TaskQueue, state: str, *, task: str | None = None, limit: int = 50,
               offset: int = 0) -> list[TaskInfo]:
    """Up to ``limit`` tasks of ``state`` (optionally only those of ``task``), skipping ``offset``."""
    if state not in STATES:
        raise InvalidInput(f"state must be one of {', '.join(STATES)}, got {state!r}")
    limit = check_int("limit", limit, 1, MAX_LIMIT)
    offset = check_int("offset", offset, 0, 2**62)
    if task is None:
        infos = q.get_many(_ids(q, state, offset, limit))
        return [i for i in infos if i is not None]
    name = check_task_name(task)
    out: list[TaskInfo] = []
    skipped = 0
    for info in _scan(q, state):
        if info.task != name:
            continue
        if skipped < offset:
            skipped += 1
            continue
        out.append(info)
        if len(out) >= limit:
            break
    return out


def _known_completed(q: TaskQueue) -> Iterator[TaskInfo]:
    """The completed history (oldest first), then the completed tasks waiting for a scheduled run
    that the history no longer holds (``state/schedules.py``: their records stay, however old)."""
    seen: set[str] = set()
    for info in _scan(q, "completed"):
        seen.add(info.id)
        yield info
    batch: list[str] = []
    for task_id in q.refetch_ids():
        if task_id not in seen:
            batch.append(task_id)
        if len(batch) >= SCAN_PAGE:
            yield from (i for i in q.get_many(batch) if i is not None and i.state == "completed")
            batch = []
    yield from (i for i in q.get_many(batch) if i is not None and i.state == "completed")


def completed_matching(q: TaskQueue, *, match: str | None = None, older_than: float | str | None = None,
                       task: str | None = None) -> list[str]:
    """Ids of the known completed tasks (the history, oldest first, then those waiting for a
    scheduled run) whose URL matches the glob ``match`` (``*``, ``?``, ``[...]``, case-sensitive),
    that completed at least ``older_than`` ago (Redis clock) and run ``task``; every filter left out
    matches all. Read in full before anything acts on them, so a caller that re-queues them does not
    shift the history under its own scan."""
    pattern = None if match is None else check_text("match", match, 8 * 1024)
    name = None if task is None else check_task_name(task)
    cutoff = None
    if older_than is not None:
        seconds, micros = q.client.time()
        cutoff = int(seconds) + int(micros) / 1e6 - parse_duration(older_than, "older_than")
    return [info.id for info in _known_completed(q)
            if (name is None or info.task == name)
            and (cutoff is None or (info.updated_at or 0) <= cutoff)
            and (pattern is None or fnmatch.fnmatchcase(info.url, pattern))]
