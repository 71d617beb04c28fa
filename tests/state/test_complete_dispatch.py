"""complete_dispatch.lua: the last items, the completion and the window refill in one fenced script."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import InvalidInput, LeaseLost, TaskQueue
from celery_ha.integration.running.infrastructure import is_infrastructure_error
from celery_ha.state import Refusal
from tests.state.test_queue import CountingConnection, counted, dump  # noqa: F401 (fixture)
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30, backoff_base=0.05, backoff_cap=1.0)


def test_completes_stores_items_and_refills_the_window_like_dispatch(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(10)], priority=0)
    hot = q.enqueue("https://example.com/hot", priority=5)
    first = q.dispatch(window=3)
    assert [d.task_id for d in first] == [hot, *ids[:2]]
    lease = q.claim(hot, "w")
    q.save_checkpoint(lease, {"page": 3})
    added, sent = q.complete_and_dispatch(lease, [("a", {"v": 1}), ("b", {"v": 2})], window=3)
    assert added == 2
    assert [(d.task_id, d.task, d.priority, d.resent) for d in sent] == [(ids[2], "fetch_page", 0, False)]
    info = q.get(hot)
    assert info.state == "completed" and info.worker is None
    assert q.checkpoint(hot) is None
    assert r.lrange(q.keys.item_log, 0, -1) == ["a", "b"]
    assert json.loads(r.hget(q.keys.items, "b")) == {"v": 2}
    s = q.stats()
    assert (s["completed"], s["dispatched"], s["queued"], s["running"]) == (1, 3, 7, 0)
    assert (s["items"], s.get("items_duplicate", 0)) == (2, 0)
    assert q.get(ids[2]).state == "dispatched"
    check_invariants(r, q)


def test_the_window_counts_dispatched_tasks_not_the_completion(q: TaskQueue, r: redis.Redis) -> None:
    """The room is window − dispatched, as in dispatch.lua: a full window gets nothing, a claim frees
    one place, and a window larger than the backlog takes all of it."""
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(6)])
    q.dispatch(window=2)
    lease = q.claim(ids[0], "w")  # one place free
    other = q.claim(ids[1], "w")  # two free
    q.dispatch(window=2)  # full again: ids 2, 3
    assert q.complete_and_dispatch(lease, window=2) == (0, [])  # nothing claimed since: no room
    q.claim(ids[2], "w")
    _, sent = q.complete_and_dispatch(other, window=10)
    assert [d.task_id for d in sent] == ids[4:]  # 10 − 1 dispatched, but only 2 ready
    s = q.stats()
    assert (s["dispatched"], s["queued"], s["completed"]) == (3, 0, 2)
    check_invariants(r, q)


def test_no_window_completes_without_dispatching(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    q.dispatch(window=1)
    lease = q.claim(ids[0], "w")
    assert q.complete_and_dispatch(lease, [("k", {"v": 1})]) == (1, None)
    s = q.stats()
    assert (s["completed"], s["dispatched"], s["queued"]) == (1, 0, 1)
    check_invariants(r, q)


def test_a_duplicate_item_key_is_kept_once(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w")
    q.commit(lease, [("a", {"v": 1})])
    added, _ = q.complete_and_dispatch(lease, [("a", {"v": 9}), ("b", {"v": 2})], window=1)
    assert added == 1
    assert json.loads(r.hget(q.keys.items, "a")) == {"v": 1}
    assert (q.stats()["items"], q.stats()["items_duplicate"]) == (2, 1)


def test_a_stale_lease_stores_completes_and_dispatches_nothing(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    q.enqueue_many([f"https://example.com/{i}" for i in range(5)])
    stale = q.claim(tid, "w1", ttl=0.05)
    wait_until(lambda: q.reclaim_expired(), timeout=10)
    owner = q.claim(tid, "w2")
    q.save_checkpoint(owner, {"page": 5})
    snapshot = dump(r)
    with pytest.raises(LeaseLost) as lost:
        q.complete_and_dispatch(stale, [("late", {"v": 1})], window=4)
    assert lost.value.code == Refusal.STALE_TOKEN
    assert dump(r) == snapshot  # no item, no completion, nothing dispatched, no counter moved
    assert q.get(tid).state == "running" and q.get(tid).worker == "w2"
    q.complete_and_dispatch(owner, window=0)
    with pytest.raises(LeaseLost) as again:  # completed: a second completion is refused, writes nothing
        snapshot = dump(r)
        q.complete_and_dispatch(owner, [("late", {"v": 1})], window=4)
    assert again.value.code == Refusal.COMPLETED and dump(r) == snapshot
    check_invariants(r, q)


def test_a_reclaimed_lease_is_refused_while_the_task_waits(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    stale = q.claim_next("w1", ttl=0.05)
    wait_until(lambda: q.reclaim_expired(), timeout=10)
    snapshot = dump(r)
    with pytest.raises(LeaseLost) as lost:
        q.complete_and_dispatch(stale, window=3)
    assert lost.value.code == Refusal.WAITING and dump(r) == snapshot


def test_it_redispatches_lost_messages_and_promotes_due_retries(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    q.dispatch(window=3)
    failing = q.claim(ids[0], "w")
    q.fail(failing, "transient")  # a retry due in ≤ 75 ms
    lease = q.claim(ids[1], "w")
    wait_until(lambda: q.get(ids[0]).due_at * 1000 <= _now_ms(r), timeout=10)
    _, sent = q.complete_and_dispatch(lease, window=3, redispatch_after=0.0)
    by_id = {d.task_id: d.resent for d in sent}
    assert by_id == {ids[2]: True, ids[0]: False}  # ids[2] never claimed: re-sent; ids[0] due again
    assert q.get(ids[0]).state == "dispatched"
    assert q.stats()["redispatched"] == 1
    check_invariants(r, q)


def _now_ms(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec * 1000 + usec / 1000


def test_one_round_trip_for_items_completion_and_refill(counted: TaskQueue, r: redis.Redis) -> None:  # noqa: F811
    q = counted
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(4)])
    q.dispatch(window=2)
    lease = q.claim(ids[0], "w")
    CountingConnection.writes = 0
    _, sent = q.complete_and_dispatch(lease, [("k", {"v": 1})], window=2)
    assert CountingConnection.writes == 1 and [d.task_id for d in sent] == [ids[2]]


def test_bad_input_is_refused_before_anything_is_written(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w")
    snapshot = dump(r)
    for call in (lambda: q.complete_and_dispatch(lease, [("k",)], window=1),
                 lambda: q.complete_and_dispatch(lease, "k", window=1),
                 lambda: q.complete_and_dispatch(lease, window=-1),
                 lambda: q.complete_and_dispatch("not a lease", window=1)):  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            call()
    assert dump(r) == snapshot


def test_a_sharded_namespace_completes_and_leaves_the_refill_to_dispatch(redis_url: str,
                                                                          r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "sh", shards=3)
    q.enqueue_many([f"https://example.com/{i}" for i in range(9)])
    first = q.dispatch(window=3)
    lease = q.claim(first[0].task_id, "w")
    assert q.complete_and_dispatch(lease, [("k", {"v": 1})], window=3) == (1, None)
    assert q.get(lease.task_id).state == "completed"
    assert len(q.dispatch(window=3)) == 1  # the cross-shard pump fills the place the claim freed


def test_a_full_redis_refuses_the_items_and_the_completion_together(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Items are the first write (HSETNX, refused over maxmemory, as commit's), so a full Redis refuses
    the whole step: no item, no completion, nothing dispatched; the runner hands the task back."""
    from celery_ha.runtime.redis_process import RedisProcess, free_port

    server = RedisProcess(port=free_port(), data_dir=tmp_path / "small",
                          extra_args=["--maxmemory-policy", "noeviction"]).start()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        q = TaskQueue(r)
        ids = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
        q.dispatch(window=1)
        lease = q.claim(ids[0], "w")
        r.config_set("maxmemory", max(1, int(r.info("memory")["used_memory"]) // 2))
        snapshot = dump(r)
        # Redis 6.2 wraps the OOM reply in a script error, Redis 7 passes it on (redis-py then raises
        # OutOfMemoryError, its "OOM" prefix taken off): either way the runner takes it for an outage.
        with pytest.raises(redis.ResponseError, match="maxmemory") as full:
            q.complete_and_dispatch(lease, [("k", {"v": 1})], window=2)
        assert is_infrastructure_error(full.value)
        assert dump(r) == snapshot
        r.config_set("maxmemory", 0)
        assert q.complete_and_dispatch(lease, [("k", {"v": 1})], window=2)[0] == 1
        check_invariants(r, q)
    finally:
        server.stop()


def test_a_gated_refill_tells_when_the_first_waiting_host_is_due(redis_url: str, r: redis.Redis) -> None:
    """A gated worker arms its pump timer after every task from what the completion's script read:
    (now, hwait's first score) when asked, None when not asked or without a refill."""
    gq = TaskQueue.from_url(redis_url, "hw", host_gate=True)
    gq.hosts.set("a.example", delay=30)
    gq.enqueue_many([f"http://a.example/{i}" for i in range(3)] + ["http://b.example/1"])
    first = gq.claim_next("w")
    assert first is not None and first.task.url.startswith("http://a.example/")
    done = gq.complete_and_push(first, window=4, host_wait=True)
    due = r.zrange(gq.keys.hosts_wait, 0, 0, withscores=True)
    assert done.host_wait is not None and due and due[0][0] == "a.example"
    now, head = done.host_wait
    assert head == int(due[0][1]) and 29_000 <= head - now <= 30_000  # a.example paced 30 s from now
    assert [d.task_id for d in done.to_send or []]  # b.example's task, dispatched by the refill
    second = gq.claim(done.to_send[0].task_id, "w")
    assert second is not None and gq.complete_and_push(second, window=4).host_wait is None  # not asked
    plain = TaskQueue.from_url(redis_url, "nohw")
    plain.enqueue("http://c.example/1")
    lease = plain.claim_next("w")
    assert lease is not None
    assert plain.complete_and_push(lease, window=2, host_wait=True).host_wait[1] is None  # no host waits
    check_invariants(r, gq)
