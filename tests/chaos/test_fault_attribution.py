"""Whose fault an error is decides what it costs, in real worker processes with injected faults
(``tests/support/fault_injection.py``):

- an error of the task's own function is the task's: an attempt counted;
- an unexpected error of celery-ha's own code after the function returned (its completion, the
  script push) hands the task back without an attempt, logged once with its traceback; the task
  completes on its next run;
- the lease keeper outlives any error of its own (a failing tick, heartbeat or renewal) and keeps
  the leases of tasks longer than the TTL alive;
- a pool process that exits stops its keeper first: no heartbeat registers it again afterwards.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.keys import QueueKeys
from celery_ha.state.sink import iter_items
from celery_ha.state.worker_registry import list_workers
from tests.support.celery_helpers import Cluster, wait_for

pytestmark = pytest.mark.slow

IMPORTS = "tests.support.celery_tasks,tests.support.fault_injection"


def _faulty_cluster(make_cluster, faults: str, **env: str) -> Cluster:
    return make_cluster(CELERY_HA_EXTRA_IMPORTS=IMPORTS, CELERY_HA_TEST_FAULTS=faults, **env)


def _faults_met(cluster: Cluster, fault: str) -> int:
    key = f"celery-ha-test:faults:{cluster.namespace}:{fault}"
    return int(cluster.r.scard(key) if cluster.r.type(key) == "set" else cluster.r.get(key) or 0)


def _diagnosis(cluster: Cluster, ids: list[str], worker) -> str:
    infos = [(i.id, i.state, i.attempts, i.stalls, i.error) for i in cluster.q.get_many(ids)]
    return f"{infos}\n{cluster.log_text(worker)[-4000:]}"


@pytest.mark.parametrize("fault", ["complete-before", "complete-after"])
def test_a_fault_of_the_completion_hands_the_task_back_without_an_attempt(make_cluster, site, fault):
    """``complete-before``: the completion's script never ran (the task runs again and completes
    then); ``complete-after``: it ran (the task is complete; nothing runs again). Either way no task
    is charged, and each fault is logged once, with its traceback. The same worker still charges
    the task whose own function fails."""
    cluster = _faulty_cluster(make_cluster, fault, CELERY_HA_WINDOW="4")
    worker = cluster.worker("w1", concurrency=2)
    urls = [site.case_url(n) for n in range(6)]
    ids = cluster.q.enqueue_many(urls)
    own_bug = cluster.q.enqueue(site.case_url(100), task="test_user_fault", max_attempts=1)
    cluster.pump()
    try:
        wait_for(lambda: cluster.all_completed(ids) and cluster.state(own_bug) == "dead", timeout=60,
                 interval=0.2, message="every page completed and the faulty task dead")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, [*ids, own_bug], worker)}") from None

    infos = cluster.q.get_many(ids)
    assert [(i.attempts, i.stalls) for i in infos] == [(0, 0)] * len(ids), _diagnosis(cluster, ids, worker)
    # The last task may be seen completed (its script ran) before its worker met the fault, logged
    # it and handed it back: wait for those, then judge what was logged.
    handed = len(ids) if fault == "complete-before" else 0

    def all_logged() -> bool:
        log = cluster.log_text(worker)
        return (_faults_met(cluster, fault) == len(ids)
                and log.count("celery-ha internal error while running task") >= len(ids)
                and len(re.findall(r"task \w+ handed back \(celery-ha internal error", log)) >= handed)

    wait_for(all_logged, timeout=20, interval=0.2, message="each fault met, logged and handled")
    keys = [key for key, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    pages = [key for key in keys if "#" not in key]
    assert sorted(pages) == sorted(urls), "every page's item exactly once"
    log = cluster.log_text(worker)
    assert log.count("celery-ha internal error while running task") == len(ids), log[-4000:]
    tracebacks = [line for line in log.splitlines()
                  if line.startswith(("tests.support.fault_injection.InjectedFault", "InjectedFault"))]
    assert len(tracebacks) == len(ids), log[-4000:]  # one traceback per fault, no more
    handed_back = len(re.findall(r"task \w+ handed back \(celery-ha internal error", log))
    assert handed_back == (len(ids) if fault == "complete-before" else 0), log[-4000:]

    dead = cluster.q.get(own_bug)
    assert (dead.attempts, dead.stalls) == (1, 0) and "the task's own bug" in (dead.error or "")


def test_a_fault_of_the_script_push_hands_the_task_back_without_an_attempt(make_cluster, site):
    cluster = _faulty_cluster(make_cluster, "script-push", CELERY_HA_WINDOW="4")
    worker = cluster.worker("w1", concurrency=2)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(8)])
    cluster.pump()
    try:
        wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, worker)}") from None
    assert _faults_met(cluster, "script-push") > 3  # three faults, then the push planned as usual
    infos = cluster.q.get_many(ids)
    assert [(i.attempts, i.stalls) for i in infos] == [(0, 0)] * len(ids)
    log = cluster.log_text(worker)
    assert len(re.findall(r"task \w+ handed back \(celery-ha internal error \(InjectedFault: script-push",
                          log)) == 3, log[-4000:]
    assert log.count("celery-ha internal error while running task") == 3, log[-4000:]


def test_a_fault_of_celery_ha_on_every_run_ends_in_dead_not_in_a_loop(make_cluster, site):
    """A bug of celery-ha's own that fails every run of a task: each run is handed back without an
    attempt, every fifth hand-back counts a stall, so past its max_stalls the task is dead with the
    reason (the operator redrives it after the fix) instead of running for ever."""
    cluster = _faulty_cluster(make_cluster, "complete-always", CELERY_HA_WINDOW="2")
    worker = cluster.worker("w1", concurrency=2)
    tid = cluster.q.enqueue(site.case_url(1), max_stalls=1)
    cluster.pump()
    try:
        wait_for(lambda: cluster.state(tid) == "dead", timeout=90, interval=0.2, message="the task dead")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, [tid], worker)}") from None
    dead = cluster.q.get(tid)
    assert (dead.attempts, dead.stalls) == (0, 2)
    assert "stalled 2 times" in dead.error and "celery-ha internal error" in dead.error
    assert _faults_met(cluster, "complete-always") == 10  # two stalls of five hand-backs each, no more


def test_the_lease_keeper_outlives_its_own_errors(make_cluster, site):
    """Every other tick, heartbeat and renewal of each keeper raises; tasks longer than the TTL still
    keep their leases: none expires while its task runs, nothing is reclaimed, no stall."""
    cluster = _faulty_cluster(make_cluster, "keeper-tick,keeper-heartbeat,keeper-renew",
                              CELERY_HA_LEASE_TTL="5", CELERY_HA_HEARTBEAT_INTERVAL="0.5",
                              CELERY_HA_WINDOW="4")
    site.delays["/case/"] = 8.0
    worker = cluster.worker("w1", concurrency=2)
    beat = cluster.beat()  # its sweeps would reclaim an expired lease
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(4)])
    cluster.pump()
    running = QueueKeys(cluster.namespace).running
    expired: list[tuple[str, float]] = []

    def done() -> bool:
        now = redis_now_ms(cluster.r)
        leases = cluster.r.zrange(running, 0, -1, withscores=True)
        expired.extend((tid, (now - at) / 1000) for tid, at in leases if at < now)
        return cluster.all_completed(ids)

    try:
        wait_for(done, timeout=60, interval=0.2, message="every page")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cluster, ids, worker)}") from None
    assert not expired, f"leases expired while their tasks ran: {expired[:5]}\n" \
                        f"{_diagnosis(cluster, ids, worker)}"
    infos = cluster.q.get_many(ids)
    assert [(i.attempts, i.stalls) for i in infos] == [(0, 0)] * len(ids), _diagnosis(cluster, ids, worker)
    stats = cluster.q.stats()
    assert stats["reclaimed"] == 0, stats
    for fault in ("keeper-tick", "keeper-heartbeat", "keeper-renew"):
        assert _faults_met(cluster, fault) >= 4, fault  # the faults did happen, many times
    log = cluster.log_text(worker)
    assert "lease keeper: unexpected error in a tick" in log
    assert "lease lost" not in log, log[-4000:]
    cluster.kill_group(beat)


def test_a_pool_process_that_exits_stops_its_keeper_before_leaving_the_registry(make_cluster, site):
    """``slow-exit``: the pool processes live on 2 s after celery-ha's ``worker_process_shutdown``
    (four heartbeat intervals): a keeper still running would register them again meanwhile. (The
    worker's main process clears its node's entries once all have exited, so this is watched while
    they exit.)"""
    cluster = _faulty_cluster(make_cluster, "slow-exit", CELERY_HA_HEARTBEAT_INTERVAL="0.5")
    worker = cluster.worker("w1", concurrency=2)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(4)])
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page")
    node = worker.node  # type: ignore[attr-defined]
    exiting = f"celery-ha-test:faults:{cluster.namespace}:slow-exit:at"
    worker.send_signal(signal.SIGTERM)  # warm shutdown: the pool processes exit through the hook
    wait_for(lambda: cluster.r.llen(exiting) == 2, timeout=30, interval=0.05,
             message="both pool processes past celery-ha's shutdown hook")
    seen: list[str] = []

    def exited() -> bool:
        seen.extend(w["name"] for w in list_workers(cluster.r, cluster.namespace, max_age=60)
                    if w["node"] == node)
        return worker.poll() is not None

    wait_for(exited, timeout=30, interval=0.1, message="the worker to exit")
    assert _faults_met(cluster, "slow-exit") == 2
    assert not seen, f"pool processes registered again after they left: {sorted(set(seen))}\n" \
                     f"{cluster.log_text(worker)[-3000:]}"


def test_a_shutdown_while_a_lease_is_being_taken_hands_it_back_without_a_stall(make_cluster, site):
    """``slow-claim``: the pool process holds its new lease 1.5 s before the task's context exists.
    A SIGTERM to the whole process group there (a terminal's Ctrl-C, systemd's stop) used to take
    the pool's exit path: a dead holder, released by fast failover with a stall counted. Now the
    request is noted and honoured before the task's code starts: handed back, nothing counted."""
    cluster = _faulty_cluster(make_cluster, "slow-claim", CELERY_HA_SOFT_SHUTDOWN_TIMEOUT="1")
    w1 = cluster.worker("w1", concurrency=1)
    tid = cluster.q.enqueue(site.case_url(1))
    cluster.pump()
    held = f"celery-ha-test:faults:{cluster.namespace}:slow-claim:held"
    wait_for(lambda: cluster.r.lrange(held, 0, -1) == [tid], timeout=30, interval=0.05,
             message="the lease taken, held outside the task's context")
    os.killpg(w1.pid, signal.SIGTERM)
    wait_for(lambda: w1.poll() is not None, timeout=30, interval=0.1, message="w1 to exit")
    info = cluster.q.get(tid)
    assert (info.state, info.attempts, info.stalls) in {("queued", 0, 0), ("dispatched", 0, 0)}, \
        _diagnosis(cluster, [tid], w1)
    assert "worker shutting down" in cluster.log_text(w1), cluster.log_text(w1)[-3000:]
    cluster.worker("w2", concurrency=1)
    cluster.pump()
    wait_for(lambda: cluster.all_completed([tid]), timeout=60, interval=0.2, message="the page on w2")
    info = cluster.q.get(tid)
    assert (info.attempts, info.stalls) == (0, 0)
    assert [key for key, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)] == [site.case_url(1)]
