"""The host gate switched on over existing work, and off again, against a real Redis: tasks queued
before the gate existed (no host key) still dispatch and run beside gated ones; switching it off
stops gating new tasks while the gated ones drain under their limits; ``stats`` (CLI and web) count
the tasks waiting on blocked or not-yet-eligible hosts; the oldest-queued figure sees host queues."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.monitoring.dashboard import Reader, stats_snapshot
from celery_ha.proxy import ProxyPool
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.metrics import read_queue_metrics
from celery_ha.state.records import decode_head, encode_head
from tests.support.invariants import check_invariants
from tests.support.records import put_raw_record, raw_record


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "sw", lease_ttl=30)


def dispatch_all(q: TaskQueue) -> dict:
    """Dispatch as the pump does, then claim each message as a worker would: the leases by id."""
    out: dict = {}
    while sent := q.dispatch(100):
        for d in sent:
            lease = q.claim(d.task_id, "w")
            assert lease is not None
            out[d.task_id] = lease
    return out


def test_tasks_queued_before_the_gate_still_dispatch_beside_gated_ones(q: TaskQueue, r: redis.Redis) -> None:
    old = q.enqueue_many([f"http://a.example/old{i}" for i in range(3)])  # gate off: no host key
    assert {q.get(t).host for t in old} == {None}
    q.hosts.set("a.example", concurrency=1)  # the gate comes on
    new = q.enqueue_many([f"http://a.example/new{i}" for i in range(3)])
    assert {q.get(t).host for t in new} == {"a.example"}
    got = dispatch_all(q)
    # Every old task goes out (its band, ungated); of the gated ones, only the concurrency's one.
    assert set(old) <= set(got) and len(set(got) & set(new)) == 1
    check_invariants(r, q)


def test_switching_the_gate_off_stops_gating_new_tasks_and_drains_the_gated(q: TaskQueue, r: redis.Redis
                                                                            ) -> None:
    q.hosts.set("a.example", concurrency=1)
    gated = q.enqueue_many([f"http://a.example/g{i}" for i in range(2)])
    q.hosts.switch(False)
    assert not q.hosts.enabled()
    plain = q.enqueue_many([f"http://a.example/p{i}" for i in range(2)])
    assert {q.get(t).host for t in plain} == {None}
    first = dispatch_all(q)
    assert set(plain) <= set(first) and len(set(first) & set(gated)) == 1  # still one at a time
    assert dispatch_all(q) == {}
    done = next(t for t in first if t in gated)
    q.complete(first[done])  # the host's slot comes back: the other gated task goes out
    assert list(dispatch_all(q)) == [t for t in gated if t != done]
    check_invariants(r, q)
    q.hosts.switch(True)
    assert q.hosts.enabled()
    check_invariants(r, q)


def test_stats_count_tasks_waiting_on_blocked_and_not_yet_eligible_hosts(
        q: TaskQueue, r: redis.Redis, redis_url: str) -> None:
    q.hosts.set("a.example", delay=600)
    q.enqueue_many([f"http://a.example/{i}" for i in range(3)] + [f"http://b.example/{i}" for i in range(2)]
                   + ["http://c.example/0"])
    q.hosts.block("b.example", 600, "429")
    assert q.claim_next("w").task.host in ("a.example", "c.example")
    assert q.claim_next("w").task.host in ("a.example", "c.example")
    doc = stats_snapshot(Reader(r, q, ProxyPool(r, "sw"), 30))
    # a: 2 left behind its 600 s delay; b: 2 behind its block; c: done.
    assert doc["hosts"] == {"blocked": 2, "not_eligible": 2, "eligible": 0}
    json.dumps(doc)


def test_the_oldest_queued_figure_sees_the_host_queues(q: TaskQueue, r: redis.Redis) -> None:
    q.hosts.set_defaults(concurrency=1)
    tid = q.enqueue("http://a.example/old")
    q.enqueue("http://b.example/new")
    raw = raw_record(r, q.keys, tid)
    head, _, body = raw.partition("\n")
    st = decode_head(head)
    st["ct"] = str(redis_now_ms(r) - 90_000)
    put_raw_record(r, q.keys, tid, encode_head(st) + "\n" + body)
    m = read_queue_metrics(r, "sw")
    assert m.oldest_ready_ms is not None and 90 <= (m.now_ms - m.oldest_ready_ms) / 1000 < 100


@pytest.mark.parametrize("report", ["request", "finished", "defer", "retry_after", "backoff", "crawl_delay"])
def test_what_the_fetcher_reports_of_a_draining_task_leaves_the_gate_off(
        q: TaskQueue, r: redis.Redis, report: str) -> None:
    """`hosts off` lets the gated tasks drain; the fetcher's calls around their requests (fetcher.py:
    stamps, a refusal's retry time, a 429/503, robots' Crawl-delay) must not switch it on again, or
    every new task would be gated again behind the operator's back."""
    q.hosts.set("a.example", delay=0.01)
    q.enqueue_many(["http://a.example/1", "http://a.example/2"])
    q.hosts.switch(False)
    lease = q.claim_next("w")
    assert lease is not None and lease.task.host == "a.example"  # a gated task drains
    gate, host = q.hosts, lease.task.host
    calls = {"request": lambda: gate.request(host), "finished": lambda: gate.finished(host),
             "defer": lambda: gate.defer(host, 0.5),
             "retry_after": lambda: gate.block_until_retry(host, 1, "HTTP 429"),
             "backoff": lambda: gate.backoff(host, "HTTP 503"),
             "crawl_delay": lambda: gate.set_crawl_delay(host, 1.0)}
    calls[report]()
    q.complete(lease)
    assert not q.hosts.enabled() and r.hget(q.keys.host_config, "on") == "0"
    new = q.enqueue("http://b.example/new")
    assert q.get(new).host is None and r.lrange(q.keys.ready_list(0), 0, -1) == [new]
    check_invariants(r, q)


def test_only_the_operator_switches_an_explicit_off_back_on(q: TaskQueue) -> None:
    q.hosts.set("a.example", concurrency=1)
    for operator_action in (lambda: q.hosts.set("a.example", concurrency=2),
                            lambda: q.hosts.block("a.example", 1), lambda: q.hosts.unblock("a.example"),
                            lambda: q.hosts.set_defaults(delay=0), lambda: q.hosts.switch(True)):
        q.hosts.switch(False)
        operator_action()
        assert q.hosts.enabled()


def test_a_namespace_never_switched_is_switched_on_by_any_host_call(q: TaskQueue, r: redis.Redis) -> None:
    """No explicit off to keep: as before, a host's stamps or blocks switch a fresh namespace's gate on."""
    assert not r.exists(q.keys.host_config)
    q.hosts.request("a.example")
    assert q.hosts.enabled()
