"""Chains (``CELERY_HA_CHAIN``) through real ``celery worker`` processes: a pool process that completes
a task leases the next queued task of the same name in the completion's script and runs it under the
same message. Judged by the site's request log, the sink, Redis state and the broker's messages."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest

from celery_ha.state import TaskQueue
from celery_ha.state.pause import pause, resume
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_helpers import pause_process, step_hits, wait_for, watched_lpushes
from tests.support.invariants import check_invariants

pytestmark = pytest.mark.slow


def _run_counting_messages(cluster: Any, urls: list[str], task: str = "fetch_page") -> tuple[list[str], int]:
    """Enqueue ``urls``, pump, wait for every task to complete; returns (ids, Celery messages sent)."""
    with watched_lpushes(cluster.broker_url) as seen:
        ids = cluster.q.enqueue_many(urls, task=task)
        cluster.pump()
        wait_for(lambda: cluster.all_completed(ids), timeout=60, message=f"{len(ids)} tasks completed")
    return ids, sum(cluster.crawl_queue in c["command"] for c in seen)


@pytest.mark.parametrize("chain, shards", [("default", "1"), ("0", "1"), ("default", "4"), ("0", "4")])
def test_a_busy_worker_runs_queued_tasks_without_a_message_each(make_cluster, site, chain: str,
                                                                shards: str) -> None:
    """With work queued beyond the window, a completing process takes the next task itself: 40 pages
    complete exactly once (one request each, one item each) with far fewer Celery messages than tasks;
    with CELERY_HA_CHAIN=0 every task has its message. A sharded namespace (its refill is the pump's)
    chains from the completed task's shard."""
    env = {} if chain == "default" else {"CELERY_HA_CHAIN": chain}
    cluster = make_cluster(CELERY_HA_WINDOW="2", CELERY_HA_SHARDS=shards, **env)
    cluster.q = TaskQueue(cluster.r, cluster.namespace, lease_ttl=3, shards=int(shards))
    site.delays["/case/"] = 0.02
    w1 = cluster.worker("w1", concurrency=2)
    _, messages = _run_counting_messages(cluster, [site.case_url(n) for n in range(40)])
    assert all(len(site.hits(path=f"/case/{n}")) == 1 for n in range(40))
    assert count_items(cluster.r, cluster.namespace) == 40
    stats = cluster.q.stats()
    assert stats["claimed"] == 40 and stats["completed"] == 40 and stats["released"] == 0
    check_invariants(cluster.r, cluster.q)
    if chain == "default":
        assert messages <= 20, messages  # the pump's 2, the refills while chains ran, chain ends
        wait_for(lambda: "chained: " in cluster.log_text(w1), message="a message's result naming its chain")
    else:
        assert messages >= 40, messages
        assert "chained" not in cluster.log_text(w1)


def test_a_chain_takes_only_tasks_of_its_own_name(make_cluster, site) -> None:
    """Two task names interleaved on one queue: each task runs its own function (fetch_page's items
    are keyed by URL, test_marker's by lease token), none twice, whatever chained."""
    cluster = make_cluster(CELERY_HA_WINDOW="1", CELERY_HA_CHAIN="30")
    site.delays["/case/"] = 0.02
    cluster.worker("w1", concurrency=1)
    pages, markers = [], []
    for n in range(0, 30, 2):
        pages.append(cluster.q.enqueue(site.case_url(n)))
        markers.append(cluster.q.enqueue(site.case_url(n + 1), task="test_marker"))
    for n in range(30, 40):  # a run of one name, which a chain takes
        pages.append(cluster.q.enqueue(site.case_url(n)))
    cluster.pump()
    wait_for(lambda: cluster.all_completed(pages + markers), timeout=60, message="every task completed")
    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert sorted(k for k in keys if k.startswith("run-")) == sorted(
        f"run-{cluster.q.get(t).token}" for t in markers)
    page_keys = sorted(k for k in keys if not k.startswith("run-"))
    assert page_keys == sorted(site.case_url(n) for n in range(40) if n % 2 == 0 or n >= 30)
    assert all(len(site.hits(path=f"/case/{n}")) == 1 for n in range(40))
    assert cluster.q.stats()["claimed"] == 40
    check_invariants(cluster.r, cluster.q)


def test_a_chain_keeps_to_max_tasks_per_child(make_cluster, site) -> None:
    """``--max-tasks-per-child 4`` (Celery counts messages, which a chain spares): a pool process
    stops chaining once it ran 4 tasks, so Celery replaces it after at most 2 x 4 tasks, where one
    process used to run every task of a 30-second chain."""
    cluster = make_cluster(CELERY_HA_WINDOW="1", CELERY_HA_CHAIN="30")
    site.delays["/case/"] = 0.02
    ids = [cluster.q.enqueue(site.case_url(n), task="test_pid") for n in range(30)]
    cluster.worker("w1", concurrency=1, args=("--max-tasks-per-child", "4"))
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=90, message="every task completed")
    by_task = dict(iter_items(cluster.r, cluster.namespace, with_keys=True))
    assert sorted(by_task) == sorted(ids)
    per_process = Counter(item["pid"] for item in by_task.values())
    assert max(per_process.values()) <= 8, per_process
    assert max(per_process.values()) >= 5, per_process  # the first 4 of each process chained
    assert all(len(site.hits(path=f"/case/{n}")) == 1 for n in range(30))
    check_invariants(cluster.r, cluster.q)


def test_a_chained_task_whose_process_is_killed_is_released_at_once(make_cluster, site) -> None:
    """SIGKILL the pool process while it runs a chained task (leased by the previous completion, no
    message of its own): the worker's fast failover releases it (not the 30 s lease expiry), and it
    resumes from its checkpoint and completes once."""
    cluster = make_cluster(CELERY_HA_WINDOW="1", CELERY_HA_CHAIN="30", CELERY_HA_LEASE_TTL="30",
                           CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/slow/"] = 0.15
    cluster.worker("w1", concurrency=1)
    quick = [cluster.q.enqueue(f"{site.url}/slow/Q{i}", task="test_steps", meta={"n": 1}) for i in range(4)]
    slow = cluster.q.enqueue(f"{site.url}/slow/S", task="test_steps", meta={"n": 20})
    cluster.pump()
    wait_for(lambda: any(step >= 4 for step, _ in step_hits(site, "S")), timeout=30,
             message="step 4 of the slow task")
    # One message went to the process (the first task's), the refill sent the second one's, which
    # waits in the broker: the slow task runs in a chain, without a message.
    assert cluster.state(quick[1]) == "dispatched"
    info = cluster.q.get(slow)
    assert info.state == "running"
    killed_at = time.time()
    os.kill(int(info.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    wait_for(lambda: cluster.state(slow) == "completed", timeout=20, message="the slow task's completion")
    after = sorted(t for _, t in step_hits(site, "S") if t > killed_at)
    assert after and after[0] - killed_at < 5.0, "re-run after the lease's expiry, not by failover"
    assert cluster.q.get(slow).stalls == 1
    wait_for(lambda: cluster.all_completed(quick), timeout=30, message="the quick tasks")
    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert sorted(k for k in keys if k.startswith(slow)) == sorted(f"{slow}:{i}" for i in range(20))
    assert cluster.q.stats()["reclaimed"] == 0
    check_invariants(cluster.r, cluster.q)


def test_a_warm_shutdown_ends_the_chain_and_hands_nothing_to_the_lease_expiry(make_cluster, site) -> None:
    """SIGTERM (warm shutdown) while a process chains: the task it runs completes, the chain takes no
    next task, no task is left running (nothing waits for a lease to expire) and no stall is
    counted; another worker finishes the rest, each step fetched once."""
    cluster = make_cluster(CELERY_HA_WINDOW="1", CELERY_HA_CHAIN="30", CELERY_HA_LEASE_TTL="30")
    site.delays["/slow/"] = 0.1
    w1 = cluster.worker("w1", concurrency=1)
    ids = [cluster.q.enqueue(f"{site.url}/slow/G{i}", task="test_steps", meta={"n": 3}) for i in range(12)]
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 3, timeout=30, message="three completions")
    os.kill(w1.pid, signal.SIGTERM)
    w1.wait(timeout=30)
    states = [cluster.state(t) for t in ids]
    assert "running" not in states, states
    assert "completed" in states and ("queued" in states or "dispatched" in states), states
    cluster.worker("w2", concurrency=2)
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every task after the restart")
    for i in range(12):  # resumed, not restarted: at most the step in flight at the stop is repeated
        steps = sorted(step for step, _ in step_hits(site, f"G{i}"))
        assert sorted(set(steps)) == [0, 1, 2] and len(steps) <= 4, (i, steps)
    stats = cluster.q.stats()
    assert stats["reclaimed"] == 0 and all(cluster.q.get(t).stalls == 0 for t in ids)
    check_invariants(cluster.r, cluster.q)


def test_a_redis_pause_while_processes_chain_charges_no_task(make_cluster, state_redis) -> None:
    """The state Redis stopped for 3 s while every process chains: a completion's script, queued in
    Redis while its client timed out, runs at the resume and leases the next task to a process that
    never heard of it. That process hands it back (uncounted) once Redis answers: no task waits for
    its lease to expire, none is charged a stall, nothing is reclaimed."""
    cluster = make_cluster(state_url=state_redis.url, CELERY_HA_CHAIN="30", CELERY_HA_LEASE_TTL="5",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_REDISPATCH_AFTER="10")
    cluster.worker("w1", concurrency=3)
    ids = cluster.q.enqueue_many([f"http://noop.invalid/{i}" for i in range(1500)], task="test_noop")
    cluster.pump()
    assert state_redis.proc is not None
    wait_for(lambda: cluster.q.stats()["completed"] >= 150 and cluster.q.stats()["running"] >= 2, timeout=30,
             message="the chains under way")
    pause_process(state_redis.proc, 3.0)  # past the clients' socket timeout
    wait_for(lambda: cluster.all_completed(ids), timeout=40, interval=0.2, message="every task after it")
    charged = [(i.id, i.attempts, i.stalls) for i in cluster.q.get_many(ids) if i.attempts or i.stalls]
    assert not charged, charged
    stats = cluster.q.stats()
    assert (stats["reclaimed"], stats["dead"]) == (0, 0), stats
    check_invariants(cluster.r, cluster.q)


def test_a_pause_stops_the_chains_too(make_cluster, site) -> None:
    """`celery-ha pause` while every process chains: once the processes read the pause (their window
    is 0), no chain takes another task; the tasks whose messages had gone out finish, then nothing
    starts until the resume."""
    cluster = make_cluster(CELERY_HA_WINDOW="2", CELERY_HA_CHAIN="30")
    site.delays["/slow/"] = 0.03
    cluster.worker("w1", concurrency=2)
    ids = [cluster.q.enqueue(f"{site.url}/slow/P{i}", task="test_steps", meta={"n": 1}) for i in range(300)]
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 20, timeout=30, message="20 completions")
    assert pause(cluster.r, cluster.namespace, "test")
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 3.0, timeout=5, interval=0.1,
             message="3 s for the processes to read the pause")  # the wait itself is what is tested
    settled = cluster.q.stats()["completed"]
    wait_for(lambda: time.monotonic() - started > 5.0, timeout=5, interval=0.1, message="2 s more")
    assert cluster.q.stats()["completed"] == settled < 300
    assert cluster.q.stats()["running"] == 0
    assert resume(cluster.r, cluster.namespace)
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every task after the resume")
    check_invariants(cluster.r, cluster.q)
