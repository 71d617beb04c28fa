"""The chain step of ``complete_dispatch.lua`` (``complete_and_push(chain=...)``): after the refill,
the best queued task of the chain's task name is leased to the completing worker in the same script;
anything else stays as a refill would leave it."""

from __future__ import annotations

import pytest
import redis

from celery_ha import LeaseLost, TaskQueue
from tests.support.invariants import check_invariants


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "chain", lease_ttl=30)


def test_the_next_task_of_the_same_name_is_leased_to_the_completing_worker(q: TaskQueue,
                                                                          r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(6)])
    q.dispatch(window=2)  # ids 0, 1 have messages
    lease = q.claim(ids[0], "w:1")
    q.save_checkpoint(lease, {"page": 3})
    done = q.complete_and_push(lease, [("a", {"v": 1})], window=2, chain=("w:1", "fetch_page"))
    assert [d.task_id for d in done.to_send or []] == [ids[2]]  # the refill first: the window is full
    nxt = done.next_lease
    assert nxt is not None and nxt.task_id == ids[3] and nxt.worker == "w:1" and nxt.checkpoint is None
    info = q.get(ids[3])
    assert info.state == "running" and info.worker == "w:1" and info.token == nxt.token
    s = q.stats()
    assert (s["claimed"], s["completed"], s["dispatched"], s["queued"], s["running"]) == (2, 1, 2, 2, 1)
    check_invariants(r, q)
    # The chained lease is a lease like a claim's: renewed, completed, fenced.
    q.renew(nxt)
    again = q.complete_and_push(nxt, window=2, chain=("w:1", "fetch_page"))
    assert again.to_send == [] and again.next_lease is not None and again.next_lease.task_id == ids[4]
    with pytest.raises(LeaseLost):
        q.complete_and_push(nxt, window=2, chain=("w:1", "fetch_page"))
    check_invariants(r, q)


def test_nothing_is_taken_while_the_refill_has_room_for_every_queued_task(q: TaskQueue,
                                                                          r: redis.Redis) -> None:
    """Idle processes first: the refill gives the window what is queued; a chain takes only what is
    left beyond it."""
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    q.dispatch(window=1)
    lease = q.claim(ids[0], "w:1")
    done = q.complete_and_push(lease, window=4, chain=("w:1", "fetch_page"))
    assert [d.task_id for d in done.to_send or []] == ids[1:] and done.next_lease is None
    check_invariants(r, q)


def test_another_task_names_best_task_stays_queued_at_the_front(q: TaskQueue, r: redis.Redis) -> None:
    """The best queued task has another name: it is not this worker's to run; it stays queued, first
    in its band, and the chain takes nothing."""
    first = q.enqueue("https://example.com/0")
    other = q.enqueue("https://example.com/list", task="crawl_list")
    later = q.enqueue("https://example.com/2")
    q.dispatch(window=1)
    lease = q.claim(first, "w:1")
    q.dispatch(window=1)  # crawl_list's task has its message: the window is full again
    assert q.get(other).state == "dispatched"
    q.claim(other, "w:2")
    third = q.enqueue("https://example.com/list2", task="crawl_list")
    q.dispatch(window=1)  # `later` goes out; `third` is the best queued task now
    done = q.complete_and_push(lease, window=1, chain=("w:1", "fetch_page"))
    assert done.next_lease is None and done.to_send == []
    assert q.get(third).state == "queued" and q.get(later).state == "dispatched"
    assert q.claim_next("w:3").task_id == third  # still first
    check_invariants(r, q)


def test_without_a_refill_the_shards_best_task_and_with_a_window_of_0_none(q: TaskQueue,
                                                                           r: redis.Redis) -> None:
    """No window (a sharded namespace's completion: its caller pumps afterwards) takes the best task;
    a window of 0 (a paused namespace's) takes nothing; a stale lease nothing either."""
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(5)])
    lease = q.claim_next("w:1")
    assert lease is not None
    done = q.complete_and_push(lease, chain=("w:1", "fetch_page"))
    assert done.to_send is None and done.next_lease is not None and done.next_lease.task_id == ids[1]
    paused = done.next_lease  # a paused namespace's window is 0: nothing may start
    done = q.complete_and_push(paused, window=0, chain=("w:1", "fetch_page"))
    assert done.next_lease is None and done.to_send == []
    stale = q.claim_next("w:1")
    q.release(stale.task_id, token=stale.token, worker="w:1", count_stall=False, reason="test")
    with pytest.raises(LeaseLost):
        q.complete_and_push(stale, window=1, chain=("w:1", "fetch_page"))
    assert q.stats()["claimed"] == 3 and {q.get(t).state for t in ids[3:]} == {"queued"}
    check_invariants(r, q)


def test_a_gated_chain_takes_a_host_that_may_go_and_dispatches_another_names(redis_url: str,
                                                                            r: redis.Redis) -> None:
    """With the host gate on the chain's pop is the claim's: the host's pacing counts it; a gated task
    of another name, popped already, is dispatched with a message as the refill's are."""
    gq = TaskQueue.from_url(redis_url, "chain-gated", host_gate=True, lease_ttl=30)
    gq.hosts.set("a.example", delay=30)
    a = gq.enqueue_many([f"http://a.example/{i}" for i in range(2)])
    b = gq.enqueue_many([f"http://b.example/{i}" for i in range(2)], task="crawl_list")
    c = gq.enqueue_many([f"http://c.example/{i}" for i in range(3)])
    lease = gq.claim_next("w:1")
    assert lease is not None and lease.task_id == a[0]  # a.example now waits 30 s
    holder = gq.claim_next("w:2")  # one task of b or c running: a window of 1 is full with it sent
    assert holder is not None
    gq.dispatch(window=1)
    done = gq.complete_and_push(lease, window=1, chain=("w:1", "fetch_page"))
    taken = [lease.task_id for lease in [done.next_lease] if lease is not None]
    sent = [d.task_id for d in done.to_send or []]
    assert gq.get(a[1]).state == "queued"  # paced: never taken
    assert len(taken) + len(sent) == 1 and set(taken + sent) <= set(b + c) - {holder.task_id}
    assert all(t in c for t in taken) and all(t in b for t in sent)
    check_invariants(r, gq)
