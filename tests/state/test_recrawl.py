"""Dedup expiry and recrawl: a finished URL is a duplicate until its recrawl window passed, a new run
never lets a holder of an earlier run write, and the sweep keeps the remembered ids bounded by the
dedup TTL."""

from __future__ import annotations

import pytest
import redis

from celery_ha.base.errors import ConfigurationError, InvalidInput, LeaseLost
from celery_ha.base.settings import Settings
from celery_ha.base.validation import parse_duration
from celery_ha.state import TaskQueue
from celery_ha.state.done_times import count_remembered, remembered
from celery_ha.state.records import Lease
from celery_ha.state.replies import Refusal
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until
from tests.support.records import raw_record, record_count

URL = "https://example.com/page"


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rc")


def _run_once(q: TaskQueue, url: str = URL) -> Lease:
    """Claim the task of ``url`` and complete it; returns the spent lease."""
    tid = q.task_ids([url])[0]
    lease = q.claim(tid, "w:1")
    assert lease is not None
    q.complete(lease)
    assert q.get(tid).state == "completed"
    return lease


def test_a_finished_url_stays_a_duplicate_without_expiry(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue(URL, meta={"run": 1})
    _run_once(q)
    assert remembered(r, q.keys, tid)  # remembered with its completion time
    assert q.enqueue_many_with_status([URL]) == [(tid, False)]
    assert q.enqueue_many_with_status([URL], recrawl_after="1d") == [(tid, False)]  # not a day old
    assert q.get(tid).state == "completed" and q.stats()["recrawled"] == 0


def test_past_the_window_the_url_is_crawled_again(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue(URL, meta={"run": 1})
    first = _run_once(q)
    # A window of 0: every finished task is past it (the server decides, on its own clock).
    assert q.enqueue_many_with_status([{"url": URL, "meta": {"run": 2}}], recrawl_after=0) == [(tid, True)]
    info = q.get(tid)
    assert (info.state, info.meta, info.attempts, info.stalls) == ("queued", {"run": 2}, 0, 0)
    assert r.zscore(q.keys.completed, tid) is None and not remembered(r, q.keys, tid)
    assert q.ready_ids() == [tid] and q.stats()["recrawled"] == 1
    check_invariants(r, q)
    second = q.claim(tid, "w:2")
    assert second is not None and second.token > first.token
    with pytest.raises(LeaseLost) as lost:  # the earlier run's holder cannot write into the new one
        q.complete(first)
    assert lost.value.code == Refusal.STALE_TOKEN
    q.complete(second)
    assert q.enqueue_many_with_status([URL]) == [(tid, False)]  # no expiry on this queue: duplicate again


def test_live_and_dead_tasks_stay_duplicates_whatever_the_window(q: TaskQueue) -> None:
    queued, running, dead = q.enqueue_many([f"{URL}/{n}" for n in range(3)])
    assert q.claim(running, "w:1") is not None
    doomed = q.claim(dead, "w:1")
    assert doomed is not None and q.fail(doomed, "gone", retry=False) == "dead"
    again = q.enqueue_many_with_status([f"{URL}/{n}" for n in range(3)], recrawl_after=0)
    assert again == [(queued, False), (running, False), (dead, False)]
    assert [q.get(t).state for t in (queued, running, dead)] == ["queued", "running", "dead"]


def test_a_url_the_history_forgot_starts_above_every_earlier_token(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rc0", history_max=0)
    tid = q.enqueue(URL)
    lease = q.claim(tid, "w:1")
    assert lease is not None
    q.complete(lease)  # history_max=0: the record is dropped at once
    assert raw_record(r, q.keys, tid) is None and remembered(r, q.keys, tid)
    assert q.enqueue_many_with_status([URL], recrawl_after=0) == [(tid, True)]
    fresh = q.claim(tid, "w:2")
    assert fresh is not None and fresh.token > lease.token
    with pytest.raises(LeaseLost):
        q.complete(lease)
    check_invariants(r, q)



def test_a_url_the_dedup_sweep_forgot_starts_above_the_tokens_of_its_earlier_runs(
        redis_url: str, r: redis.Redis) -> None:
    """The sweep forgets a finished id past the dedup TTL (its record long gone): enqueued again it is
    a new task without a trace of its earlier runs, whose holders may still be alive (a zombie woken
    after its lease). Its first lease's token comes from the Redis clock, above theirs: the zombie
    can renew, commit, checkpoint and complete nothing (it used to get token 1 again)."""
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rc2", history_max=0, dedup_ttl=1)
    tid = q.enqueue(URL)
    zombie = q.claim(tid, "w:1", ttl=0.05)  # its holder stops here, past its lease
    assert zombie is not None
    wait_until(lambda: q.reclaim_expired() >= 0 and q.get(tid).state == "queued", 10, 0.02,
               "the zombie's lease reclaimed")
    second = q.claim(tid, "w:2")
    assert second is not None and second.token > zombie.token
    q.complete(second)  # history_max=0: the record leaves at once
    wait_until(lambda: q.forget_finished() >= 0 and not remembered(r, q.keys, tid), 10, 0.05,
               "the sweep to forget the id (TTL 1 s)")
    assert q.enqueue_many_with_status([URL]) == [(tid, True)]  # a new task, as if never seen
    third = q.claim(tid, "w:3")
    assert third is not None and third.token > second.token > zombie.token
    for write in (lambda: q.renew(zombie), lambda: q.commit(zombie, [("k", {"by": "zombie"})], {"at": 9}),
                  lambda: q.complete(zombie)):
        with pytest.raises(LeaseLost):
            write()
    assert q.commit(third, [("k", {"by": "third"})]) == 1
    q.complete(third)
    check_invariants(r, q)

def test_the_queue_default_window_comes_from_the_dedup_ttl(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = TaskQueue(client, "rc1", dedup_ttl=0)
    tid = q.enqueue(URL)
    _run_once(q)
    assert q.enqueue_many_with_status([URL]) == [(tid, True)]
    assert q.enqueue_many_with_status([URL]) == [(tid, False)]  # queued now: a live duplicate
    assert TaskQueue(client, "rc1", dedup_ttl="7d").dedup_ttl == 604800  # a duration, as the setting
    for bad in (-5, "soon", True):
        with pytest.raises(InvalidInput):
            TaskQueue(client, "rc1", dedup_ttl=bad)
    with pytest.raises(InvalidInput):
        q.enqueue(URL, recrawl_after="soon")


def test_recrawl_by_id(q: TaskQueue, r: redis.Redis) -> None:
    done_id, live_id = q.enqueue_many([URL, f"{URL}/live"])
    first = _run_once(q)
    assert q.recrawl([done_id, live_id, "nosuchid0001", done_id]) == {
        done_id: "queued", live_id: "not completed", "nosuchid0001": "unknown"}
    info = q.get(done_id)
    assert info.state == "queued" and info.url == URL
    assert not remembered(r, q.keys, done_id) and r.zscore(q.keys.completed, done_id) is None
    assert q.recrawl([done_id]) == {done_id: "not completed"}  # queued already
    assert q.stats()["recrawled"] == 1
    check_invariants(r, q)
    lease = q.claim(done_id, "w:2")
    assert lease is not None and lease.token > first.token


def test_recrawl_on_a_sharded_namespace(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "rcs", shards=3)
    urls = [f"{URL}/{n}" for n in range(12)]
    ids = q.enqueue_many(urls)
    for tid in ids:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.complete(lease)
    assert set(q.recrawl(ids).values()) == {"queued"}
    assert sorted(q.ready_ids()) == sorted(ids) and q.stats()["queued"] == 12


def test_the_sweep_forgets_finished_ids_past_the_ttl_once_the_history_let_go(redis_url: str,
                                                                             r: redis.Redis) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    kept = TaskQueue(client, "keep", dedup_ttl=0)  # the history (10,000 records) holds it
    tid = kept.enqueue(URL)
    _run_once(kept)
    assert kept.forget_finished() == 0 and remembered(r, kept.keys, tid)
    trimmed = TaskQueue(client, "trim", dedup_ttl=0, history_max=0)
    tids = trimmed.enqueue_many([f"{URL}/{n}" for n in range(5)])
    for t in tids:
        lease = trimmed.claim(t, "w:1")
        assert lease is not None
        trimmed.complete(lease)
    assert count_remembered(r, trimmed.keys) == 5 and record_count(r, trimmed.keys) == 0
    assert trimmed.forget_finished(batch=2) == 5  # several bounded rounds
    assert count_remembered(r, trimmed.keys) == 0
    forever = TaskQueue(client, "trim", history_max=0)  # no TTL: nothing is forgotten
    lease = forever.claim(forever.enqueue(f"{URL}/x"), "w:1")
    assert lease is not None
    forever.complete(lease)
    assert forever.forget_finished() == 0 and count_remembered(r, forever.keys) == 1


def test_a_dedup_set_of_a_0_1_release_is_honoured_then_moved(q: TaskQueue, r: redis.Redis) -> None:
    (tid,) = q.task_ids([URL])
    r.sadd(q.keys.legacy_seen, tid, *[f"old{n:09d}" for n in range(30)])
    assert q.enqueue_many_with_status([URL]) == [(tid, False)]  # finished before the upgrade
    assert q.forget_finished(batch=7) == 31
    assert not r.exists(q.keys.legacy_seen) and count_remembered(r, q.keys) == 31
    assert q.enqueue_many_with_status([URL]) == [(tid, False)]
    assert q.enqueue_many_with_status([URL], recrawl_after=0) == [(tid, True)]  # it has a time now


def test_durations_and_the_setting() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "15m", "6h", "7d", "2w", "1.5h", 30)] == [
        90, 90, 900, 21600, 604800, 1209600, 5400, 30]
    for bad in ("", "soon", "-1", "5y", "1e3", True, None, "99999999999w"):
        with pytest.raises(InvalidInput):
            parse_duration(bad)
    assert Settings.from_env({"CELERY_HA_DEDUP_TTL": "7d"}).dedup_ttl == 604800
    assert Settings.from_env({"CELERY_HA_DEDUP_TTL": "never"}).dedup_ttl is None
    assert Settings.from_env({}).dedup_ttl is None
    with pytest.raises(ConfigurationError, match="CELERY_HA_DEDUP_TTL"):
        Settings.from_env({"CELERY_HA_DEDUP_TTL": "a while"})
