"""Real ``celery worker`` processes: crashes, duplicates, poison pills, stale holders.

Each test gets a fresh namespace and broker database; every worker/beat it starts is killed (as a
process group) in teardown. Outcomes are read from Redis, the sink and the demo site's request log.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from celery_ha.base.procfs import child_pids
from celery_ha.integration.dispatch.broker import broker_backlog
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_helpers import step_hits, wait_for

pytestmark = pytest.mark.slow


def _holder_pid(cluster, tid: str) -> int:
    info = cluster.q.get(tid)
    assert info.state == "running" and info.worker
    return int(info.worker.rsplit(":", 1)[1])


def test_sigkill_pool_child_resumes_from_checkpoint_within_3s(make_cluster, site):
    """(a) SIGKILL the pool child mid-task: the task re-runs within 3 s (fast failover, not lease
    expiry), resumes from its checkpoint and completes exactly once with every item once."""
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/slow/"] = 0.15
    cluster.worker("w1", concurrency=2)
    tid = cluster.q.enqueue(f"{site.url}/slow/T1", task="test_steps", meta={"n": 12})
    cluster.pump()
    wait_for(lambda: any(step >= 4 for step, _ in step_hits(site, "T1")), message="step 4")
    pid = _holder_pid(cluster, tid)
    checkpoint_at_kill = (cluster.q.checkpoint(tid) or {}).get("i", 0)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cluster.state(tid) == "completed", timeout=20, message="completion")

    info = cluster.q.get(tid)
    assert info.stalls == 1 and info.attempts == 0
    stats = cluster.q.stats()
    assert stats["completed"] == 1 and stats["released"] == 1 and stats["reclaimed"] == 0
    after = sorted((t, s) for s, t in step_hits(site, "T1") if t > killed_at)
    assert after, "the task never ran again"
    first_time, first_step = after[0]
    assert first_time - killed_at < 3.0, f"re-run took {first_time - killed_at:.2f}s"
    assert checkpoint_at_kill <= first_step <= checkpoint_at_kill + 1, (checkpoint_at_kill, first_step)
    assert first_step >= 4
    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert sorted(keys) == sorted(f"{tid}:{i}" for i in range(12))
    assert count_items(cluster.r, cluster.namespace) == 12


def test_sigkill_whole_worker_other_worker_finishes_after_ttl(make_cluster, site):
    """(b) SIGKILL a whole worker (main process and children): its leases expire after the TTL, the
    sweep (beat) reclaims them and the other worker finishes every task, resuming checkpoints."""
    cluster = make_cluster()  # lease TTL 3 s
    site.delays["/slow/"] = 0.1
    w1 = cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()
    tids = [cluster.q.enqueue(f"{site.url}/slow/B{i}", task="test_steps", meta={"n": 30}) for i in range(4)]
    cluster.pump()
    node1 = w1.node  # type: ignore[attr-defined]
    held = wait_for(lambda: [t for t in tids if (cluster.q.get(t).worker or "").startswith(node1 + ":")
                             and (cluster.q.checkpoint(t) or {}).get("i", 0) >= 3],
                    message="worker 1 to hold a task with progress")
    killed_at = time.time()
    cluster.kill_group(w1)
    wait_for(lambda: all(cluster.state(t) == "completed" for t in tids), timeout=45, message="all tasks")

    for t in held:
        info = cluster.q.get(t)
        assert info.stalls == 1, info
        label = cluster.q.get(t).url.rsplit("/", 1)[1]
        after = sorted(ts for step, ts in step_hits(site, label) if ts > killed_at)
        assert after and after[0] - killed_at >= 2.0, "re-run before the lease could have expired"
        steps = [step for step, _ in step_hits(site, label)]
        assert sorted(set(steps)) == list(range(30))
        # resumed, not restarted: at most the in-flight step is repeated
        assert len(steps) - 30 <= 1, steps
    assert cluster.q.stats()["reclaimed"] >= len(held)
    assert count_items(cluster.r, cluster.namespace) == 4 * 30


def test_duplicate_messages_execute_once(make_cluster, site):
    """(c) Several Celery messages for one task id: one execution, the rest acked and dropped."""
    cluster = make_cluster()
    site.delays["/case/"] = 0.5
    cluster.worker("w1", concurrency=3)
    url = site.case_url(7)
    tid = cluster.q.enqueue(url)
    cluster.q.dispatch(10)
    cluster.send_raw("fetch_page", tid, n=4)
    wait_for(lambda: cluster.state(tid) == "completed", message="completion")
    cluster.send_raw("fetch_page", tid, n=2)  # late duplicates, after completion
    wait_for(lambda: broker_backlog(cluster.broker, cluster.crawl_queue) == 0
             and not cluster.broker.hlen("unacked"), message="broker drained")
    wait_for(lambda: "dropped" in cluster.log_text(cluster.procs[0]), message="drops logged")
    assert len(site.hits(path="/case/7")) == 1
    stats = cluster.q.stats()
    assert stats["claimed"] == 1 and stats["completed"] == 1
    assert count_items(cluster.r, cluster.namespace) == 1


def test_poison_pill_goes_dead_after_max_stalls(make_cluster, site):
    """(d) A task that kills its own pool child every time: dead after max_stalls, released fast
    each time; the other tasks are unaffected."""
    cluster = make_cluster(CELERY_HA_MAX_STALLS="2", CELERY_HA_LEASE_TTL="30",
                           CELERY_HA_HEARTBEAT_INTERVAL="1")
    cluster.worker("w1", concurrency=2)
    poison = cluster.q.enqueue(f"{site.url}/slow/poison", task="test_suicide")
    good = [cluster.q.enqueue(site.case_url(i)) for i in range(10)]
    cluster.pump()
    wait_for(lambda: cluster.state(poison) == "dead", timeout=30, message="poison pill dead")
    wait_for(lambda: all(cluster.state(t) == "completed" for t in good), timeout=30, message="good tasks")
    info = cluster.q.get(poison)
    assert info.stalls == 3 and "stalled" in (info.error or "")
    assert len(site.hits(path="/slow/poison")) == 3
    assert cluster.q.stats()["reclaimed"] == 0  # every crash was a fast release, no TTL wait
    assert count_items(cluster.r, cluster.namespace) == 10


def test_a_task_that_outlives_its_hard_time_limit_every_time_ends_dead(make_cluster, site):
    """billiard's hard limit SIGTERMs the child (then SIGKILLs it): a task that swallows the soft
    limit and outlives the hard one every run must count a stall each time and end dead after
    max_stalls, not be handed back as a graceful stop, uncounted, for ever."""
    cluster = make_cluster(CELERY_HA_TASK_TIME_LIMIT="2", CELERY_HA_MAX_STALLS="2",
                           CELERY_HA_HEARTBEAT_INTERVAL="1")
    cluster.worker("w1", concurrency=1)
    stubborn = cluster.q.enqueue(f"{site.url}/slow/stubborn", task="test_stubborn")
    good = cluster.q.enqueue(site.case_url(1))
    cluster.pump()
    wait_for(lambda: cluster.state(stubborn) == "dead", timeout=45, message="the stubborn task dead")
    info = cluster.q.get(stubborn)
    assert info.stalls == 3 and "hard time limit" in (info.error or "")
    assert len(site.hits(path="/slow/stubborn")) == 3
    wait_for(lambda: cluster.state(good) == "completed", timeout=20, message="the task behind it")


def test_watchdog_sweeps_when_beat_is_down(make_cluster, site):
    """(e) Beat runs the sweep; after beat dies, the workers' watchdog reclaims expired leases."""
    cluster = make_cluster()
    cluster.worker("w1", concurrency=2)
    beat = cluster.beat()
    wait_for(lambda: (cluster.r.hget(cluster.q.keys.meta, "last_sweep_by") or "").startswith("beat"),
             timeout=30, message="a sweep by beat")
    cluster.kill_group(beat)
    tid = cluster.q.enqueue(site.case_url(3))
    ghost = cluster.q.claim(tid, worker="ghost@gone:1", ttl=1.0)  # a holder that never renews
    assert ghost is not None
    wait_for(lambda: cluster.state(tid) == "completed", timeout=20, message="reclaim and re-run")
    assert cluster.q.get(tid).stalls == 1
    assert cluster.q.stats()["reclaimed"] == 1
    assert (cluster.r.hget(cluster.q.keys.meta, "last_sweep_by") or "").startswith("watchdog")


def test_stale_holder_cannot_emit_or_complete(make_cluster, site):
    """(h) Freeze the holder (SIGSTOP) until its lease is reclaimed and the task re-run elsewhere;
    thawed, the stale holder's emit and complete are refused: one completion, one output."""
    cluster = make_cluster()
    site.delays["/slow/stale"] = 1.0
    cluster.worker("w1", concurrency=2)
    tid = cluster.q.enqueue(f"{site.url}/slow/stale", task="test_marker")
    cluster.pump()
    wait_for(lambda: site.hits(path="/slow/stale") or cluster.state(tid) == "running", message="start")
    wait_for(lambda: cluster.state(tid) == "running", message="running")
    pid = _holder_pid(cluster, tid)
    first = cluster.q.get(tid).token
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: cluster.state(tid) == "completed", timeout=20, message="re-run elsewhere")
        assert cluster.q.get(tid).token == first + 1
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "lease is lost" in cluster.log_text(cluster.procs[0]) or
             "stopped, its lease is lost" in cluster.log_text(cluster.procs[0]), message="stale run stopped")
    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert keys == [f"run-{first + 1}"]  # the second lease's item only
    stats = cluster.q.stats()
    assert stats["completed"] == 1 and stats["items"] == 1
    assert cluster.state(tid) == "completed"


def test_a_worker_killed_with_messages_reserved_loses_no_task(make_cluster, site):
    """(i) A worker SIGKILLed while its main process holds durable tasks' messages its pool children
    have not claimed: kombu kept no copy of them (patch ``kombu_lean_acks``), so they are gone with
    the worker, and the durable layer sends those still-``dispatched`` tasks again after
    ``CELERY_HA_REDISPATCH_AFTER``; another worker runs each of them once."""
    cluster = make_cluster(CELERY_HA_REDISPATCH_AFTER="2")
    w1 = cluster.worker("w1", concurrency=2)
    children = child_pids(w1.pid)
    assert len(children) == 2
    for pid in children:  # the pool can take messages but claims none
        os.kill(pid, signal.SIGSTOP)
    urls = [site.case_url(i) for i in (1, 2)]
    tids = [cluster.q.enqueue(u) for u in urls]
    cluster.pump()
    # w1's main process reserves both messages (prefetch: one per pool process): off the broker's list,
    # in no unacked hash, their tasks still dispatched.
    wait_for(lambda: broker_backlog(cluster.broker, cluster.crawl_queue) == 0, message="messages taken")
    assert [cluster.state(t) for t in tids] == ["dispatched", "dispatched"]
    assert cluster.broker.hlen("unacked") == 0 and cluster.broker.zcard("unacked_index") == 0
    cluster.kill_group(w1)
    assert broker_backlog(cluster.broker, cluster.crawl_queue) == 0  # nothing came back from kombu
    cluster.worker("w2", concurrency=2)
    wait_for(lambda: cluster.all_completed(tids), timeout=45, message="both tasks re-sent and run")
    assert cluster.q.stats()["redispatched"] >= 2
    for i in (1, 2):
        assert len(site.hits(path=f"/case/{i}")) == 1
    assert count_items(cluster.r, cluster.namespace) == 2



def test_reserved_messages_are_sent_again_once_the_workers_processes_fall_silent(make_cluster, site):
    """(ii) The same loss with the redispatch timeout far beyond the deadline (300 s): once the dead
    worker's pool processes have stopped beating, a sweep (here the watchdog of the next worker) sends
    its stranded ``dispatched`` tasks again at once. Each page is still fetched once."""
    cluster = make_cluster(CELERY_HA_REDISPATCH_AFTER="300")
    w1 = cluster.worker("w1", concurrency=2)
    for pid in child_pids(w1.pid):  # the pool can take messages but claims none
        os.kill(pid, signal.SIGSTOP)
    tids = [cluster.q.enqueue(site.case_url(i)) for i in (1, 2)]
    cluster.pump()
    wait_for(lambda: broker_backlog(cluster.broker, cluster.crawl_queue) == 0, message="messages taken")
    cluster.kill_group(w1)
    w2 = cluster.worker("w2", concurrency=2)
    wait_for(lambda: cluster.all_completed(tids), timeout=40, message="both tasks well before 300 s")
    assert "stopped beating" in cluster.log_text(w2)
    for i in (1, 2):
        assert len(site.hits(path=f"/case/{i}")) == 1
    assert count_items(cluster.r, cluster.namespace) == 2
