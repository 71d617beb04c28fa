"""Many claimers at once against a real redis-server: no task is handed out twice, none is lost."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import Counter

import redis

from celery_ha import TaskQueue
from tests.support.invariants import check_invariants

EXEC_LOG = "test:executions"  # outside the queue's namespace: what the "workers" actually ran


def drain(url: str, worker: str, stop_when_empty: bool = True, wait: float = 0.0,
          stop: threading.Event | None = None) -> int:
    """Claim and complete until the queue is empty (or ``stop`` is set); log every execution."""
    q = TaskQueue.from_url(url)
    log = redis.Redis.from_url(url)
    done = 0
    while not (stop and stop.is_set()):
        lease = q.claim_next(worker, wait=wait)
        if lease is None:
            if stop_when_empty:
                break
            continue
        log.rpush(EXEC_LOG, lease.task_id)
        q.complete(lease)
        done += 1
    return done


def _process_main(url: str, worker: str) -> None:
    drain(url, worker)


def test_threads_and_processes_drain_each_task_exactly_once(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url)
    n = 20_000
    ids = q.enqueue_many([f"https://example.com/case/{i}" for i in range(n)])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_process_main, args=(redis_url, f"proc-{i}")) for i in range(2)]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=drain, args=(redis_url, f"thread-{i}")) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    for p in procs:
        p.join(timeout=240)
        assert p.exitcode == 0
    executions = Counter(r.lrange(EXEC_LOG, 0, -1))
    assert len(executions) == n and set(executions) == set(ids)
    assert max(executions.values()) == 1, "a task was executed twice"
    s = q.stats()
    assert (s["completed"], s["queued"], s["running"], s["claimed"]) == (n, 0, 0, n)
    check_invariants(r, q)


def test_idle_blocked_workers_with_trickling_tasks_execute_each_once(redis_url: str, r: redis.Redis) -> None:
    """The seed's BRPOPLPUSH-onto-itself pop ran each trickled task on every idle worker (4x-9.8x)."""
    q = TaskQueue.from_url(redis_url)
    stop = threading.Event()
    workers = [threading.Thread(target=drain, args=(redis_url, f"idle-{i}", False, 0.5, stop))
               for i in range(16)]
    for w in workers:
        w.start()
    ids = []
    for i in range(200):
        ids.append(q.enqueue(f"https://example.com/trickle/{i}"))
        if i % 10 == 0:
            time.sleep(0.01)  # trickle: let the idle workers block between arrivals
    deadline = time.monotonic() + 60
    while q.stats()["completed"] < len(ids) and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    for w in workers:
        w.join(timeout=10)
    executions = Counter(r.lrange(EXEC_LOG, 0, -1))
    assert set(executions) == set(ids)
    assert sum(executions.values()) == len(ids), f"executions per task: {max(executions.values())}"
    check_invariants(r, q)
