"""complete_claim.lua (``TaskQueue.complete_and_claim_id``): a batch's completion claims the next id of
its message in the same fenced script, so each task of a batch costs one script call, not two."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import LeaseLost, TaskQueue
from tests.support.invariants import check_invariants


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30)


def _evalsha_calls(r: redis.Redis) -> int:
    """Script calls: EVALSHA, or FCALL where the scripts are a function library (Redis 7)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "fcall"))


def test_one_script_completes_a_task_and_claims_the_next_of_the_message(q: TaskQueue, r: redis.Redis) -> None:
    warm = q.enqueue_many(["https://example.com/w1", "https://example.com/w2"])  # loads the script
    q.complete(q.complete_and_claim_id(q.claim(warm[0], "w:1"), warm[1], "w:1")[1])
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    sent = q.dispatch(window=3)  # one batch message carries the three ids
    assert [d.task_id for d in sent] == ids
    lease = q.claim(ids[0], "w:1")
    q.save_checkpoint(lease, {"page": 2})
    calls = _evalsha_calls(r)
    added, nxt = q.complete_and_claim_id(lease, ids[1], "w:1", [("a", {"v": 1})])
    assert _evalsha_calls(r) == calls + 1
    assert added == 1 and json.loads(r.hget(q.keys.items, "a")) == {"v": 1}
    done, running = q.get(ids[0]), q.get(ids[1])
    assert done.state == "completed" and q.checkpoint(ids[0]) is None
    # Its first lease: a first token comes from the Redis clock (ms), so it is not below the one before.
    assert (running.state, running.worker) == ("running", "w:1") and running.token == nxt.token >= lease.token
    assert (nxt.task_id, nxt.worker, nxt.task.url) == (ids[1], "w:1", "https://example.com/1")
    assert nxt.expires_at > done.updated_at + 29
    s = q.stats()
    assert (s["completed"], s["running"], s["dispatched"], s["claimed"]) == (3, 1, 1, 4)
    q.complete(q.renew(nxt))  # the lease it granted is a lease like a claim's
    assert q.get(ids[1]).state == "completed"
    check_invariants(r, q)


def test_a_stale_lease_writes_nothing_and_claims_nothing(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    lease = q.claim(ids[0], "w:1")
    q.release(ids[0], count_stall=False)  # the lease is gone (handed back meanwhile)
    with pytest.raises(LeaseLost):
        q.complete_and_claim_id(lease, ids[1], "w:1", [("a", {"v": 1})])
    assert q.get(ids[1]).state == "queued" and not r.hlen(q.keys.items)
    assert q.stats()["completed"] == 0
    check_invariants(r, q)


def test_a_next_task_that_is_not_claimable_leaves_the_completion_standing(q: TaskQueue,
                                                                         r: redis.Redis) -> None:
    ids = q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    other = q.claim(ids[1], "w:2")  # a duplicate message's claim took it first
    added, nxt = q.complete_and_claim_id(q.claim(ids[0], "w:1"), ids[1], "w:1")
    assert (added, nxt) == (0, None)
    assert q.get(ids[0]).state == "completed" and q.get(ids[1]).worker == "w:2"
    assert q.complete_and_claim_id(q.claim(q.enqueue("https://example.com/c"), "w:1"), "Nope12345678",
                                   "w:1") == (0, None)
    q.complete(other)
    check_invariants(r, q)


def test_on_a_sharded_namespace_a_next_task_on_another_shard_is_claimed_there(redis_url: str,
                                                                             r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "sharded", shards=4, lease_ttl=30)
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(40)])
    shard = q._of(ids[0])
    same = next(i for i in ids[1:] if q._of(i) == shard)
    other = next(i for i in ids[1:] if q._of(i) != shard)
    _, nxt = q.complete_and_claim_id(q.claim(ids[0], "w:1"), same, "w:1")
    assert nxt.task_id == same
    _, nxt2 = q.complete_and_claim_id(nxt, other, "w:1", [("k", {"v": 1})])
    assert nxt2.task_id == other and q.get(same).state == "completed" and q.get(other).state == "running"
    check_invariants(r, q)
