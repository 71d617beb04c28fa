"""The wait and runtime histograms the transition scripts count: the bucket grid is the same in Lua
and Python, every claim and completion is counted once, and waits start where the task became ready
(enqueue, retry due, hand-back), not at its dispatch."""

from __future__ import annotations

import math

import pytest
import redis

from celery_ha import LeaseLost
from celery_ha.monitoring.collector import BUCKETS_SECONDS
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.metrics import (
    BUCKETS,
    OVERFLOW,
    Histogram,
    bucket_bound_ms,
    bucket_index,
    parse_histograms,
    read_queue_metrics,
)
from celery_ha.state.records import decode_head, encode_head
from tests.support.records import put_raw_record, raw_record


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "hist", backoff_base=0.001, backoff_cap=0.002)


def _backdate(r: redis.Redis, q: TaskQueue, tid: str, field: str, ms_ago: int) -> None:
    """Move one timestamp of a stored record into the past (the test plays the passing of time)."""
    raw = raw_record(r, q.keys, tid)
    head, _, body = raw.partition("\n")
    st = decode_head(head)
    st[field] = str(redis_now_ms(r) - ms_ago)
    put_raw_record(r, q.keys, tid, encode_head(st) + "\n" + body)


def _fields(r: redis.Redis, q: TaskQueue) -> dict[str, int]:
    return {k: int(v) for k, v in r.hgetall(q.keys.hist).items()}


def test_grid_bounds_and_prometheus_bounds_line_up() -> None:
    assert [bucket_bound_ms(k) for k in range(13)] == [1, 1.2, 1.5, 1.8, 2, 2.5, 3, 3.6, 4, 5, 6, 7.5, 10]
    assert math.isinf(bucket_bound_ms(OVERFLOW)) and BUCKETS == OVERFLOW + 1
    on_grid = {bucket_bound_ms(k) for k in range(OVERFLOW)}
    assert all(le * 1000 in on_grid for le in BUCKETS_SECONDS)  # so every Prometheus count is exact
    assert BUCKETS_SECONDS[-1] == 3600
    assert [bucket_index(ms) for ms in (0, 1, 2, 10, 11, 75, 76, 3_600_000, 10**10)] == [
        0, 0, 4, 12, 13, 23, 24, 79, OVERFLOW]


@pytest.mark.parametrize("ms_ago", [140, 2_200, 47_000, 330_000, 4_200_000, 90_000_000])
def test_lua_buckets_a_wait_where_python_expects(r: redis.Redis, q: TaskQueue, ms_ago: int) -> None:
    tid = q.enqueue(f"https://example.com/{ms_ago}", task="fetch_page")
    _backdate(r, q, tid, "ct", ms_ago)
    assert q.claim_next("w1").task_id == tid
    (field, n), = _fields(r, q).items()
    kind, bucket, task = field.split(":", 2)
    assert (kind, task, n) == ("w", "fetch_page", 1)
    # the claim ran a few ms after the back-dating: the same bucket (all chosen values are mid-bucket)
    assert int(bucket) == bucket_index(ms_ago), (bucket, bucket_index(ms_ago))


def test_every_claim_and_completion_counts_once_by_task_name(r: redis.Redis, q: TaskQueue) -> None:
    q.enqueue_many([f"https://example.com/a{i}" for i in range(7)], task="fetch_page")
    q.enqueue_many([f"https://example.com/b{i}" for i in range(3)], task="crawl_list")
    lease = q.claim_next("w1")
    completed = 0
    while lease is not None:  # complete_and_claim: one script does both observations
        lease = q.complete_and_claim(lease)
        completed += 1
    hist = parse_histograms(r.hgetall(q.keys.hist))
    assert {t: h.count for t, h in hist["wait"].items()} == {"fetch_page": 7, "crawl_list": 3}
    assert {t: h.count for t, h in hist["runtime"].items()} == {"fetch_page": 7, "crawl_list": 3}
    stats = q.stats()
    assert stats["claimed"] == 10 == stats["completed"] == completed
    # refused transitions count nothing
    q.enqueue("https://example.com/late", task="fetch_page")
    stale = q.claim_next("w1")
    q.release(stale.task_id, count_stall=False)
    before = _fields(r, q)
    with pytest.raises(LeaseLost):
        q.complete(stale)
    assert _fields(r, q) == before


def test_a_dispatched_task_waits_from_its_enqueue_not_its_dispatch(r: redis.Redis, q: TaskQueue) -> None:
    tid = q.enqueue("https://example.com/d", task="fetch_page")
    _backdate(r, q, tid, "ct", 47_000)
    assert [d.task_id for d in q.dispatch(window=10)] == [tid]
    assert q.claim(tid, "w1") is not None
    (field,) = _fields(r, q)
    assert int(field.split(":")[1]) == bucket_index(47_000)
    assert "qt" not in decode_head(raw_record(r, q.keys, tid).partition("\n")[0])  # dropped at the claim


def test_a_retry_waits_from_its_due_time_and_a_handed_back_task_from_then(r: redis.Redis, q: TaskQueue
                                                                          ) -> None:
    tid = q.enqueue("https://example.com/r", task="fetch_page")
    q.fail(q.claim_next("w1"), "503", retry=True)
    _backdate(r, q, tid, "due", 330_000)  # due five and a half minutes ago
    r.zadd(q.keys.delayed, {tid: redis_now_ms(r) - 330_000})
    lease = q.claim_next("w1")  # promotes the due retry, then claims it
    assert lease.task_id == tid
    waits = sorted(int(f.split(":")[1]) for f in _fields(r, q) if f.startswith("w:"))
    assert waits[-1] == bucket_index(330_000)
    q.release(tid, count_stall=False)  # handed back now: its next wait starts now
    q.claim_next("w1")
    waits = [int(f.split(":")[1]) for f, n in _fields(r, q).items() if f.startswith("w:") for _ in range(n)]
    assert len(waits) == 3 and min(waits) <= bucket_index(1000)


def test_percentiles_cumulative_counts_and_the_estimated_sum() -> None:
    h = Histogram()
    for ms in [5] * 50 + [100] * 40 + [2000] * 10:
        h.counts[bucket_index(ms)] += 1
    assert h.count == 100
    assert h.quantile(0.5) == pytest.approx(0.005, rel=0.2)
    assert h.quantile(0.9) == pytest.approx(0.1, rel=0.2)
    assert h.quantile(0.99) == pytest.approx(2.0, rel=0.2)
    cumulative = dict(h.cumulative([0.005, 0.1, 1.0]))
    assert cumulative == {0.005: 50, 0.1: 90, 1.0: 90, math.inf: 100}
    exact = (50 * 5 + 40 * 100 + 10 * 2000) / 1000
    assert h.estimated_sum_seconds() == pytest.approx(exact, rel=0.15)
    assert Histogram().quantile(0.5) is None


def test_read_queue_metrics_matches_stats_and_finds_the_oldest_waiting(r: redis.Redis, q: TaskQueue) -> None:
    ids = q.enqueue_many([f"https://example.com/o{i}" for i in range(5)])
    q.enqueue("https://example.com/hi", priority=9)
    _backdate(r, q, ids[2], "ct", 90_000)
    q.fail(q.claim_next("w9"), "gone", retry=False)  # the priority-9 one dies
    m = read_queue_metrics(r, "hist")
    stats = q.stats()
    states = ("queued", "dispatched", "running", "delayed", "completed", "dead")
    assert m.states == {s: stats[s] for s in states}
    assert m.events()["dead"] == 1 and m.events()["claimed"] == stats["claimed"] == 1
    assert 90 <= (m.now_ms - m.oldest_ready_ms) / 1000 < 100
