"""The host gate never leaves a host with queued work unserved for good, against a real Redis: new
defaults reach every host however many are filed (a host parked for its budget or concurrency has
no event of its own to come), a run of stale entries at one host's head holds up no other host,
and a dispatched task bounced by a block gives its budget unit back. Every test asserts what Redis
holds or what dispatch and claim hand out."""

from __future__ import annotations

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.hosts import SLOT
from tests.support.invariants import check_hosts, check_invariants

#: More hosts than one re-file step (~1,000: host_limits.lua), so a step alone cannot reach them all.
MANY = 1_100


@pytest.fixture
def gq(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "live", lease_ttl=30, host_gate=True)


def parked_hosts(gq: TaskQueue, r: redis.Redis) -> list[str]:
    """Every host with a budget of 0 by default and one queued task each: all parked at SLOT."""
    gq.hosts.set_defaults(budget=0)
    hosts = [f"h{i:04d}.example" for i in range(MANY)]
    gq.enqueue_many([f"http://{h}/p" for h in hosts])
    assert r.zcard(gq.keys.hosts_wait) == MANY and r.zcount(gq.keys.hosts_wait, SLOT, SLOT) == MANY
    return hosts


def dispatched_hosts(gq: TaskQueue, calls: int) -> set[str]:
    out: set[str] = set()
    for _ in range(calls):
        out |= {gq.get(d.task_id).host for d in gq.dispatch(5_000)}
    return out


def test_raising_the_default_budget_serves_every_parked_host(gq: TaskQueue, r: redis.Redis) -> None:
    hosts = parked_hosts(gq, r)
    gq.hosts.set_defaults(budget=5)
    assert r.zcard(gq.keys.hosts_ready) == MANY and not r.exists(gq.keys.hosts_wait)
    assert dispatched_hosts(gq, 1) == set(hosts)
    assert "rf" not in r.hgetall(gq.keys.host_config)
    check_invariants(r, gq)


def test_a_re_file_left_halfway_is_finished_by_the_next_dispatches(gq: TaskQueue, r: redis.Redis) -> None:
    """set_defaults calls until every host is filed again; a caller that died after its first call
    leaves the cursor in Redis, and dispatch and claim_next go on with it."""
    hosts = parked_hosts(gq, r)
    assert gq._run("host_limits", "", "bg", "5") == 1  # one step: hosts are left
    assert r.hget(gq.keys.host_config, "rf") not in (None, "0")
    assert r.zcount(gq.keys.hosts_wait, SLOT, SLOT) > 0
    lease = gq.claim_next("w")
    assert lease is not None
    got = dispatched_hosts(gq, 8) | {lease.task.host}
    assert got == set(hosts) and "rf" not in r.hgetall(gq.keys.host_config)
    check_invariants(r, gq)


def test_unchanged_defaults_file_no_host_again(gq: TaskQueue, r: redis.Redis) -> None:
    """A process started with the same defaults (or `hosts on`, a key mode) re-files nothing."""
    parked_hosts(gq, r)
    r.zadd(gq.keys.hosts_wait, {"h0000.example": 1})  # moved by hand: a re-file would put it back
    gq.hosts.set_defaults(budget=0)
    gq.hosts.switch(True)
    assert r.zscore(gq.keys.hosts_wait, "h0000.example") == 1


def test_check_hosts_catches_a_host_parked_for_an_event_it_no_longer_needs(gq: TaskQueue, r: redis.Redis
                                                                           ) -> None:
    gq.hosts.set("a.example", budget=0)
    gq.enqueue("http://a.example/1")
    check_hosts(r, gq)
    r.hset(gq.keys.host_state("a.example"), "bg", "3")  # the budget raised behind the gate's back
    with pytest.raises(AssertionError, match="parked for an event"):
        check_hosts(r, gq)


def cancelled_run(gq: TaskQueue, host: str, n: int, tag: str) -> None:
    """`n` tasks of `host` cancelled while queued: stale entries at the head of its queue."""
    for tid in gq.enqueue_many([f"http://{host}/{tag}{i}" for i in range(n)]):
        gq.cancel(tid, "cleanup")


def test_stale_entries_at_one_hosts_head_hold_up_no_other_host(gq: TaskQueue, r: redis.Redis) -> None:
    for lease in (gq.claim_next("w") for _ in gq.enqueue_many(["http://a.example/0", "http://b.example/0"])):
        gq.complete(lease)  # a.example then b.example served: a is first in turn
    cancelled_run(gq, "a.example", 1_200, "d")
    live_a, live_b = gq.enqueue_many(["http://a.example/live", "http://b.example/live"])
    # The first call already hands out b's task; a's comes once its stale run (past one call's
    # budget of 1,000 skipped entries) is skipped.
    assert [d.task_id for d in gq.dispatch(10)] == [live_b]
    assert [d.task_id for d in gq.dispatch(10)] == [live_a]
    # The same for a standalone claim.
    cancelled_run(gq, "a.example", 1_200, "c")
    live_a, live_b = gq.enqueue_many(["http://a.example/live2", "http://b.example/live2"])
    first = gq.claim_next("w")
    assert first is not None and first.task_id == live_b
    r.delete(gq.keys.wake)
    # Past the budget a claim says nothing now but leaves a wake token: a waiting claimer calls again.
    assert gq.claim_next("w") is None and r.llen(gq.keys.wake) == 1
    second = gq.claim_next("w")
    assert second is not None and second.task_id == live_a
    check_invariants(r, gq)


def test_a_dispatched_task_bounced_by_a_block_gives_its_budget_unit_back(gq: TaskQueue, r: redis.Redis
                                                                         ) -> None:
    gq.hosts.set("a.example", budget=3)
    gq.enqueue_many([f"http://a.example/{i}" for i in range(3)])
    sent = gq.dispatch(10)
    assert len(sent) == 3 and gq.hosts.get("a.example").budget_left == 0
    gq.hosts.block("a.example", 600, "HTTP 429")  # seen by another worker before these claims
    assert [gq.claim(d.task_id, "w") for d in sent] == [None, None, None]
    info = gq.hosts.get("a.example")
    assert (info.queued, info.budget_left) == (3, 3)  # none started: none counted
    gq.hosts.unblock("a.example")
    again = gq.dispatch(10)
    assert sorted(d.task_id for d in again) == sorted(d.task_id for d in sent)
    assert all(gq.claim(d.task_id, "w") for d in again)
    assert gq.hosts.get("a.example").budget_left == 0
    check_invariants(r, gq)
