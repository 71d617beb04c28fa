"""Which tasks wait for a scheduled run, read from the records (``_refetch.lua``: a record waits iff it
is completed or dead and keeps its interval; due at its last transition plus the interval), with the
index of ids of earlier releases (``refetch``) read too while it holds any."""

from __future__ import annotations

from celery_ha.state import TaskQueue
from celery_ha.state.record_store import read_record
from celery_ha.state.records import TaskInfo
from celery_ha.state.refetch_index import waiting_due
from tests.support.invariants import waiting_records


def scheduled_at(q: TaskQueue, tid: str) -> int | None:
    """When ``tid``'s scheduled run is due (ms, Redis clock), None when it waits for none."""
    k = q._shards[q._of(tid)]
    legacy = q.client.zscore(k.refetch, tid)
    if legacy is not None:
        return int(legacy)
    raw = read_record(q.client, k, tid)
    return None if raw is None else waiting_due(TaskInfo.parse(tid, raw))


def waiting(q: TaskQueue) -> list[str]:
    """The ids of every task waiting for a scheduled run, sorted."""
    ids: set[str] = set()
    for k in q._shards:
        ids |= set(waiting_records(q.client, k)) | set(q.client.zrange(k.refetch, 0, -1))
    return sorted(ids)
