"""The refetch index by record bucket (``_refetch.lua``, ``rfb``): a scheduled completion writes no id
anywhere but its own record (no `refetch` member, no remembered dedup id), the index holds record
buckets with a lower bound of their waiting records' due times, refetch_due reads the due buckets and
queues exactly the due runs in bounded calls, a split keeps moved waiting records indexed, the
history's trim keeps waiting records (decided from the records), the index of ids of earlier releases
is still served, and a waiting dedup URL stays a duplicate through its record. Real Redis."""

from __future__ import annotations

import time

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.done_times import finished_at, remembered
from celery_ha.state.metrics import read_queue_metrics
from celery_ha.state.record_store import bucket_count
from celery_ha.state.records import HEAD_SEP, encode_head
from tests.support.celery_helpers import wait_for
from tests.support.invariants import check_invariants, check_refetch_index
from tests.support.records import has_record, put_raw_record
from tests.support.refetch import scheduled_at, waiting


def _queue(redis_url: str, ns: str, **kw: object) -> TaskQueue:
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), ns, **kw)


def _drain(q: TaskQueue) -> int:
    """Claim and complete every queued task (the real completion path); returns how many."""
    n = 0
    lease = q.claim_next("w:1")
    while lease is not None:
        n += 1
        lease = q.complete_and_claim(lease)
    return n


def _due_calls(q: TaskQueue, limit: int) -> list[tuple[int, int, int]]:
    """refetch_due.lua called until it says nothing more is due: each call's reply."""
    replies = []
    while True:
        queued, dropped, more = (int(x) for x in q._run("refetch_due", limit))
        replies.append((queued, dropped, more))
        if not more:
            return replies
        assert len(replies) < 10_000, "refetch_due never ends"


def test_scheduled_completions_index_buckets_not_ids(redis_url: str) -> None:
    """(a) No `refetch` member and no remembered id per scheduled URL; at most one index entry per
    bucket; the due runs, and only those, are queued by bounded calls; the counts are exact."""
    q = _queue(redis_url, "ri", history_max=10)
    q.set_schedule("soon", every=1)
    q.set_schedule("later", every="1d")
    soon = q.enqueue_many([f"https://s{i % 7}.example/soon/{i}" for i in range(120)], task="soon")
    later = q.enqueue_many([f"https://s{i % 7}.example/later/{i}" for i in range(300)], task="later")
    assert _drain(q) == 420
    r = q.client
    assert r.zcard(q.keys.refetch) == 0 and not r.exists(q.keys.refetch)  # nothing per id
    assert not any(remembered(r, q.keys, tid) for tid in soon + later)  # the record is the dedup memory
    assert q.stats()["remembered"] == 0 and q.stats()["refetch_waiting"] == 420
    index = r.zrange(q.keys.refetch_buckets, 0, -1)
    assert 0 < len(index) <= bucket_count(r, q.keys) and len(set(index)) == len(index)
    assert all(0 <= int(b) < bucket_count(r, q.keys) for b in index)
    assert sorted(waiting(q)) == sorted(soon + later) and q.refetch_pending()["waiting"] == 420
    check_invariants(r, q)

    wait_for(lambda: q.refetch_pending()["due"] == 120, timeout=10, message="the 1-second runs due")
    calls = _due_calls(q, 7)
    assert all(queued <= 7 for queued, _, _ in calls) and sum(c[0] for c in calls) == 120
    assert len(calls) >= 120 // 7
    states = {t.id: t.state for t in q.get_many(soon + later) if t is not None}
    assert all(states[t] == "queued" for t in soon) and all(states[t] == "completed" for t in later)
    assert q.refetch_pending() == {"waiting": 300, "due": 0} and q.stats()["refetched"] == 120
    assert read_queue_metrics(r, q.namespace).refetch == {"waiting": 300, "due": 0}
    check_invariants(r, q)
    # The buckets that held only due runs left the index; the others score their earliest run left.
    for b, score in r.zrange(q.keys.refetch_buckets, 0, -1, withscores=True):
        assert score > time.time() * 1000 + 3600_000, (b, score)
    assert _drain(q) == 120  # they complete, and wait again
    assert q.refetch_pending()["waiting"] == 420
    check_invariants(r, q)


def test_the_index_of_earlier_releases_is_still_served(redis_url: str) -> None:
    """(b) A `refetch` zset of ids written by an earlier release: its due ids are queued, its ids that
    no longer wait are dropped, its waiting records survive the history's trim and stay duplicates."""
    q = _queue(redis_url, "rl", history_max=0)
    r = q.client
    now = int(r.time()[0]) * 1000
    waits, future, gone = "OLDWAITING01", "OLDWAITING02", "OLDQUEUED001"
    for tid, ut in ((waits, now - 90_000), (future, now)):
        head = encode_head({"s": "c", "ct": str(ut - 5), "dd": "1", "ut": str(ut), "k": str(ut - 1),
                            "iv": "60000"})
        put_raw_record(r, q.keys, tid, f"{head}\n//old.example/{tid}")
        r.zadd(q.keys.completed, {tid: ut})
        r.zadd(q.keys.refetch, {tid: ut + 60_000})
    put_raw_record(r, q.keys, gone, f"Q{HEAD_SEP}{now}\n//old.example/q")
    r.zadd(q.keys.refetch, {gone: 0})  # a stale entry (its record is queued now)
    # The history's trim (history_max 0: the next completion trims) keeps both waiting records.
    plain = q.enqueue("https://new.example/1")
    assert _drain(q) == 1 and not has_record(r, q.keys, plain)
    assert has_record(r, q.keys, waits) and has_record(r, q.keys, future)
    assert r.zcard(q.keys.completed) == 0
    assert q.refetch_pending() == {"waiting": 3, "due": 2}  # the stale entry counts until dropped
    assert q._run("refetch_due", 10) == [1, 1, 0]
    assert q.get(waits).state == "queued" and q.get(future).state == "completed"
    assert r.zrange(q.keys.refetch, 0, -1) == [future]
    assert q.refetch_pending() == {"waiting": 1, "due": 0}
    assert sorted(waiting(q)) == [future]


def test_a_split_keeps_moved_waiting_records_indexed(redis_url: str) -> None:
    """(c) Records waiting in a bucket that splits move with the bucket's index entry: each stays
    indexed at or below its due time, and its run comes when due."""
    q = _queue(redis_url, "rs", history_max=5)
    q.set_schedule("page", every=2)
    ids = q.enqueue_many([f"https://a.example/p/{i}" for i in range(64)], task="page")
    _drain(q)
    buckets_before = bucket_count(q.client, q.keys)
    check_refetch_index(q.client, q.keys)
    # Many new records (no schedule, still queued) split every bucket, most more than once.
    for start in range(0, 3000, 500):
        q.enqueue_many([f"https://b.example/q/{i}" for i in range(start, start + 500)])
    assert bucket_count(q.client, q.keys) >= 8 * buckets_before
    check_refetch_index(q.client, q.keys)  # every waiting record's (new) bucket indexed
    queued = [0]

    def all_queued() -> bool:
        queued[0] += sum(c[0] for c in _due_calls(q, 250))
        return queued[0] >= 64

    wait_for(all_queued, timeout=10, message="the 64 runs")
    assert queued[0] == 64 and {t.state for t in q.get_many(ids) if t is not None} == {"queued"}
    assert q.client.zcard(q.keys.refetch_buckets) == 0  # every entry read and dropped
    check_invariants(q.client, q)


def test_the_trim_never_deletes_a_waiting_record(redis_url: str) -> None:
    """(d) The completed history's trim decides from the records: a waiting record stays (completed
    long ago, out of the history), a plain one goes."""
    q = _queue(redis_url, "rt", history_max=3)
    q.set_schedule("list", every="1d")
    lists = q.enqueue_many([f"https://shop.example/list/{i}" for i in range(40)], task="list")
    pages = q.enqueue_many([f"https://shop.example/page/{i}" for i in range(40)], task="page")
    assert _drain(q) == 80
    assert all(has_record(q.client, q.keys, t) for t in lists)
    assert sum(has_record(q.client, q.keys, t) for t in pages) <= 3 + 16
    assert q.client.zcard(q.keys.completed) <= 3 + 16
    assert {t.state for t in q.get_many(lists)} == {"completed"}
    check_invariants(q.client, q)


def test_a_waiting_dedup_url_is_a_duplicate_then_remembered(redis_url: str) -> None:
    """(e) While its record waits, a dedup URL is a duplicate through the record (no remembered id);
    once it stops waiting (its schedule unset: the next run completes without one) and the history
    trims it, it is remembered, still a duplicate."""
    q = _queue(redis_url, "rd", history_max=0)
    q.set_schedule("page", every=1)
    url = "https://shop.example/p/1"
    tid = q.enqueue(url, task="page")
    _drain(q)
    r = q.client
    assert scheduled_at(q, tid) is not None and not remembered(r, q.keys, tid)
    assert r.zscore(q.keys.completed, tid) is None  # history_max 0: out of the history already
    assert q.enqueue_many_with_status([url], task="page") == [(tid, False)]  # a duplicate
    assert q.enqueue_many_with_status([url], task="page", recrawl_after=3600) == [(tid, False)]
    [done] = finished_at(r, q.namespace, 1, [tid])
    assert done == int(q.get(tid).updated_at * 1000)  # its record's completion time
    check_invariants(r, q)

    q.unset_schedule("page")
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="its last scheduled run")
    _drain(q)  # completes without a schedule: not waiting, remembered, trimmed
    assert scheduled_at(q, tid) is None and not has_record(r, q.keys, tid)
    assert remembered(r, q.keys, tid) and q.stats()["remembered"] == 1
    assert q.enqueue_many_with_status([url], task="page") == [(tid, False)]
    assert q.stats()["refetch_waiting"] == 0
    check_invariants(r, q)


@pytest.mark.parametrize("how", ["fail", "cancel"])
def test_a_final_end_clears_the_interval(redis_url: str, how: str) -> None:
    """A permanent failure or a cancel ends the schedule: the dead record keeps no interval, so it
    waits for nothing and is not indexed (a dead record with an interval would wait)."""
    q = _queue(redis_url, "rf" + how, history_max=5)
    q.set_schedule("page", every=1)
    tid = q.enqueue("https://shop.example/x", task="page")
    _drain(q)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="its scheduled run")
    if how == "fail":
        lease = q.claim(tid, "w:1")
        assert lease is not None and q.fail(lease, "HTTP 404", retry=False) == "dead"
    else:
        assert q.cancel(tid, "not wanted") == "queued"
    info = q.get(tid)
    assert info.state == "dead" and info.refetch_every is None and scheduled_at(q, tid) is None
    assert q.refetch_pending()["waiting"] == 0
    check_invariants(q.client, q)
