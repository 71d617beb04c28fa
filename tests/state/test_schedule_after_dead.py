"""A scheduled task that dies for a reason that may pass (its retries spent on retryable errors, its
stalls past max_stalls) keeps its next regular run: it stays dead (listed, counted, redrivable) and
waits in the refetch index one interval after its death; refetch_due queues it then as a new run
(attempts and stalls reset, out of `dead`). A permanent failure and a cancel end the schedule; a
redrive, a recrawl and a purge leave no stale or second entry. Real Redis, the real scripts."""

from __future__ import annotations

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.host_queues import host_queue_ids
from celery_ha.state.migrate import Migration
from celery_ha.state.purge import purge_namespace
from celery_ha.state.records import Lease, decode_head
from tests.support.celery_helpers import wait_for
from tests.support.invariants import check_hosts, check_refetch_index, membership
from tests.support.records import all_records
from tests.support.refetch import scheduled_at, waiting

URL = "https://shop.example/list"


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    # No backoff: a failed attempt's retry is due at once (claim_next promotes it).
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sd", history_max=2,
                     backoff_base=0, backoff_cap=0)


@pytest.fixture
def q1(redis_url: str) -> TaskQueue:
    """One attempt per run: its first retryable failure spends them (never delayed)."""
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sd", history_max=2,
                     max_attempts=1)


def _claim(q: TaskQueue, tid: str) -> Lease:
    """A lease on ``tid``: claimed by id when queued; a retry due at once (no backoff) is promoted by
    claim_next (the tests with several tasks keep one attempt per run, so none is ever delayed)."""
    lease = q.claim(tid, "w:1") if q.get(tid).state == "queued" else q.claim_next("w:1")
    assert lease is not None and lease.task_id == tid, (lease, q.get(tid))
    return lease


def _finish(q: TaskQueue, tid: str, verdict: str = "") -> None:
    lease = _claim(q, tid)
    lease.verdict = verdict
    q.complete(lease)


def _fail_until_dead(q: TaskQueue, tid: str, error: str = "FetchError: HTTP 503") -> None:
    """Spend every attempt on a retryable error (a site that answers 503)."""
    for attempt in range(1, q.max_attempts + 1):
        got = q.fail(_claim(q, tid), error, retry=True)
        assert got == ("dead" if attempt == q.max_attempts else "retry")


def _stall_until_dead(q: TaskQueue, tid: str) -> None:
    """Every holder dies (a crashed pool child): a stall each, dead past max_stalls."""
    for stall in range(1, q.max_stalls + 2):
        lease = _claim(q, tid)
        got = q.release(tid, token=lease.token, worker="w:1", count_stall=True, reason="pool child died")
        assert got == ("dead" if stall == q.max_stalls + 1 else "queued")


def _due_in(q: TaskQueue, tid: str) -> float | None:
    """Seconds (Redis clock) until the task's scheduled run, None when it waits for none."""
    score = scheduled_at(q, tid)
    if score is None:
        return None
    seconds, micros = q.client.time()
    return score / 1000 - (int(seconds) + int(micros) / 1e6)


def _check(q: TaskQueue) -> dict[str, str]:
    """DESIGN §2's invariants with scheduled dead tasks: every task sits in the one structure its
    state names (a completed one the history let go of may sit in none while it waits for its run),
    the refetch index holds only completed and dead tasks, the dead count is the dead records', the
    host gate's books agree."""
    r = q.client
    where = membership(r, q)
    location = {tid: name for name, ids in where.items() for tid in ids}
    assert sum(map(len, where.values())) == len(location), f"an id in two places: {where}"
    states = {tid: decode_head(raw.partition("\n")[0])["s"] for tid, raw in all_records(r, q.keys)}
    scheduled = set().union(*(check_refetch_index(r, k) for k in q._shards))  # the index agrees
    structure = {"q": "ready", "d": "inflight", "r": "running", "w": "delayed", "x": "dead", "c": "completed"}
    for tid, s in states.items():
        if s == "c" and tid in scheduled and tid not in location:
            continue
        assert location.get(tid) == structure[s], f"{tid} is {s!r} but sits in {location.get(tid)!r}"
    for tid in scheduled:
        assert states.get(tid) in ("c", "x"), f"{tid} waits for a scheduled run but is {states.get(tid)!r}"
    assert q.stats()["dead"] == sum(1 for s in states.values() if s == "x")
    check_hosts(r, q)
    return states


def test_retries_spent_on_an_outage_keep_the_next_regular_run(q: TaskQueue) -> None:
    q.set_schedule("page", every=2)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _fail_until_dead(q, tid)  # the site is down for this run

    info = q.get(tid)
    assert info.state == "dead" and info.error == "FetchError: HTTP 503" and info.attempts == 3
    assert [t.id for t in q.dead()] == [tid] and q.stats()["dead"] == 1  # visible, counted
    due = _due_in(q, tid)
    assert due is not None and 1.0 < due <= 2.0, due  # its next regular run: an interval after its death
    assert q.refetch_pending()["waiting"] == 1
    assert q.enqueue(URL, task="page") == tid and q.stats()["duplicates"] == 1  # still a live duplicate
    _check(q)

    assert q.refetch_due() == 0 and q.get(tid).state == "dead"  # not before its time
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the run after the death")
    info = q.get(tid)
    assert info.state == "queued" and info.attempts == 0 and info.stalls == 0 and info.error is None
    assert info.previous_error == "FetchError: HTTP 503"
    stats = q.stats()
    assert stats["dead"] == 0 and stats["refetched"] == 2 and stats["redriven"] == 0
    assert q.dead() == [] and _due_in(q, tid) is None
    _check(q)

    _finish(q, tid)  # the site is back: the run completes and schedules the next one
    assert q.get(tid).state == "completed" and 0 < (_due_in(q, tid) or 0) <= 2.0
    assert waiting(q) == [tid]
    _check(q)


def test_stalls_past_max_stalls_keep_the_next_regular_run(q: TaskQueue) -> None:
    q.set_schedule("page", every=1)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _stall_until_dead(q, tid)
    info = q.get(tid)
    assert info.state == "dead" and info.stalls == 4 and info.error.startswith("stalled 4 times")
    assert _due_in(q, tid) is not None
    _check(q)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the run after the death")
    info = q.get(tid)
    assert (info.state, info.stalls, info.attempts) == ("queued", 0, 0)
    _finish(q, tid)
    assert q.get(tid).state == "completed" and _due_in(q, tid) is not None


def test_an_expired_lease_past_max_stalls_keeps_the_next_regular_run(redis_url: str) -> None:
    """The sweep's reclaim (reclaim.lua) kills through the same to_dead."""
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sr", max_stalls=0,
                  lease_ttl=0.2)
    q.set_schedule("page", every=1)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _claim(q, tid)  # its holder vanishes: the lease expires
    wait_for(lambda: q.reclaim_expired() == 1, timeout=10, message="the expired lease")
    assert q.get(tid).state == "dead" and _due_in(q, tid) is not None
    _check(q)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the run after the death")
    assert q.get(tid).state == "queued" and q.stats()["dead"] == 0


def test_a_permanent_failure_or_a_cancel_ends_the_schedule(q1: TaskQueue) -> None:
    q = q1
    q.set_schedule("page", every=1)
    gone, cancelled, flaky = q.enqueue_many(["https://shop.example/gone", "https://shop.example/c",
                                             "https://shop.example/flaky"], task="page")
    for tid in (gone, cancelled, flaky):
        _finish(q, tid)
    wait_for(lambda: q.refetch_pending()["due"] == 3, timeout=10, message="three due runs")
    assert q.refetch_due() == 3
    assert q.fail(_claim(q, gone), "PermanentFetchError: HTTP 404", retry=False) == "dead"
    assert q.cancel(cancelled, "not wanted any more") == "queued"
    _fail_until_dead(q, flaky)
    assert _due_in(q, gone) is None and _due_in(q, cancelled) is None  # their schedule ended
    assert _due_in(q, flaky) is not None  # an outage's death keeps it
    _check(q)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the flaky page's run")
    assert q.refetch_pending() == {"waiting": 0, "due": 0}
    assert (q.get(gone).state, q.get(cancelled).state, q.get(flaky).state) == ("dead", "dead", "queued")
    assert q.stats()["dead"] == 2


def test_a_redrive_leaves_no_stale_entry(q1: TaskQueue) -> None:
    q = q1
    q.set_schedule("page", every=1)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _fail_until_dead(q, tid)
    assert _due_in(q, tid) is not None
    assert q.redrive(tid) == 1  # the operator's run is its next one
    assert _due_in(q, tid) is None and q.get(tid).state == "queued"
    _check(q)
    # That run fails for good: nothing may bring the task back (a stale entry would queue it again).
    assert q.fail(_claim(q, tid), "PermanentFetchError: HTTP 410", retry=False) == "dead"
    assert waiting(q) == [] and q.refetch_due() == 0
    assert q.get(tid).state == "dead" and q.stats()["dead"] == 1

    # A redrive of all dead tasks the same way; the redriven run completes: one entry, its next run.
    other = q.enqueue("https://shop.example/other", task="page")
    _finish(q, other)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the other page's run")
    _stall_until_dead(q, other)
    assert _due_in(q, other) is not None
    assert q.redrive() == 2 and waiting(q) == []
    _finish(q, tid)
    _finish(q, other)
    assert len(waiting(q)) == 2 and q.stats()["dead"] == 0
    _check(q)


def test_a_recrawl_leaves_a_dead_task_and_its_run_alone(q: TaskQueue) -> None:
    q.set_schedule("page", every=1)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _fail_until_dead(q, tid)
    assert q.recrawl([tid]) == {tid: "not completed"}
    assert waiting(q) == [tid]  # one waiting run, its own
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the run after the death")
    assert q.recrawl([tid]) == {tid: "not completed"}  # queued now: a recrawl adds nothing
    assert waiting(q) == []
    _finish(q, tid)
    assert q.recrawl([tid]) == {tid: "queued"} and waiting(q) == []
    _check(q)


def test_a_purge_removes_the_waiting_run(q: TaskQueue) -> None:
    q.set_schedule("page", every=60)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    assert q.recrawl([tid]) == {tid: "queued"}
    _fail_until_dead(q, tid)
    assert _due_in(q, tid) is not None
    purge_namespace(q.client, "sd")
    assert not list(q.client.scan_iter(q.keys.prefix + "*"))


def test_an_unset_schedule_ends_at_the_death_and_an_adaptive_interval_stays(q1: TaskQueue) -> None:
    q = q1
    q.set_schedule("page", every=100, min_every=60, max_every=200, adaptive=True)
    q.set_schedule("list", every=100)
    page, lst = q.enqueue(URL, task="page"), q.enqueue("https://shop.example/l", task="list")
    _finish(q, page, "aaaa")  # the first signature: no verdict, 100 s
    _finish(q, lst)
    assert q.recrawl([page]) == {page: "queued"}
    _finish(q, page, "aaaa")  # unchanged: x1.4
    assert q.recrawl([page, lst]) == {page: "queued", lst: "queued"}
    q.unset_schedule("list")  # applies from its next completion, or death
    _fail_until_dead(q, page)
    _fail_until_dead(q, lst)
    assert q.get(page).refetch_every == 140 and 138 < (_due_in(q, page) or 0) <= 140
    assert _due_in(q, lst) is None and q.get(lst).refetch_every is None


def test_a_gated_task_comes_back_through_its_host_queue(redis_url: str) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "sg", host_gate=True,
                  backoff_base=0, backoff_cap=0)
    q.set_schedule(host="slow.example", every=1)
    tid = q.enqueue("https://slow.example/a", task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _fail_until_dead(q, tid)
    host = q.hosts.get("slow.example")
    assert (host.dead, host.done, host.running) == (1, 1, 0)
    _check(q)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the run after the death")
    assert tid in host_queue_ids(q.client, q.keys, "slow.example")
    assert q.hosts.get("slow.example").dead == 1  # it counts deaths (a lifetime counter, as done)
    _check(q)
    _finish(q, tid)
    assert q.hosts.get("slow.example").done == 2 and _due_in(q, tid) is not None


def test_a_migration_carries_a_dead_tasks_waiting_run(q: TaskQueue) -> None:
    """`celery-ha migrate` moves a dead scheduled task with its waiting run (the row's refetch time):
    in the new namespace it is dead, waits for the same run, and that run queues it."""
    q.set_schedule("page", every=2)
    tid = q.enqueue(URL, task="page")
    _finish(q, tid)
    wait_for(lambda: q.refetch_due() == 1, timeout=10, message="the first scheduled run")
    _fail_until_dead(q, tid)
    due = scheduled_at(q, tid)
    assert due is not None

    Migration(q.client, "sd", "sd2", 1).run()
    dst = TaskQueue(q.client, "sd2", history_max=2)
    (moved,) = [t.id for t in dst.dead()]
    assert scheduled_at(dst, moved) == due
    _check(dst)
    wait_for(lambda: dst.refetch_due() == 1, timeout=10, message="the waiting run, in the new namespace")
    assert dst.get(moved).state == "queued"
