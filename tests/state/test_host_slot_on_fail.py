"""A host's slot outlives a task that FAILS or is cancelled while its request may still be in flight
(``fail.lua``, ``cancel.lua`` pass the task and its lease to ``_hosts.lua``'s host_end), against a real
Redis.

A soft time limit that cuts a task mid-request fails the task (``runner.py``: no checkpoint saved) with
the request's in-flight mark (``f:<id>``) still there: the site may still be answering it, so under a
concurrency limit the slot stays taken until the mark's bound (``x:<id>:<token>``), as it does for a
release or a reclaim (``tests/state/test_host_slot_hold.py``). A cancelled running task's holder runs on
until its next fenced write: the same. A request reported over leaves nothing held.
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
    q = TaskQueue.from_url(redis_url, lease_ttl=30, host_gate=True, backoff_base=600, backoff_cap=600)
    q.hosts.set(HOST, concurrency=1)
    q.enqueue_many([f"http://{HOST}/p/{i}" for i in range(3)])
    return q


def held_until(r: redis.Redis, q: TaskQueue, lease: Lease) -> int:
    return int(r.hget(q.keys.host_state(HOST), f"x:{lease.task_id}:{lease.token}") or 0)


def marks(r: redis.Redis, q: TaskQueue) -> set[str]:
    return {f for f in r.hgetall(q.keys.host_state(HOST)) if f[:2] in ("f:", "x:")}


def _asked(gq: TaskQueue, r: redis.Redis, bound: float) -> tuple[Lease, int]:
    """A task claimed at the host's concurrency, its request let go and never reported."""
    lease = gq.claim_next("w:1")
    assert lease is not None and gq.claim_next("w:2") is None  # concurrency 1
    assert gq.hosts.request(HOST, lease, in_flight=bound) == 0.0
    until = int(r.hget(gq.keys.host_state(HOST), f"f:{lease.task_id}").split(":")[1])
    return lease, until


@pytest.mark.parametrize("retry", [True, False], ids=["retried", "dead"])
def test_a_failure_with_a_request_unreported_holds_the_slot_until_its_bound(
        gq: TaskQueue, r: redis.Redis, retry: bool) -> None:
    lease, until = _asked(gq, r, 1.5)
    assert gq.fail(lease, "SoftTimeLimitExceeded()", retry=retry) == ("retry" if retry else "dead")
    assert held_until(r, gq, lease) == until
    assert marks(r, gq) == {f"x:{lease.task_id}:{lease.token}"}
    assert gq.claim_next("w:2") is None  # the site may still be answering the first request
    info = gq.hosts.get(HOST)
    assert (info.running, info.state) == (0, "full")
    assert r.zscore(gq.keys.hosts_wait, HOST) == until  # due when the hold ends
    check_invariants(r, gq)
    nxt = wait_until(lambda: gq.claim_next("w:2"), timeout=10, what="the held slot to come back")
    assert redis_now_ms(r) >= until and nxt.task_id != lease.task_id
    check_invariants(r, gq)


def test_a_cancel_of_a_running_task_mid_request_holds_the_slot_until_its_answer(
        gq: TaskQueue, r: redis.Redis) -> None:
    lease, _ = _asked(gq, r, 60)
    assert gq.cancel(lease.task_id, "operator") == "running"
    assert held_until(r, gq, lease) > redis_now_ms(r) + 50_000
    assert gq.claim_next("w:2") is None
    gq.hosts.finished(HOST, lease)  # the holder, running on, gets its answer: over
    assert marks(r, gq) == set()
    assert gq.claim_next("w:2") is not None
    check_invariants(r, gq)


def test_a_failure_after_its_request_was_answered_frees_the_slot_at_once(gq: TaskQueue, r: redis.Redis
                                                                        ) -> None:
    lease, _ = _asked(gq, r, 60)
    gq.hosts.finished(HOST, lease)
    assert gq.fail(lease, "ValueError: bad page") == "retry"
    assert marks(r, gq) == set()
    assert gq.claim_next("w:2") is not None
    check_invariants(r, gq)
