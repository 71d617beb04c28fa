"""The durable task layer against a real redis-server: each transition, fencing, dead letters, input."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import ClassVar

import pytest
import redis
from redis.client import NEVER_DECODE

from celery_ha import InvalidInput, LeaseLost, PayloadTooLarge, TaskNotFound, TaskQueue
from celery_ha.redisio.client import redis_client
from celery_ha.state import Refusal, TaskState, task_id_for
from celery_ha.state.replies import REASONS
from celery_ha.state.url_rules import check_rules_reading
from tests.support.invariants import check_invariants
from tests.support.polling import wait_until
from tests.support.records import delete_record, raw_record, record_count


def redis_ms(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec * 1000 + usec / 1000


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, lease_ttl=30, backoff_base=0.05, backoff_cap=1.0)


class CountingConnection(redis.Connection):
    """Counts what the client writes to the socket: one write per command or per pipeline, in all
    and by the thread that wrote (a worker's own threads write beside the task's)."""

    writes = 0
    by_thread: ClassVar[Counter[str]] = Counter()

    def send_packed_command(self, command, check_health=True):  # type: ignore[override]
        CountingConnection.writes += 1
        CountingConnection.by_thread[threading.current_thread().name] += 1
        return super().send_packed_command(command, check_health)


@pytest.fixture
def counted(redis_url: str) -> TaskQueue:
    """A queue whose round trips are counted (scripts are loaded beforehand)."""
    queue = TaskQueue(redis_client(redis_url, connection_class=CountingConnection))
    queue._scripts.prepare()  # scripts and the function library loaded beforehand
    # The once-per-queue read of the URL rules (state/url_rules.py), done here: not a batch's trip.
    check_rules_reading(queue.client, queue.namespace, queue.url_rules)
    queue._rules_checked, queue._carries, queue._carries_at = True, [], time.monotonic()
    CountingConnection.writes = 0
    return queue


def dump(r: redis.Redis) -> dict[str, object]:
    """Every key of the database with its value, to prove an operation wrote nothing."""
    out: dict[str, object] = {}
    for key in r.keys("*"):
        kind = r.type(key)
        if kind == "hash" and ":d:" in key:  # a bucket of remembered ids: binary fields
            out[key] = r.execute_command("HGETALL", key, **{NEVER_DECODE: True})
        elif kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif key.endswith(":dk"):  # the bitmap of the buckets of remembered ids
            out[key] = r.execute_command("GET", key, **{NEVER_DECODE: True})
        else:
            out[key] = r.get(key)
    return out


# ---------------------------------------------------------------- enqueue, dedup, priorities
def test_enqueue_dedup_by_canonical_url(q: TaskQueue, r: redis.Redis) -> None:
    a = q.enqueue("https://Example.com:443/list?b=2&a=1#top")
    b = q.enqueue("https://example.com/list?a=1&b=2")
    c = q.enqueue("https://example.com/list?a=1&b=2", task="crawl_list")
    assert a == b == task_id_for("fetch_page", "https://example.com/list?a=1&b=2")
    assert c != a
    s = q.stats()
    assert (s["queued"], s["enqueued"], s["duplicates"]) == (2, 2, 1)
    assert q.get(a).url == "https://Example.com:443/list?b=2&a=1#top"  # the first spelling is kept
    check_invariants(r, q)


def test_enqueue_many_with_status_reports_new_and_duplicates(q: TaskQueue) -> None:
    first = q.enqueue("https://example.com/1")
    results = q.enqueue_many_with_status(["https://example.com/1", "https://example.com/2",
                                          "https://example.com/2"])
    assert [created for _, created in results] == [False, True, False]
    assert results[0][0] == first and results[1][0] == results[2][0]
    assert [i.url if i else None for i in q.get_many([first, "unknown"])] == ["https://example.com/1", None]


def test_dedup_outlives_completion_and_history_trim(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, history_max=2)
    ids = q.enqueue_many([f"https://example.com/p/{i}" for i in range(5)])
    while (lease := q.claim_next("w")) is not None:
        q.complete(lease)
    assert record_count(r, q.keys) <= 3  # history bounded (trimmed a few per completion)
    assert q.enqueue("https://example.com/p/0") == ids[0]
    assert q.stats()["queued"] == 0 and q.stats()["duplicates"] == 1
    no_dedup = q.enqueue("https://example.com/p/0", dedup=False)
    assert no_dedup != ids[0] and q.stats()["queued"] == 1


def test_priority_then_fifo(q: TaskQueue, r: redis.Redis) -> None:
    low = q.enqueue_many([f"https://example.com/low/{i}" for i in range(3)], priority=-5)
    mid = q.enqueue_many([f"https://example.com/mid/{i}" for i in range(3)])
    high = q.enqueue_many([{"url": f"https://example.com/high/{i}", "priority": 7} for i in range(3)])
    order = [q.claim_next("w").task_id for _ in range(9)]
    assert order == high + mid + low
    assert q.claim_next("w") is None
    assert r.zcard(q.keys.ready_bands) == 0
    check_invariants(r, q)


def test_a_stack_of_emptied_bands_never_hides_a_queued_task(q: TaskQueue, r: redis.Redis) -> None:
    """Each claim of a new, higher band leaves the band it emptied indexed; 100 of them sit above a
    low-priority task, which the next claim must still find."""
    for p in range(1, 101):
        q.enqueue(f"https://example.com/p/{p}", priority=p)
        assert q.claim_next("w").task.priority == p
    assert r.zcard(q.keys.ready_bands) > 64
    low = q.enqueue("https://example.com/low", priority=-1)
    lease = q.claim_next("w")
    assert lease is not None and lease.task_id == low
    assert r.zrange(q.keys.ready_bands, 0, -1) == ["-1"]  # the band this claim emptied, until the next
    check_invariants(r, q)


def test_enqueue_many_is_one_round_trip_per_batch(counted: TaskQueue) -> None:
    counted.enqueue_many([f"https://example.com/{i}" for i in range(2500)], batch_size=1000)
    assert CountingConnection.writes == 3 + 1  # and, once per queue object, the namespace's registration
    assert counted.stats()["queued"] == 2500


# ---------------------------------------------------------------- bad input writes nothing
@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"url": "ftp://example.com/a"}, InvalidInput),
        ({"url": "example.com/a"}, InvalidInput),
        ({"url": "http://"}, InvalidInput),
        ({"url": "https://example.com/" + "a" * 9000}, PayloadTooLarge),
        ({"url": 42}, InvalidInput),
        ({"url": "https://example.com/a", "meta": {"x": object()}}, InvalidInput),
        ({"url": "https://example.com/a", "meta": ["not", "a", "dict"]}, InvalidInput),
        ({"url": "https://example.com/a", "meta": {"blob": "x" * 20000}}, PayloadTooLarge),
        ({"url": "https://example.com/a", "priority": 5000}, InvalidInput),
        ({"url": "https://example.com/a", "priority": "high"}, InvalidInput),
        ({"url": "https://example.com/a", "max_attempts": 0}, InvalidInput),
        ({"url": "https://example.com/a", "task": "bad name!"}, InvalidInput),
    ],
)
def test_bad_input_raises_and_writes_nothing(q: TaskQueue, r: redis.Redis, kwargs, error) -> None:
    with pytest.raises(error):
        q.enqueue(**kwargs)
    assert r.dbsize() == 0


def test_bad_item_in_batch_writes_nothing(q: TaskQueue, r: redis.Redis) -> None:
    with pytest.raises(InvalidInput):
        q.enqueue_many(["https://example.com/ok", "mailto:someone@example.com"])
    with pytest.raises(InvalidInput):
        q.enqueue_many([{"url": "https://example.com/ok", "colour": "red"}])
    assert r.dbsize() == 0


def test_unknown_task_id(q: TaskQueue) -> None:
    with pytest.raises(TaskNotFound):
        q.get("nope")
    with pytest.raises(TaskNotFound):
        q.redrive("nope")
    assert q.claim("nope", "w") is None


def test_oversized_checkpoint_rejected(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w")
    with pytest.raises(PayloadTooLarge):
        q.save_checkpoint(lease, {"html": "x" * (70 * 1024)})
    with pytest.raises(InvalidInput):
        q.save_checkpoint(lease, {"when": object()})
    assert q.checkpoint(lease.task_id) is None


# ---------------------------------------------------------------- the lifecycle
def test_claim_returns_record_and_checkpoint_in_one_round_trip(counted: TaskQueue, r: redis.Redis) -> None:
    q = counted
    tid = q.enqueue("https://example.com/list", meta={"start_page": 1, "tags": []})
    lease = q.claim_next("w1")
    q.save_checkpoint(lease, {"page": 47, "last_id": "abc"})
    q.release(tid, token=lease.token, count_stall=False)  # hand back gracefully
    CountingConnection.writes = 0
    lease2 = q.claim_next("w2")
    assert CountingConnection.writes == 1
    q.complete(lease2)
    assert CountingConnection.writes == 2  # the whole lifecycle: two round trips
    assert lease2.task_id == tid and lease2.token == lease.token + 1
    assert lease2.checkpoint == {"page": 47, "last_id": "abc"}
    assert lease2.task.meta == {"start_page": 1, "tags": []}  # user JSON round-trips untouched
    assert lease2.task.state == "running" and lease2.task.worker == "w2"
    assert q.get(tid).state == "completed"


def test_complete_clears_checkpoint_and_counts(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    lease = q.claim_next("w1")
    q.save_checkpoint(lease, {"page": 2})
    q.complete(lease)
    info = q.get(tid)
    assert info.state == "completed" and info.worker is None
    assert q.checkpoint(tid) is None
    assert r.zscore(q.keys.completed, tid) is not None
    assert q.stats()["completed"] == 1 and q.stats()["running"] == 0
    with pytest.raises(LeaseLost):
        q.complete(lease)  # twice is refused: already completed
    check_invariants(r, q)


def test_complete_and_claim_is_one_round_trip_per_task(counted: TaskQueue, r: redis.Redis) -> None:
    q = counted
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(5)])
    lease = q.claim_next("w")
    CountingConnection.writes = 0
    order = [lease.task_id]
    while (lease := q.complete_and_claim(lease)) is not None:
        order.append(lease.task_id)
    assert order == ids and CountingConnection.writes == 5
    s = q.stats()
    assert (s["completed"], s["queued"], s["running"]) == (5, 0, 0)
    check_invariants(r, q)


def test_complete_and_claim_with_a_stale_lease_changes_nothing(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue_many(["https://example.com/a", "https://example.com/b"])
    stale = q.claim_next("w1", ttl=0.05)
    wait_until(lambda: q.reclaim_expired(), timeout=10)
    snapshot = dump(r)
    with pytest.raises(LeaseLost):
        q.complete_and_claim(stale)
    assert dump(r) == snapshot


def test_fail_retries_with_backoff_then_dead(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, backoff_base=0.2, backoff_cap=10)
    tid = q.enqueue("https://example.com/a", max_attempts=3)
    dues = []
    for attempt in (1, 2):
        lease = wait_until(lambda: q.claim_next("w"), timeout=10)
        assert lease.task.attempt == attempt
        t0 = redis_ms(r)
        assert q.fail(lease, f"boom {attempt}") == "retry"
        info = q.get(tid)
        assert info.state == "delayed" and info.error == f"boom {attempt}"
        delay = info.due_at * 1000 - t0
        base = 200 * 2 ** (attempt - 1)
        assert 0.5 * base - 5 <= delay <= 1.5 * base + 5  # exponential with jitter in [0.5, 1.5)
        dues.append(info.due_at)
        assert q.claim_next("w") is None  # not due yet (unless the machine is very slow)
        check_invariants(r, q)
    lease = wait_until(lambda: q.claim_next("w"), timeout=10)
    assert q.fail(lease, "boom 3") == "dead"
    info = q.get(tid)
    assert info.state == "dead" and info.error == "boom 3" and info.attempts == 3
    assert [t.id for t in q.dead()] == [tid]
    check_invariants(r, q)


def test_fail_without_retry_goes_dead_at_once(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/gone")
    lease = q.claim_next("w")
    q.save_checkpoint(lease, {"page": 3})
    assert q.fail(lease, "HTTP 404", retry=False) == "dead"
    assert q.get(tid).state == "dead"
    assert q.checkpoint(tid) == {"page": 3}  # kept for a redrive to resume from
    check_invariants(r, q)


def test_dead_letters_list_in_death_order(q: TaskQueue) -> None:
    """Deaths one round trip apart (several per millisecond) keep their order."""
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(40)])
    leases = [q.claim_next("w") for _ in ids]
    for lease in leases:
        q.fail(lease, "HTTP 410", retry=False)
    assert [t.id for t in q.dead(limit=100)] == ids


def test_redrive_one_and_all(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    for _ in ids:
        q.fail(q.claim_next("w"), "bad", retry=False)
    assert q.stats()["dead"] == 3
    assert q.redrive(ids[0]) == 1
    info = q.get(ids[0])
    assert info.state == "queued" and info.attempts == 0 and info.previous_error == "bad"
    assert q.redrive(ids[0]) == 0  # not dead any more
    assert q.redrive() == 2
    s = q.stats()
    assert (s["dead"], s["queued"], s["redriven"]) == (0, 3, 3)
    check_invariants(r, q)


def test_redrive_resets_stalls(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, max_stalls=0)
    tid = q.enqueue("https://example.com/a")
    q.claim_next("w", ttl=0.05)
    wait_until(lambda: q.reclaim_expired(), timeout=10)
    assert q.get(tid).state == "dead"
    q.redrive(tid)
    assert q.get(tid).stalls == 0 and q.claim_next("w").task_id == tid


# ---------------------------------------------------------------- leases, reclaim, fencing
def test_lease_expiry_is_reclaimed_and_counts_a_stall(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    lease = q.claim_next("w1", ttl=0.1)
    assert q.reclaim_expired() == 0 or q.get(tid).state == "queued"
    assert wait_until(lambda: q.get(tid).state == "queued" or q.reclaim_expired(), timeout=10)
    info = q.get(tid)
    assert info.state == "queued" and info.stalls == 1 and info.attempt == 2
    assert q.stats()["reclaimed"] == 1
    again = q.claim_next("w2")
    assert again.task_id == tid and again.token == lease.token + 1
    check_invariants(r, q)


def test_renew_keeps_the_lease(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w1", ttl=0.3)
    first = lease.expires_at
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # renew for 3+ lease lengths
        q.renew(lease, ttl=0.3)
        assert q.reclaim_expired() == 0
        time.sleep(0.05)
    assert lease.expires_at > first
    q.complete(lease)


def test_stale_holder_is_fenced_out(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    stale = q.claim_next("w1", ttl=0.05)
    q.save_checkpoint(stale, {"page": 1})
    wait_until(lambda: q.reclaim_expired(), timeout=10)
    owner = q.claim_next("w2")
    q.save_checkpoint(owner, {"page": 5})
    q.commit(owner, [("item-1", {"n": 1})])
    snapshot = dump(r)
    for action in (
        lambda: q.renew(stale),
        lambda: q.save_checkpoint(stale, {"page": 99}),
        lambda: q.commit(stale, [("item-2", {"n": 2})], {"page": 99}),
        lambda: q.complete(stale),
        lambda: q.fail(stale, "late failure"),
        lambda: q.fail(stale, "late failure", retry=False),
    ):
        with pytest.raises(LeaseLost):
            action()
    assert q.release(tid, token=stale.token) is None
    assert dump(r) == snapshot  # the stale holder changed nothing at all
    assert q.get(tid).worker == "w2"
    q.complete(owner)


def test_poison_pill_goes_dead_after_max_stalls(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, max_stalls=2)
    poison = q.enqueue("https://example.com/oom")
    healthy = q.enqueue("https://example.com/fine")
    stalls = 0
    while True:
        lease = q.claim_next("w", ttl=0.05)
        if lease is None or lease.task_id != poison:
            break
        wait_until(lambda: q.reclaim_expired(), timeout=10)  # the worker "died": its lease expires
        stalls += 1
    assert stalls == 3  # max_stalls=2: the third stall is one too many
    info = q.get(poison)
    assert info.state == "dead" and "stalled 3 times" in info.error
    assert lease is not None and lease.task_id == healthy  # other work is unaffected
    check_invariants(r, q)


def test_release_fast_failover_only_for_the_named_holder(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    lease = q.claim_next("host:123")
    assert q.release(tid, worker="host:999") is None  # not that child's lease
    assert q.release(tid, worker="host:123") == "queued"
    info = q.get(tid)
    assert info.state == "queued" and info.stalls == 1
    again = q.claim_next("host:456")
    assert again.token == lease.token + 1
    assert q.release(tid, token=again.token, count_stall=False) == "queued"
    assert q.get(tid).stalls == 1  # a graceful hand-back does not count
    check_invariants(r, q)


def test_reclaim_is_bounded_and_oldest_first(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(30)])
    for _ in ids:
        q.claim_next("w", ttl=0.01)
    wait_until(lambda: r.zcount(q.keys.running, "-inf", redis_ms(r)) == 30, timeout=10)
    assert q.reclaim_expired(batch=7, max_batches=1) == 7
    assert q.stats()["running"] == 23
    assert q.reclaim_expired(batch=7) == 23  # keeps going while batches are full
    check_invariants(r, q)


def test_reclaim_of_exactly_one_batch_is_one_round_trip(counted: TaskQueue, r: redis.Redis) -> None:
    for url in [f"https://example.com/{i}" for i in range(7)]:
        counted.enqueue(url)
        counted.claim_next("w", ttl=0.01)
    wait_until(lambda: r.zcount(counted.keys.running, "-inf", redis_ms(r)) == 7, timeout=10)
    CountingConnection.writes = 0
    assert counted.reclaim_expired(batch=7) == 7
    assert CountingConnection.writes == 1  # the script said no expired lease remains
    check_invariants(r, counted)


# ---------------------------------------------------------------- dispatch (the pump's core)
def test_dispatch_respects_window_and_redispatches_lost_messages(q: TaskQueue, r: redis.Redis) -> None:
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(10)])
    first = q.dispatch(window=4)
    assert [d.task_id for d in first] == ids[:4]
    assert all(d.task == "fetch_page" and not d.resent for d in first)
    assert q.dispatch(window=4) == []  # window full
    lease = q.claim(ids[0], "w")
    assert q.claim(ids[0], "w2") is None  # a duplicate message for a running task is dropped
    assert [d.task_id for d in q.dispatch(window=4)] == [ids[4]]
    q.complete(lease)
    assert q.claim(ids[0], "w") is None  # and for a completed one
    # dispatched but never claimed (message lost): sent again after the timeout, not duplicated
    again = q.dispatch(window=4, redispatch_after=0.0)
    assert sorted(d.task_id for d in again) == sorted(ids[1:5])
    assert all(d.resent for d in again)
    s = q.stats()
    assert (s["dispatched"], s["queued"]) == (4, 5)
    check_invariants(r, q)


def test_dispatch_promotes_due_retries(q: TaskQueue, r: redis.Redis) -> None:
    tid = q.enqueue("https://example.com/a")
    q.dispatch(window=1)
    q.fail(q.claim(tid, "w"), "transient")
    sent = wait_until(lambda: q.dispatch(window=1), timeout=10)
    assert [d.task_id for d in sent] == [tid]
    assert q.get(tid).state == "dispatched"


# ---------------------------------------------------------------- Redis time, not client time
def test_leases_and_backoff_use_redis_time_not_the_client_clock(
    q: TaskQueue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 946684800.0)  # the client believes it is 2000-01-01
    q.enqueue("https://example.com/a")
    lease = q.claim_next("w", ttl=30)
    now = redis_ms(r)
    assert abs(lease.expires_at * 1000 - (now + 30_000)) < 2000
    assert abs(r.zscore(q.keys.running, lease.task_id) - (now + 30_000)) < 2000
    q.fail(lease, "x")
    due = r.zscore(q.keys.delayed, lease.task_id)
    assert now <= due <= now + 2000  # backoff base 50 ms x jitter, on the server's clock
    assert q.get(lease.task_id).created_at * 1000 == pytest.approx(now, abs=2000)


# ---------------------------------------------------------------- outputs
def test_commit_is_idempotent_per_key_and_fenced(q: TaskQueue, r: redis.Redis) -> None:
    q.enqueue("https://example.com/list")
    lease = q.claim_next("w")
    assert q.commit(lease, [("a", {"v": 1}), ("b", {"v": 2})], {"page": 1}) == 2
    assert q.commit(lease, [("b", {"v": 2}), ("c", {"v": 3})], {"page": 2}) == 1
    assert r.lrange(q.keys.item_log, 0, -1) == ["a", "b", "c"]
    assert json.loads(r.hget(q.keys.items, "c")) == {"v": 3}
    assert q.checkpoint(lease.task_id) == {"page": 2}
    with pytest.raises(InvalidInput):
        q.commit(lease, [("", {"v": 4})])
    s = q.stats()
    assert (s["items"], s["items_duplicate"]) == (3, 1)


def test_stats_shape(q: TaskQueue) -> None:
    s = q.stats()
    for key in ("queued", "dispatched", "running", "delayed", "completed", "dead"):
        assert s[key] == 0


# ---------------------------------------------------------------- refusal codes
def test_each_refusal_reaches_the_caller_with_its_reason(q: TaskQueue, r: redis.Redis) -> None:
    """A refused write under a lease raises LeaseLost naming why; claims and releases stay None."""
    ids = q.enqueue_many([f"https://example.com/{i}" for i in range(4)])
    gone = q.claim(ids[0], "w1", ttl=0.05)
    wait_until(lambda: q.reclaim_expired(), timeout=10)

    def lost(action, code: int) -> None:
        with pytest.raises(LeaseLost) as caught:
            action()
        assert str(caught.value).endswith(REASONS[code]), str(caught.value)

    lost(lambda: q.renew(gone), Refusal.WAITING)  # reclaimed, not claimed again yet
    owner = q.claim(ids[0], "w2")
    for action in (lambda: q.renew(gone), lambda: q.save_checkpoint(gone, {"p": 1}),
                   lambda: q.commit(gone, [("k", {"v": 1})]), lambda: q.complete(gone),
                   lambda: q.complete_and_claim(gone), lambda: q.fail(gone, "late")):
        lost(action, Refusal.STALE_TOKEN)
    assert f"lease on task {ids[0]} (token {gone.token}) is lost" in _lease_lost_text(lambda: q.renew(gone))
    assert q.claim(ids[0], "w3") is None  # running
    assert q.release(ids[0], worker="w1") is None  # another worker holds it
    q.complete(owner)
    lost(lambda: q.complete(owner), Refusal.COMPLETED)
    assert q.claim(ids[0], "w3") is None and q.release(ids[0]) is None

    retry = q.claim(ids[1], "w")
    q.fail(retry, "transient")
    lost(lambda: q.renew(retry), Refusal.DELAYED)
    assert q.claim(ids[1], "w") is None
    dead = q.claim(ids[2], "w")
    q.fail(dead, "HTTP 404", retry=False)
    lost(lambda: q.commit(dead, []), Refusal.DEAD)
    assert q.claim(ids[2], "w") is None and q.redrive(ids[3]) == 0  # ids[3] is queued, not dead

    delete_record(r, q.keys, ids[2])  # as if its history had been trimmed
    lost(lambda: q.save_checkpoint(dead, {"p": 2}), Refusal.UNKNOWN)
    with pytest.raises(TaskNotFound, match="no task 'nope' in namespace 'default'"):
        q.redrive("nope")


def _lease_lost_text(action) -> str:
    with pytest.raises(LeaseLost) as caught:
        action()
    return str(caught.value)


def test_scripts_answer_refusal_codes(redis_url: str) -> None:
    """The raw replies: every refusal is its code, never false or a bare {0}."""
    # A minute of backoff: the retried task must still be delayed at the last claim_next, however
    # slowly a loaded machine runs this test.
    q = TaskQueue.from_url(redis_url, lease_ttl=30, backoff_base=60, backoff_cap=60)
    running, delayed, dead, queued = q.enqueue_many([f"https://example.com/{i}" for i in range(4)])
    lease = q.claim(running, "w")
    q.fail(q.claim(delayed, "w"), "transient")
    q.fail(q.claim(dead, "w"), "gone", retry=False)
    for tid, code in ((running, Refusal.RUNNING), (delayed, Refusal.DELAYED), (dead, Refusal.DEAD),
                      ("nope", Refusal.UNKNOWN)):
        assert q._run("claim", tid, "w", 1000) == code
    stale = str(lease.token + 1)
    assert q._run("renew", running, stale, 1000) == Refusal.STALE_TOKEN
    assert q._run("renew", queued, "1", 1000) == Refusal.WAITING
    assert q._run("checkpoint", running, stale, "{}") == Refusal.STALE_TOKEN
    assert q._run("complete", delayed, "1", 10, 1000) == Refusal.DELAYED
    assert q._run("complete_next", dead, "1", 10, 1000, "w", 1000, 100) == Refusal.DEAD
    assert q._run("fail", "nope", "1", "x", "1", 10, 10) == Refusal.UNKNOWN
    assert q._run("release", running, "", "other", "1", "r") == Refusal.OTHER_WORKER
    assert q._run("release", running, stale, "", "1", "r") == Refusal.STALE_TOKEN
    assert q._run("redrive", queued, 1) == Refusal.WAITING
    assert q._run("redrive", "nope", 1) == Refusal.UNKNOWN
    q.claim(queued, "w")
    assert q._run("claim_next", "w", 1000, 100) == Refusal.EMPTY
    assert q.get(running).state == TaskState.RUNNING == "running"


@pytest.mark.parametrize("ttl", [-100, 0, float("nan"), float("inf")])
def test_a_claim_refuses_a_non_positive_or_non_finite_ttl_and_writes_nothing(redis_url: str, r: redis.Redis,
                                                                               ttl: float) -> None:
    q = TaskQueue.from_url(redis_url, namespace="ttl")
    tid = q.enqueue("https://example.com/ttl")
    before = raw_record(r, q.keys, tid)
    with pytest.raises(InvalidInput):
        q.claim(tid, "w1", ttl=ttl)
    with pytest.raises(InvalidInput):
        q.claim_next("w1", ttl=ttl)
    assert raw_record(r, q.keys, tid) == before and q.get(tid).state == "queued"


def test_a_claim_may_adopt_the_task_running_under_its_own_worker_and_no_other(q: TaskQueue,
                                                                                r: redis.Redis) -> None:
    """A prefork child whose claim's reply was lost (a timeout, a Redis pause) claims again: with
    ``adopt`` the task running under its own name is its lease (same token, fresh expiry), not
    refused and left to expire with a stall; another worker's lease is never adopted."""
    tid = q.enqueue("https://example.com/a")
    first = q.claim(tid, "node:1", ttl=5)
    assert first is not None
    assert q.claim(tid, "node:1", ttl=5) is None  # without adopt: refused, as before
    assert q.claim(tid, "node:2", ttl=5, adopt=True) is None  # another holder's lease: refused
    again = q.claim(tid, "node:1", ttl=30, adopt=True)
    assert again is not None and again.token == first.token and again.task_id == tid
    assert again.expires_at > first.expires_at + 20
    assert r.zscore(q.keys.running, tid) == pytest.approx(again.expires_at * 1000, abs=1)
    q.complete(again)
    assert q.stats()["completed"] == 1 and q.claim(tid, "node:1", adopt=True) is None
