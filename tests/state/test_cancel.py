"""cancel(): a task in any unfinished state ends dead with the reason; a running holder is fenced out."""

from __future__ import annotations

import pytest
import redis

from celery_ha.base.errors import LeaseLost, TaskNotFound
from celery_ha.state import TaskQueue
from celery_ha.state.replies import Refusal
from tests.support.invariants import check_invariants


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "cx")


def test_cancel_from_every_unfinished_state(q: TaskQueue, r: redis.Redis) -> None:
    queued, dispatched, delayed, running = q.enqueue_many([f"http://example.com/{n}" for n in range(4)])
    assert [d.task_id for d in q.dispatch(1)] == [queued]  # the first one is dispatched
    dispatched, queued = queued, dispatched
    lease = q.claim(delayed, "w:1")
    assert lease is not None
    q.fail(lease, "try later")
    held = q.claim(running, "w:2")
    assert held is not None
    assert [q.cancel(t, "wrong seed") for t in (queued, dispatched, delayed, running)] == [
        "queued", "dispatched", "delayed", "running"]
    for tid in (queued, dispatched, delayed, running):
        info = q.get(tid)
        assert info.state == "dead" and info.error == "cancelled: wrong seed", info
    stats = q.stats()
    assert (stats["queued"], stats["dispatched"], stats["delayed"], stats["running"], stats["dead"]) == (
        0, 0, 0, 0, 4)
    assert stats["cancelled"] == 4
    check_invariants(r, q)
    with pytest.raises(LeaseLost) as lost:  # the holder's next fenced write is refused, saying why
        q.save_checkpoint(held, {"page": 2})
    assert lost.value.code == Refusal.DEAD and lost.value.reason and lost.value.reason in str(lost.value)
    assert q.claim(dispatched, "w:3") is None  # its message is dropped by the claim
    assert q.redrive(queued) == 1 and q.get(queued).state == "queued"


def test_cancel_of_a_finished_or_unknown_task(q: TaskQueue) -> None:
    tid = q.enqueue("http://example.com/done")
    lease = q.claim(tid, "w:1")
    assert lease is not None
    q.complete(lease)
    assert q.cancel(tid) is None and q.get(tid).state == "completed"
    with pytest.raises(TaskNotFound):
        q.cancel("nosuchtask00")
