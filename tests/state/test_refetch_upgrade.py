"""A waiting dead record is told from an earlier release's final death by its form (``refetch_due.lua``,
``_common.lua``'s to_dead): earlier releases kept ``iv`` on a task a permanent failure or a cancel ended,
so after an upgrade such a record must not be queued again when the new index reads its bucket; a
waiting one is always written as a waiting head ('@'), its error texts flattened to one line so that
form holds them. Real Redis."""

from __future__ import annotations

import redis

from celery_ha.state import TaskQueue
from celery_ha.state.records import HEAD_FIELDS, HEAD_SEP, TaskInfo
from tests.support.celery_helpers import wait_for
from tests.support.records import put_raw_record, raw_record


def _queue(redis_url: str, ns: str) -> TaskQueue:
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), ns, max_attempts=1)


def _bucket_of(q: TaskQueue, tid: str) -> str:
    k = q._shards[0]
    for key in q.client.scan_iter(match=k.prefix + "t:*"):
        if q.client.hexists(key, tid):
            return key.rsplit(":", 1)[1]
    raise AssertionError(f"no bucket holds {tid}")


def _refetch_due(q: TaskQueue) -> tuple[int, int, int]:
    queued, dropped, more = (int(x) for x in q._run("refetch_due", 100))
    return queued, dropped, more


def test_an_earlier_releases_final_death_with_iv_is_not_run_again(redis_url: str) -> None:
    q = _queue(redis_url, "up1")
    q.set_schedule("page", every=1)
    tid = q.enqueue("https://site.example/gone", task="page")
    assert q.fail(q.claim_next("w:1"), "404 gone", retry=False) == "dead"
    k = q._shards[0]
    # The record as an earlier release wrote it: dead, its iv kept, the compact head (not '@'), and in
    # no `refetch` entry (its schedule ended); its bucket indexed by a waiting neighbour, long due.
    raw = raw_record(q.client, k, tid)
    assert raw is not None
    head, _, payload = raw.partition("\n")
    fields = head.split(HEAD_SEP) + [""] * len(HEAD_FIELDS)
    fields[HEAD_FIELDS.index("iv")] = "1000"
    ut = HEAD_FIELDS.index("ut")
    fields[ut] = str(int(fields[ut]) - 60_000)  # it died a minute ago: its old interval has passed
    old = HEAD_SEP.join(fields[:HEAD_FIELDS.index("iv") + 1])
    assert not old.startswith("@")
    put_raw_record(q.client, k, tid, old + "\n" + payload)
    assert TaskInfo.parse(tid, raw_record(q.client, k, tid)).state == "dead"
    q.client.zadd(k.prefix + "rfb", {_bucket_of(q, tid): 0})
    assert _refetch_due(q)[0] == 0
    info = q.get(tid)
    assert info.state == "dead" and q.stats()["queued"] == 0
    assert "\x1f1000" not in (raw_record(q.client, k, tid) or "").partition("\n")[0]  # iv dropped


def test_a_waiting_dead_record_with_a_multiline_error_is_run_again(redis_url: str) -> None:
    q = _queue(redis_url, "up2")
    q.set_schedule("page", every=1)
    tid = q.enqueue("https://site.example/flaky", task="page")
    q.complete(q.claim_next("w:1"))
    k = q._shards[0]
    wait_for(lambda: _refetch_due(q)[0] == 1, timeout=10, message="the first scheduled run")
    # Its scheduled run dies of a retryable error whose text spans lines: the schedule is kept.
    assert q.fail(q.claim_next("w:1"), "Traceback:\n  boom\x1fthere", retry=True) == "dead"
    raw = raw_record(q.client, k, tid) or ""
    assert raw.startswith("@"), raw
    assert q.get(tid).error == "Traceback:   boom there"
    wait_for(lambda: _refetch_due(q)[0] == 1, timeout=10, message="the run after the death")
    assert q.get(tid).state == "queued"
