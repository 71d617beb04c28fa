"""``enqueue_if_absent``: creating tasks under ids fixed earlier, idempotently (the outbox's door)."""

from __future__ import annotations

import pytest
import redis

from celery_ha import InvalidInput, TaskQueue
from celery_ha.state.done_times import done_hour, done_slot, remembered
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from celery_ha.state.records import Lease
from celery_ha.state.replay import enqueue_if_absent
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until
from tests.support.records import drop_records, record_count
from tests.support.script_calls import script_calls


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, namespace="replay")


def _everything(r: redis.Redis) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        out[key] = (r.hgetall(key) if kind == "hash" else r.zrange(key, 0, -1, withscores=True)
                    if kind == "zset" else r.lrange(key, 0, -1) if kind == "list" else r.smembers(key))
    return out


def test_a_replayed_request_queues_once_with_dedup_or_without(q: TaskQueue, r: redis.Redis) -> None:
    specs = [{"url": "https://example.com/a", "task": "fetch_page", "dedup": True},
             {"url": "https://example.com/a", "task": "fetch_page", "dedup": False, "priority": 5,
              "meta": {"k": 1}, "max_attempts": 7}]
    ids = q.task_ids(specs[:1]) + q.task_ids(specs[1:], dedup=False)
    pairs = list(zip(ids, specs, strict=True))

    assert enqueue_if_absent(q, pairs) == [True, True]
    before = _everything(r)
    assert enqueue_if_absent(q, pairs) == [False, False]  # sent again: nothing new
    after = _everything(r)
    stats_key = "cha:{replay}:stats"
    assert before.pop(stats_key) != after.pop(stats_key)  # only the duplicate counter moved
    assert before == after
    assert sorted(q.ready_ids()) == sorted(ids)
    stats = q.stats()
    assert (stats["queued"], stats["enqueued"], stats["duplicates"]) == (2, 2, 1)  # dedup one counts

    plain = q.get(ids[1])
    assert (plain.url, plain.priority, plain.meta, plain.max_attempts, plain.dedup) == (
        "https://example.com/a", 5, {"k": 1}, 7, False)
    assert q.get(ids[0]).dedup is True
    check_invariants(r, q)


def test_the_record_is_the_one_enqueue_writes(q: TaskQueue, redis_url: str) -> None:
    spec = {"url": "https://example.com/x?b=2&a=1", "task": "crawl_list", "priority": -3,
            "meta": {"page": 2}, "max_attempts": 2, "max_stalls": 1}
    (tid,) = q.task_ids([spec])
    assert enqueue_if_absent(q, [(tid, spec)]) == [True]
    other = TaskQueue.from_url(redis_url, namespace="plain")
    assert other.enqueue(**spec) == tid
    mine, theirs = q.get(tid).as_dict(), other.get(tid).as_dict()
    for info in (mine, theirs):
        info.pop("created_at")
    assert mine == theirs


def test_a_finished_dedup_task_is_not_created_again(q: TaskQueue, r: redis.Redis) -> None:
    (tid,) = q.task_ids(["https://example.com/done"])
    assert enqueue_if_absent(q, [(tid, "https://example.com/done")]) == [True]
    # What a completion leaves once the history is trimmed: the id remembered (hour 1), no record. A
    # replay repeats a request: however long ago the task finished, it is not a recrawl.
    drop_records(r, q.keys)
    r.delete(q.keys.ready_list(0), q.keys.ready_bands)
    r.hset(*done_slot(q.keys.prefix, tid), 1)
    assert enqueue_if_absent(q, [(tid, "https://example.com/done")]) == [False]
    assert q.ready_ids() == [] and record_count(r, q.keys) == 0
    # The same from the sorted set `done` of the layout before, then from a 0.1 release's dedup set,
    # before the sweep moved them.
    r.delete(done_slot(q.keys.prefix, tid)[0])
    r.zadd(q.keys.done, {tid: 1})
    assert enqueue_if_absent(q, [(tid, "https://example.com/done")]) == [False]
    assert q.ready_ids() == [] and record_count(r, q.keys) == 0
    r.delete(q.keys.done)
    r.sadd(q.keys.legacy_seen, tid)
    assert enqueue_if_absent(q, [(tid, "https://example.com/done")]) == [False]
    assert q.ready_ids() == [] and record_count(r, q.keys) == 0


def test_the_same_id_twice_in_one_call_is_created_once(q: TaskQueue) -> None:
    (tid,) = q.task_ids(["https://example.com/twice"], dedup=False)
    spec = {"url": "https://example.com/twice", "dedup": False}
    assert enqueue_if_absent(q, [(tid, spec), (tid, spec)]) == [True, False]
    assert q.ready_ids() == [tid]


@pytest.mark.parametrize("tasks", [
    [("id1", {"url": "ftp://nope"})],
    [("id1", "https://example.com/ok"), ("id2", {"url": "https://example.com/", "priority": 10**6})],
    [("", "https://example.com/")],
    [("x" * 300, "https://example.com/")],
    [("id\n1", "https://example.com/")],
    [("only-an-id",)],
    [("id1", "https://example.com/", "yesterday")],
    [("id1", "https://example.com/", float("nan"))],
    [("id1", "https://example.com/", True)],
    [("id1", "https://example.com/", 1.0, "more")],
    "https://example.com/",
])
def test_bad_input_writes_nothing(q: TaskQueue, r: redis.Redis, tasks: object) -> None:
    with pytest.raises(InvalidInput):
        enqueue_if_absent(q, tasks)  # type: ignore[arg-type]
    assert r.dbsize() == 0


def test_large_replays_go_in_batches(q: TaskQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,500 rows in one replay (the outbox hands over up to 1,000): script calls of at most
    SCRIPT_BATCH rows, so no call keeps Redis busy long at depth."""
    specs = [{"url": f"https://example.com/p/{i}", "dedup": False} for i in range(2500)]
    ids = q.task_ids(specs, dedup=False)
    calls = script_calls(q, monkeypatch)
    assert sum(enqueue_if_absent(q, list(zip(ids, specs, strict=True)))) == 2500
    assert calls.count("enqueue_if_absent") == 2500 // SCRIPT_BATCH
    assert sum(enqueue_if_absent(q, list(zip(ids, specs, strict=True)))) == 0
    assert q.stats()["queued"] == 2500


def _redis_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _run(q: TaskQueue, tid: str, worker: str = "w:1") -> tuple[Lease, int]:
    """Claim and complete ``tid``; the spent lease and when the run finished (ms, Redis clock)."""
    lease = q.claim(tid, worker)
    assert lease is not None
    q.complete(lease)
    info = q.get(tid)
    assert info.state == "completed" and info.updated_at is not None
    return lease, round(info.updated_at * 1000)


def test_a_request_made_past_the_dedup_ttl_starts_a_new_run_its_replay_does_not(redis_url: str,
                                                                                 r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, namespace="replay", dedup_ttl=1)
    url = "https://example.com/daily"
    (tid,) = q.task_ids([url])
    asked = _redis_ms(r) / 1000
    assert enqueue_if_absent(q, [(tid, url, asked)]) == [True]
    first, finished = _run(q, tid)
    wait_until(lambda: _redis_ms(r) > finished + 1000, timeout=10, what="the dedup TTL to pass")
    # The same request again (its reply or its delete was lost): it already ran, after it was made.
    assert enqueue_if_absent(q, [(tid, url, asked)]) == [False]
    assert enqueue_if_absent(q, [(tid, url)]) == [False]  # no request time: a pure replay, as before
    assert q.get(tid).state == "completed" and q.stats()["recrawled"] == 0

    # A new request, made past the TTL: a new run, as enqueue would start it.
    again = _redis_ms(r) / 1000
    spec = {"url": url, "meta": {"run": 2}}
    assert enqueue_if_absent(q, [(tid, spec, again), (tid, spec, again)]) == [True, False]
    info = q.get(tid)
    assert (info.state, info.meta, info.attempts) == ("queued", {"run": 2}, 0)
    assert r.zscore(q.keys.completed, tid) is None and not remembered(r, q.keys, tid)
    assert q.ready_ids() == [tid]
    stats = q.stats()
    assert (stats["recrawled"], stats["enqueued"], stats["duplicates"]) == (1, 2, 3)
    check_invariants(r, q)
    second, _ = _run(q, tid, "w:2")
    assert second.token > first.token  # the earlier run's holder can never match the new lease
    assert enqueue_if_absent(q, [(tid, spec, again)]) == [False]  # its replay, after its run
    assert q.get(tid).state == "completed" and q.stats()["recrawled"] == 1
    check_invariants(r, q)


def test_the_recrawl_window_counts_from_the_request_not_the_push(q: TaskQueue, r: redis.Redis) -> None:
    url = "https://example.com/late"
    (tid,) = q.task_ids([url])
    assert enqueue_if_absent(q, [(tid, url)]) == [True]
    _, finished = _run(q, tid)
    wait_until(lambda: _redis_ms(r) > finished + 50, what="the Redis clock to move on")
    # Pushed now, made before the run finished: no new run, even with a window of 0.
    assert enqueue_if_absent(q, [(tid, url, (finished - 20) / 1000)], recrawl_after=0) == [False]
    # Made 50 ms after the run finished: past a window of 0, within one of 1 s.
    assert enqueue_if_absent(q, [(tid, url, (finished + 50) / 1000)], recrawl_after=1) == [False]
    assert q.get(tid).state == "completed"
    # A request time ahead of the Redis clock counts as now.
    assert enqueue_if_absent(q, [(tid, url, _redis_ms(r) / 1000 + 3600)], recrawl_after=0) == [True]
    assert q.get(tid).state == "queued"
    # Without dedup, a present id is this very task: never a new run.
    (plain,) = q.task_ids([url], dedup=False)
    spec = {"url": url, "dedup": False}
    assert enqueue_if_absent(q, [(plain, spec)]) == [True]
    _run(q, plain)
    assert enqueue_if_absent(q, [(plain, spec, _redis_ms(r) / 1000)], recrawl_after=0) == [False]
    assert q.get(plain).state == "completed"


def test_a_remembered_hour_counts_as_its_end(redis_url: str, r: redis.Redis) -> None:
    """Once the history forgot the record, only the completion hour is known: a request is past the
    window only if the whole hour is (a replay must never start a second run)."""
    q = TaskQueue.from_url(redis_url, namespace="replay", history_max=0)  # the record goes at once
    url = "https://example.com/remembered"
    (tid,) = q.task_ids([url])
    assert enqueue_if_absent(q, [(tid, url)]) == [True]
    lease = q.claim(tid, "w:1")
    assert lease is not None
    q.complete(lease)
    assert record_count(r, q.keys) == 0 and remembered(r, q.keys, tid)
    now = _redis_ms(r)
    r.hset(*done_slot(q.keys.prefix, tid), done_hour(now) - 1)  # finished within the last two hours
    assert enqueue_if_absent(q, [(tid, url, now / 1000)], recrawl_after="1h") == [False]
    assert record_count(r, q.keys) == 0 and remembered(r, q.keys, tid)
    r.hset(*done_slot(q.keys.prefix, tid), done_hour(now) - 2)  # the hour ended over an hour ago
    assert enqueue_if_absent(q, [(tid, url, now / 1000)], recrawl_after="1h") == [True]
    info = q.get(tid)
    assert info.state == "queued" and not remembered(r, q.keys, tid)
    assert q.stats()["recrawled"] == 1
    check_invariants(r, q)
    again = q.claim(tid, "w:2")
    assert again is not None and again.token > max(lease.token, now)  # above every earlier run's token
