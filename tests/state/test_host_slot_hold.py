"""A host's slot outlives a task whose request may still be in flight (``_hosts.lua`` host_hold, against
a real Redis).

Under a concurrency limit, a request the gate lets go with a task id and an in-flight bound is marked
(``h:<host>`` field ``f:<id>``) until its answer is reported (``finished``) or it is known never to
have gone (``unsent``). A release or a reclaim of the task with the mark still there (its holder
killed mid-request, or stopped past its lease) keeps the slot taken until the bound has passed
(``x:<id>:<token>``): the site may still be answering. A reported request frees it at once, as before.
The chaos runs with real workers and a real slow site are ``tests/chaos/test_host_slots_after_kill.py``.
"""

from __future__ import annotations

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.records import Lease
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until

HOST = "a.example"


@pytest.fixture
def gq(redis_url: str) -> TaskQueue:
    q = TaskQueue.from_url(redis_url, lease_ttl=30, host_gate=True)
    q.hosts.set(HOST, concurrency=1)
    q.enqueue_many([f"http://{HOST}/p/{i}" for i in range(3)])
    return q


def marks(r: redis.Redis, q: TaskQueue) -> dict[str, str]:
    """The host's in-flight marks and held slots."""
    return {f: v for f, v in r.hgetall(q.keys.host_state(HOST)).items() if f[:2] in ("f:", "x:")}


def held_until(r: redis.Redis, q: TaskQueue, lease: Lease) -> int:
    return int(r.hget(q.keys.host_state(HOST), f"x:{lease.task_id}:{lease.token}") or 0)


def test_a_release_with_a_request_unreported_holds_the_slot_until_the_request_may_be_over(
        gq: TaskQueue, r: redis.Redis) -> None:
    lease = gq.claim_next("w:1")
    assert lease is not None and gq.claim_next("w:2") is None  # concurrency 1
    before = redis_now_ms(r)
    assert gq.hosts.request(HOST, lease, in_flight=1.5) == 0.0
    mark = r.hget(gq.keys.host_state(HOST), f"f:{lease.task_id}")
    token, until = mark.split(":")
    assert token == str(lease.token) and before + 1500 <= int(until) <= redis_now_ms(r) + 1500
    # Its holder died mid-request (fast failover): the task is queued again, the slot stays taken.
    assert gq.release(lease.task_id, token=lease.token, worker="w:1", count_stall=True) == "queued"
    assert held_until(r, gq, lease) == int(until)
    assert f"f:{lease.task_id}" not in marks(r, gq)
    assert gq.claim_next("w:2") is None
    info = gq.hosts.get(HOST)
    assert (info.running, info.state) == (0, "full")
    assert r.zscore(gq.keys.hosts_wait, HOST) == int(until)  # due when the hold ends, not after an event
    check_invariants(r, gq)
    nxt = wait_until(lambda: gq.claim_next("w:2"), timeout=10, what="the held slot to come back")
    assert redis_now_ms(r) >= int(until)
    assert nxt.task_id == lease.task_id  # released to the front of its host's queue
    check_invariants(r, gq)


@pytest.mark.parametrize("report", ["finished", "unsent"])
def test_a_reported_request_leaves_nothing_held(gq: TaskQueue, r: redis.Redis, report: str) -> None:
    lease = gq.claim_next("w:1")
    assert gq.hosts.request(HOST, lease, in_flight=60) == 0.0
    assert f"f:{lease.task_id}" in marks(r, gq)
    getattr(gq.hosts, report)(HOST, lease)
    assert marks(r, gq) == {}
    gq.release(lease.task_id, token=lease.token, worker="w:1", count_stall=True)
    assert gq.claim_next("w:2") is not None  # at once
    check_invariants(r, gq)


def test_a_completion_frees_the_slot_at_once(gq: TaskQueue, r: redis.Redis) -> None:
    lease = gq.claim_next("w:1")
    assert gq.hosts.request(HOST, lease, in_flight=60) == 0.0
    gq.hosts.finished(HOST, lease)
    gq.complete(lease)
    assert gq.claim_next("w:2") is not None
    assert marks(r, gq) == {}
    check_invariants(r, gq)


def test_a_reclaimed_lease_holds_the_slot_and_the_zombies_answer_frees_it(gq: TaskQueue, r: redis.Redis
                                                                          ) -> None:
    lease = gq.claim_next("w:1", ttl=0.2)
    assert gq.hosts.request(HOST, lease, in_flight=60) == 0.0
    wait_until(lambda: gq.reclaim_expired() == 1, timeout=10, what="the lease reclaimed")
    assert held_until(r, gq, lease) > redis_now_ms(r) + 50_000
    assert gq.claim_next("w:2") is None
    # The stopped holder wakes and its request gets its answer: over, so the slot comes back.
    gq.hosts.finished(HOST, lease)
    assert marks(r, gq) == {}
    assert gq.claim_next("w:2").task_id == lease.task_id
    check_invariants(r, gq)


def test_a_mark_of_an_older_lease_is_left_to_the_newer_one(gq: TaskQueue, r: redis.Redis) -> None:
    old = gq.claim_next("w:1")
    gq.release(old.task_id, token=old.token, worker="w:1", count_stall=False)  # no request: nothing held
    new = gq.claim_next("w:2")
    assert new.task_id == old.task_id and new.token != old.token
    assert gq.hosts.request(HOST, new, in_flight=60) == 0.0
    gq.hosts.finished(HOST, old)  # a zombie's late report names its own lease only
    assert f"f:{new.task_id}" in marks(r, gq)


def test_marks_are_written_only_under_a_concurrency_limit_and_swept_once_over(
        gq: TaskQueue, r: redis.Redis) -> None:
    other = gq.enqueue("http://b.example/p")  # no limit of its own, no default
    lease_b = gq.claim(other, "w:9")
    assert gq.hosts.request("b.example", lease_b, in_flight=60) == 0.0
    assert not [f for f in r.hgetall(gq.keys.host_state("b.example")) if f[:2] in ("f:", "x:")]
    # A mark left behind (its task completed without a report) goes once its time is over.
    lease = gq.claim_next("w:1")
    assert gq.hosts.request(HOST, lease, in_flight=0.05) == 0.0
    gq.complete(lease)
    assert f"f:{lease.task_id}" in marks(r, gq)
    nxt = gq.claim_next("w:2")
    wait_until(lambda: redis_now_ms(r) > int(marks(r, gq)[f"f:{lease.task_id}"].split(":")[1]), timeout=5,
               what="the mark's time over")
    assert gq.hosts.request(HOST, nxt, in_flight=60) == 0.0
    assert set(marks(r, gq)) == {f"f:{nxt.task_id}"}
    check_invariants(r, gq)


def test_a_lease_gate_drops_the_mark_of_a_request_that_never_went(gq: TaskQueue, r: redis.Redis) -> None:
    lease = gq.claim_next("w:1")
    gate = gq.hosts.for_lease(lease, in_flight=60)  # what ctx.fetch hands the fetcher
    assert gate.fenced
    assert gate.request(HOST) == 0.0
    assert f"f:{lease.task_id}" in marks(r, gq)
    gate.settle()  # the fetcher raised before sending it (no proxy came, the pool refused)
    assert marks(r, gq) == {}
    assert gate.request(HOST) == 0.0
    gate.finished(HOST)  # answered: nothing left to settle
    gate.settle()
    assert marks(r, gq) == {}
    gq.release(lease.task_id, token=lease.token, worker="w:1", count_stall=False)
    assert gq.claim_next("w:2") is not None
