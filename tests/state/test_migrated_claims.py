"""No route starts a task in a migrated source (``tg``'s ``mv``, ``state/migrate_marks.py``), against a
real Redis and a real migration (``state/migrate.py``).

``claim.lua`` refused a claim by id from the start; these are the other routes that hand out a task:
the standalone ``claim_next``, a standalone worker's completion that claims the next queued task
(``complete_next.lua``), and a batch's completion that claims the message's next id
(``complete_claim.lua``: a worker frozen through the migration wakes with the batch in hand). Each
reads the mark in the geometry read its fencing check or pop makes anyway. A completion's refill
(``complete_dispatch.lua``) sends nothing of the source out again either. The completion itself
stands: the task ran; it runs once more in the target, where the migration queued it (a stall).
"""

from __future__ import annotations

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.migrate import Migration
from tests.support.invariants import check_invariants

URLS = [f"http://h{i % 3}.example/p/{i}" for i in range(6)]


def _migrate(src: TaskQueue, shards: int = 2) -> TaskQueue:
    """Move ``src`` into ``<src>-new`` (its workers stopped, frozen or killed: run() checks nothing)."""
    target = f"{src.namespace}-new"
    Migration(src.client, src.namespace, target, shards).run()
    return TaskQueue(src.client, target, shards=shards, lease_ttl=30)


def _claimed(q: TaskQueue) -> int:
    return int(q.stats()["claimed"])


@pytest.mark.parametrize("gated", [False, True])
def test_claim_next_hands_out_nothing_in_a_migrated_source(redis_url: str, r: redis.Redis, gated: bool
                                                           ) -> None:
    src = TaskQueue.from_url(redis_url, "cn", lease_ttl=30, shards=2, host_gate=gated)
    ids = src.enqueue_many(URLS)
    dst = _migrate(src)
    assert src.claim_next("w:1") is None
    assert src.claim_next("w:1", wait=0.3) is None  # the blocking loop too: every shard refuses
    assert _claimed(src) == 0
    assert {info.state for info in src.get_many(ids)} == {"queued"}  # left as they were
    # The tasks run in the target, each once.
    leases = [dst.claim_next("w:2") for _ in ids]
    assert None not in leases and dst.claim_next("w:2") is None
    assert len({lease.url for lease in leases if lease is not None}) == len(URLS)
    check_invariants(r, src)


def test_a_completion_claims_no_next_task_in_a_migrated_source(redis_url: str, r: redis.Redis) -> None:
    """``complete_and_claim`` (``complete_next.lua``; then ``claim_next`` on the other shards)."""
    src = TaskQueue.from_url(redis_url, "cc", lease_ttl=30, shards=2)
    src.enqueue_many(URLS)
    lease = src.claim_next("w:1")
    assert lease is not None
    _migrate(src)  # its worker frozen meanwhile: the migration queued the task in the target (a stall)
    assert src.complete_and_claim(lease) is None  # the task it held completes; nothing more starts
    assert src.get(lease.task_id).state == "completed"
    assert _claimed(src) == 1
    assert src.stats()["running"] == 0
    check_invariants(r, src)


def test_a_batch_frozen_through_the_migration_claims_no_next_id(redis_url: str, r: redis.Redis) -> None:
    """``complete_and_claim_id`` (``complete_claim.lua``): the batch's next id is refused, not run."""
    src = TaskQueue.from_url(redis_url, "cb", lease_ttl=30)
    first, second = src.enqueue_many(URLS[:2])
    assert {d.task_id for d in src.dispatch(2)} == {first, second}  # one message carries both ids
    lease = src.claim(first, "w:1")
    assert lease is not None
    dst = _migrate(src)
    added, nxt = src.complete_and_claim_id(lease, second, "w:1", [("k", {"v": 1})])
    assert nxt is None
    assert added == 1 and src.get(first).state == "completed"
    assert src.get(second).state == "dispatched" and _claimed(src) == 1
    assert {lease.url for lease in (dst.claim_next("w:2"), dst.claim_next("w:2")) if lease} == set(URLS[:2])
    check_invariants(r, src)


def test_a_completion_refills_nothing_in_a_migrated_source(redis_url: str, r: redis.Redis) -> None:
    """``complete_and_push`` with a window (``complete_dispatch.lua``): no task of the source goes out
    again, neither a queued one nor a dispatched one whose message is overdue."""
    src = TaskQueue.from_url(redis_url, "cd", lease_ttl=30)
    ids = src.enqueue_many(URLS)
    overdue = [d.task_id for d in src.dispatch(2)]
    lease = src.claim(overdue[0], "w:1")
    assert lease is not None
    _migrate(src, shards=1)
    done = src.complete_and_push(lease, window=10, redispatch_after=0)
    assert done.to_send == []
    states = {info.id: info.state for info in src.get_many(ids)}
    assert states[overdue[1]] == "dispatched"
    assert [t for t, s in states.items() if s == "queued"] == [t for t in ids if t not in overdue]
    assert int(src.stats().get("redispatched", 0)) == 0
    check_invariants(r, src)
