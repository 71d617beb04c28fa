"""cancel(): a task in any unfinished state ends dead with the reason; a running holder is fenced out."""

from __future__ import annotations

import pytest
import redis

from celery_ha.base.errors import LeaseLost, TaskNotFound
from celery_ha.state import TaskQueue
from celery_ha.state.listing import list_tasks
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


def test_a_task_taken_out_of_its_band_leaves_a_stale_entry_pops_skip(q: TaskQueue, r: redis.Redis) -> None:
    """A direct claim or a cancel of a queued task leaves its id in the band (no LREM over the band):
    counted in 'rstale', skipped by pops, the queued count exact; a task queued again while its stale
    entry is still there is handed out once."""
    ids = q.enqueue_many([f"http://example.com/s{n}" for n in range(6)])
    band = q.keys.ready_list(0)
    claimed = q.claim(ids[3], "w:1")
    assert claimed is not None
    assert q.cancel(ids[1], "wrong seed") == "queued"
    assert r.llen(band) == 6 and r.hget(q.keys.stats, "rstale") == "2"
    assert q.stats()["queued"] == 4 and q.ready_ids() == [ids[0], ids[2], ids[4], ids[5]]
    assert [t.id for t in list_tasks(q, "queued")] == q.ready_ids()  # `celery-ha tasks`: live ids only
    check_invariants(r, q)
    # Queued again (at the front, as a released task is) while its stale entry is still in the band.
    assert q.release(ids[3], token=claimed.token, count_stall=False) == "queued"
    assert q.stats()["queued"] == 5 and q.ready_ids()[0] == ids[3]
    assert [t.id for t in list_tasks(q, "queued")] == q.ready_ids()
    check_invariants(r, q)
    handed: list[str] = []
    while (lease := q.claim_next("w:2")) is not None:
        handed.append(lease.task_id)
        q.complete(lease)
    assert handed == [ids[3], ids[0], ids[2], ids[4], ids[5]]  # each once, the cancelled one never
    assert r.llen(band) == 0 and int(r.hget(q.keys.stats, "rstale")) == 0 and q.stats()["queued"] == 0
    check_invariants(r, q)


def test_a_long_run_of_stale_entries_is_skipped_over_several_calls(q: TaskQueue, r: redis.Redis) -> None:
    """A call skips a bounded number of stale entries (1,000): behind a longer run left by a mass
    cancel, a waiting claim still gets the live task (the call that stopped leaves a wake-up token)."""
    ids = q.enqueue_many([f"http://example.com/m{n}" for n in range(2_501)])
    for tid in ids[:2_500]:
        assert q.cancel(tid, "mass cancel") == "queued"
    assert q.stats()["queued"] == 1
    lease = q.claim_next("w:1", wait=5)
    assert lease is not None and lease.task_id == ids[-1]
    assert r.llen(q.keys.ready_list(0)) == 0 and int(r.hget(q.keys.stats, "rstale")) == 0
    check_invariants(r, q)
