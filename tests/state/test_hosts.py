"""The host gate of the durable state layer (``state/hosts.py``, ``_hosts.lua``) against a real Redis:
host keys, eligibility (concurrency, pacing, blocks, budgets), fairness across hosts within priority
bands, the slot given back on every path that ends a running task, and the gate's listing. Every test
asserts what Redis holds or what the queue hands out; the gate's books are checked against the
records after each test (``check_invariants`` runs ``check_hosts``)."""

from __future__ import annotations

import itertools
import time

import pytest
import redis

from celery_ha import InvalidInput, TaskQueue
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.host_queues import host_queue_ids
from celery_ha.state.shards import shard_of
from tests.support.invariants import check_hosts, check_invariants
from tests.support.polling import wait_until
from tests.support.records import record_count


@pytest.fixture
def gq(redis_url: str) -> TaskQueue:
    """A queue with the host gate on (named apart from test_queue's ``q``: the cluster suite imports both)."""
    return TaskQueue.from_url(redis_url, lease_ttl=30, backoff_base=0.05, backoff_cap=1.0, host_gate=True)


def urls(host: str, n: int, start: int = 0) -> list[str]:
    return [f"http://{host}/p/{i}" for i in range(start, start + n)]


def claim_all(gq: TaskQueue, worker: str = "w") -> list:
    out = []
    while (lease := gq.claim_next(worker)) is not None:
        out.append(lease)
    return out


def test_without_the_gate_a_task_records_no_host_and_queues_in_its_band(redis_url: str, r: redis.Redis
                                                                        ) -> None:
    plain = TaskQueue.from_url(redis_url)
    tid = plain.enqueue("http://a.example/x")
    assert plain.get(tid).host is None
    assert r.lrange(plain.keys.ready_list(0), 0, -1) == [tid]
    assert not r.exists(plain.keys.hosts_ready, plain.keys.hosts_wait, plain.keys.hosts)
    assert plain.claim_next("w").task_id == tid


def test_host_key_defaults_to_the_url_host_and_port_and_can_be_overridden(
        gq: TaskQueue, r: redis.Redis) -> None:
    a = gq.enqueue("http://A.Example:8080/x")
    b = gq.enqueue("https://b.example:443/y")
    c = gq.enqueue("http://c.example/z", host="Site-7")
    d = gq.enqueue("http://d.example/z", host="")
    assert [gq.get(t).host for t in (a, b, c, d)] == ["a.example:8080", "b.example", "site-7", None]
    assert host_queue_ids(r, gq.keys, "a.example:8080") == [a]
    assert r.lrange(gq.keys.ready_list(0), 0, -1) == [d]  # opted out: its band, as without a gate
    assert gq.stats()["queued"] == 4
    check_invariants(r, gq)


def test_a_bad_host_key_is_a_one_line_error_and_writes_nothing(gq: TaskQueue, r: redis.Redis) -> None:
    with pytest.raises(InvalidInput, match="bad host key"):
        gq.enqueue_many([{"url": "http://a.example/1"}, {"url": "http://a.example/2", "host": "{bad} key"}])
    with pytest.raises(InvalidInput):
        gq.hosts.set("a b", concurrency=1)
    with pytest.raises(InvalidInput, match="rate"):
        gq.hosts.set("a.example", rate="fast")
    assert gq.stats()["queued"] == 0 and record_count(r, gq.keys) == 0


def test_concurrency_holds_a_host_to_its_slots_and_serves_others_meanwhile(
        gq: TaskQueue, r: redis.Redis) -> None:
    gq.hosts.set("a.example", concurrency=1)
    gq.enqueue_many(urls("a.example", 5) + urls("b.example", 3))
    leases = claim_all(gq)
    hosts = [lease.task.host for lease in leases]
    assert hosts.count("a.example") == 1 and hosts.count("b.example") == 3
    check_invariants(r, gq)
    a_lease = next(lease for lease in leases if lease.task.host == "a.example")
    gq.complete(a_lease)  # the slot comes back: the next A task may go
    nxt = gq.claim_next("w")
    assert nxt is not None and nxt.task.host == "a.example"
    assert gq.claim_next("w") is None
    info = gq.hosts.get("a.example")
    assert (info.queued, info.running, info.done, info.state) == (3, 1, 1, "full")
    check_invariants(r, gq)


def test_hosts_take_turns_so_one_big_host_cannot_take_the_window(gq: TaskQueue, r: redis.Redis) -> None:
    gq.enqueue_many(urls("a.example", 50))
    gq.enqueue_many(urls("b.example", 5) + urls("c.example", 5))
    sent = gq.dispatch(9)
    hosts = [gq.get(d.task_id).host for d in sent]
    assert hosts.count("a.example") == 3 and hosts.count("b.example") == 3 and hosts.count("c.example") == 3
    check_invariants(r, gq)


def test_a_higher_priority_goes_first_across_hosts(gq: TaskQueue) -> None:
    gq.enqueue_many(urls("a.example", 3))
    urgent = gq.enqueue("http://b.example/urgent", priority=5)
    plain = gq.enqueue("http://plain.example/x", host="", priority=3)  # an ungated task in its band
    order = [lease.task_id for lease in claim_all(gq)]
    assert order[:2] == [urgent, plain]


def test_a_paced_host_is_spaced_by_its_delay_on_the_redis_clock(gq: TaskQueue, r: redis.Redis) -> None:
    # A delay long enough that a loaded machine cannot pause this test past it between two claims.
    gq.hosts.set("a.example", delay=2)
    gq.enqueue_many(urls("a.example", 3))
    first = gq.claim_next("w")
    assert first is not None and gq.claim_next("w") is None  # not eligible yet: nothing handed out
    assert gq.hosts.get("a.example").state == "waiting"
    second = wait_until(lambda: gq.claim_next("w"), timeout=10, what="the second task after the delay")
    gap = second.task.updated_at - first.task.updated_at  # claim times, Redis clock
    assert gap >= 2
    check_invariants(r, gq)


def test_a_rate_is_a_spacing_so_no_window_holds_more_than_its_count(gq: TaskQueue) -> None:
    gq.hosts.set("a.example", rate="4/1")
    gq.enqueue_many(urls("a.example", 6))
    starts = []
    deadline = time.monotonic() + 10
    while len(starts) < 6 and time.monotonic() < deadline:
        lease = gq.claim_next("w")
        if lease is not None:
            starts.append(lease.task.updated_at)
        time.sleep(0.005)
    assert len(starts) == 6
    assert all(b - a >= 0.25 for a, b in itertools.pairwise(starts))
    assert gq.hosts.get("a.example").rate == "4/1"


def test_a_paced_host_has_one_unclaimed_message_and_times_the_next_from_its_claim(
        gq: TaskQueue, r: redis.Redis) -> None:
    gq.hosts.set("a.example", delay=0.05)
    gq.enqueue_many(urls("a.example", 3))
    sent = gq.dispatch(10)
    assert len(sent) == 1
    time.sleep(0.1)  # past the delay, but the message is still unclaimed: still nothing more
    assert gq.dispatch(10) == []
    assert gq.hosts.get("a.example").state == "full"
    lease = gq.claim(sent[0].task_id, "w")
    assert lease is not None
    assert gq.dispatch(10) == []  # timed from the claim: the delay has not passed
    more = wait_until(lambda: gq.dispatch(10), timeout=5, what="the next dispatch after the claim + delay")
    assert len(more) == 1
    check_invariants(r, gq)


def test_block_holds_a_host_and_unblock_lets_it_go(gq: TaskQueue, r: redis.Redis) -> None:
    gq.enqueue_many(urls("a.example", 2) + urls("b.example", 1))
    until = gq.hosts.block("a.example", 600, reason="maintenance window")
    assert until is not None and until > time.time() + 500
    assert [lease.task.host for lease in claim_all(gq)] == ["b.example"]
    info = gq.hosts.get("a.example")
    assert (info.state, info.block_reason, info.queued) == ("blocked", "maintenance window", 2)
    assert gq.hosts.waiting() == {"blocked": 2, "not_eligible": 0, "eligible": 0}
    gq.hosts.unblock("a.example")
    assert len(claim_all(gq)) == 2
    check_invariants(r, gq)


def test_a_dispatched_task_of_a_host_blocked_since_gets_no_lease_and_queues_again(
        gq: TaskQueue, r: redis.Redis) -> None:
    (sent,) = gq.dispatch(5, redispatch_after=3600) if gq.enqueue("http://a.example/1") else []
    gq.hosts.block("a.example", 600, reason="429")
    assert gq.claim(sent.task_id, "w") is None  # the message is dropped
    info = gq.get(sent.task_id)
    assert (info.state, info.attempts, info.stalls) == ("queued", 0, 0)
    assert host_queue_ids(r, gq.keys, "a.example") == [sent.task_id]
    check_invariants(r, gq)
    gq.hosts.unblock("a.example")
    assert gq.claim(sent.task_id, "w") is not None


def test_a_claim_by_id_of_a_queued_task_waits_for_its_host_like_a_pop(gq: TaskQueue, r: redis.Redis) -> None:
    """A second message for a task the gate queued again (a batch's next id whose host was blocked
    meanwhile, a re-send, a failover's) must not start it past the block, the concurrency or the pace."""
    a, b = gq.enqueue_many(["http://a.example/1", "http://a.example/2"])
    gq.hosts.block("a.example", 600, reason="429")
    assert gq.claim(a, "w") is None  # the message is dropped; the task stays queued, uncounted
    info = gq.get(a)
    assert (info.state, info.attempts, info.stalls) == ("queued", 0, 0)
    assert host_queue_ids(r, gq.keys, "a.example") == [a, b]
    gq.hosts.unblock("a.example")
    gq.hosts.set("a.example", concurrency=1)
    held = gq.claim(a, "w")
    assert held is not None
    assert gq.claim(b, "w") is None and gq.get(b).state == "queued"  # its one slot is taken
    gq.complete(held)
    assert gq.claim(b, "w") is not None
    check_invariants(r, gq)


def test_a_short_block_ends_by_itself(gq: TaskQueue) -> None:
    gq.enqueue("http://a.example/1")
    gq.hosts.block("a.example", 0.2)
    assert gq.claim_next("w") is None
    assert wait_until(lambda: gq.claim_next("w"), timeout=5, what="the block to end").task.host == "a.example"


def test_backoff_doubles_to_its_cap_and_is_forgiven_after_a_quiet_period(gq: TaskQueue) -> None:
    now = time.time()
    spans = []
    for _ in range(4):
        until = gq.hosts.backoff("a.example", "429", start=10, cap=30, forgive=600, jitter=0)
        spans.append(round(until - now))
    assert spans == [10, 20, 30, 30]
    assert gq.hosts.get("a.example").backoff_level == 4
    until = gq.hosts.backoff("a.example", "429", start=10, cap=30, forgive=0, jitter=0)  # quiet "long enough"
    assert gq.hosts.get("a.example").backoff_level == 1 and until is not None


def test_a_budget_stops_a_host_until_it_is_raised(gq: TaskQueue, r: redis.Redis) -> None:
    gq.hosts.set("a.example", budget=2)
    gq.enqueue_many(urls("a.example", 5))
    assert len(claim_all(gq)) == 2
    info = gq.hosts.get("a.example")
    assert (info.budget_left, info.queued, info.state) == (0, 3, "full")
    gq.hosts.set("a.example", budget=4)
    assert len(claim_all(gq)) == 2
    check_invariants(r, gq)


@pytest.mark.parametrize("how", ["complete", "fail_retry", "fail_dead", "failover", "handback", "cancel",
                                 "reclaim", "cancel_dispatched"])
def test_every_path_that_ends_a_running_task_gives_its_slot_back(
        gq: TaskQueue, r: redis.Redis, how: str) -> None:
    gq.hosts.set("a.example", concurrency=1)
    gq.enqueue_many(urls("a.example", 2))
    if how == "cancel_dispatched":
        (sent,) = gq.dispatch(5)
        gq.cancel(sent.task_id, "test")
    else:
        lease = gq.claim_next("w", ttl=0.05 if how == "reclaim" else None)
        assert lease is not None and gq.claim_next("w") is None
        if how == "complete":
            gq.complete(lease)
        elif how == "fail_retry":
            gq.fail(lease, "boom", retry=True)
        elif how == "fail_dead":
            gq.fail(lease, "boom", retry=False)
        elif how == "failover":
            gq.release(lease.task_id, count_stall=True)
        elif how == "handback":
            gq.release(lease.task_id, count_stall=False)
        elif how == "cancel":
            gq.cancel(lease.task_id, "test")
        else:
            wait_until(lambda: gq.reclaim_expired() == 1, timeout=5, what="the lease to expire")
    check_invariants(r, gq)
    nxt = gq.claim_next("w")
    assert nxt is not None and nxt.task.host == "a.example"
    check_invariants(r, gq)


def test_a_retry_and_a_redrive_and_a_recrawl_queue_in_the_host_queue_again(
        gq: TaskQueue, r: redis.Redis) -> None:
    tid = gq.enqueue("http://a.example/1")
    lease = gq.claim_next("w")
    gq.fail(lease, "boom", retry=True)
    lease = wait_until(lambda: gq.claim_next("w"), timeout=5, what="the retry")
    assert lease.task_id == tid and lease.task.host == "a.example"
    gq.fail(lease, "boom", retry=False)
    assert gq.redrive(tid) == 1
    assert host_queue_ids(r, gq.keys, "a.example") == [tid]
    gq.complete(gq.claim_next("w"))
    assert gq.recrawl([tid]) == {tid: "queued"}
    assert host_queue_ids(r, gq.keys, "a.example") == [tid]
    check_invariants(r, gq)
    info = gq.hosts.get("a.example")
    assert info.done == 1 and info.dead == 1


def test_defaults_apply_to_every_host_and_an_override_wins(gq: TaskQueue) -> None:
    gq.hosts.set_defaults(concurrency=1)
    gq.hosts.set("b.example", concurrency=2)
    gq.enqueue_many(urls("a.example", 3) + urls("b.example", 3))
    hosts = [lease.task.host for lease in claim_all(gq)]
    assert sorted(hosts) == ["a.example", "b.example", "b.example"]
    gq.hosts.set("b.example", concurrency=None)  # back to the default
    assert gq.hosts.get("b.example").concurrency == 1


def test_defaults_from_the_queue_options_switch_the_gate_on(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "paced", host_concurrency=1)
    q.enqueue_many(urls("a.example", 2))
    assert q.hosts.enabled()
    assert len(claim_all(q)) == 1


def test_listing_counts_and_sorts_hosts(gq: TaskQueue) -> None:
    gq.enqueue_many(urls("a.example", 1) + urls("b.example", 3) + urls("c.example", 2))
    gq.hosts.block("c.example", 60, "429 Too Many Requests")
    lease = gq.claim_next("w")
    gq.complete(lease)
    listed = gq.hosts.list()
    assert listed[0].host == "b.example"  # the most queued first
    by_host = {i.host: i for i in listed}
    assert by_host["c.example"].block_reason == "429 Too Many Requests"
    assert sum(i.done for i in listed) == 1
    assert [i.host for i in gq.hosts.list(sort="host")] == ["a.example", "b.example", "c.example"]
    assert gq.hosts.list(sort="blocked")[0].host == "c.example"
    with pytest.raises(InvalidInput, match="sort"):
        gq.hosts.list(sort="bogus")


def test_a_sharded_namespace_keeps_each_host_on_one_shard(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "shd", shards=4, host_gate=True)
    hosts = [f"h{i}.example" for i in range(6)]
    ids = q.enqueue_many([u for h in hosts for u in urls(h, 5)])
    for h in hosts:
        shard = shard_of(h, 4)
        assert len(host_queue_ids(r, q.shard_keys()[shard], h)) == 5
    assert all(shard_of(t, 4) == shard_of(q.get(t).host, 4) for t in ids)
    assert q.enqueue_many([u for h in hosts for u in urls(h, 5)]) == ids  # dedup ids are stable
    q.hosts.set("h0.example", concurrency=1)
    leases = claim_all(q)
    assert len(leases) == 26 and sum(lease.task.host == "h0.example" for lease in leases) == 1
    assert q.stats()["queued"] == 4


def test_check_hosts_catches_a_drifted_count(gq: TaskQueue, r: redis.Redis) -> None:
    gq.enqueue("http://a.example/1")
    gq.claim_next("w")
    r.hset(gq.keys.host_state("a.example"), "a", 5)
    with pytest.raises(AssertionError, match="active"):
        check_hosts(r, gq)


def test_metrics_count_hosts_per_zone_without_a_label_per_host(gq: TaskQueue, redis_url: str) -> None:
    from celery_ha.monitoring.collector import queue_families
    from celery_ha.state.metrics import read_queue_metrics

    gq.hosts.set("a.example", concurrency=1)
    gq.enqueue_many(urls("a.example", 2) + urls("b.example", 1) + urls("c.example", 1))
    gq.hosts.block("c.example", 60)
    assert gq.claim_next("w").task.host == "a.example"  # a is then at its one slot: parked
    m = read_queue_metrics(gq.client, gq.namespace)
    assert m.hosts == {"eligible": 1, "waiting": 1, "parked": 1}
    family = next(f for f in queue_families(m, 30) if f.name == "celery_ha_hosts")
    assert {s.labels["zone"]: s.value for s in family.samples} == {"eligible": 1, "waiting": 1, "parked": 1}


def test_a_host_whose_wait_ended_leaves_hwait_even_when_the_window_is_full(gq: TaskQueue, r: redis.Redis
                                                                             ) -> None:
    """A worker arms its pump timer for hwait's first host: a host whose time has passed must not
    stay there while the window is full (or paused), else the timer fires at once, again and again."""
    gq.hosts.set("a.example", delay=0.05)
    gq.enqueue_many(["http://b.example/1", "http://a.example/1", "http://a.example/2"])
    lease = gq.claim_next("w")
    assert lease is not None and lease.task.url == "http://a.example/1"  # a.example paced from now
    assert [d.task_id for d in gq.dispatch(1)] == [gq.task_ids(["http://b.example/1"])[0]]  # full
    due = r.zscore(gq.keys.hosts_wait, "a.example")
    assert due is not None
    wait_until(lambda: redis_now_ms(r) > due, timeout=5, what="a.example's wait to end")
    assert gq.dispatch(1) == []  # no room: nothing handed out
    assert r.zscore(gq.keys.hosts_wait, "a.example") is None  # but the host is due: in hready
    assert r.zscore(gq.keys.hosts_ready, "a.example") is not None
    assert gq.dispatch(0) == [] and r.zcard(gq.keys.hosts_wait) == 0  # paused (no window) alike
    check_invariants(r, gq)
