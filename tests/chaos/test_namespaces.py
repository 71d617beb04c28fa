"""Two namespaces on one broker database: each worker runs only its own namespace's tasks."""

from __future__ import annotations

import uuid

import pytest

from celery_ha.state.sink import count_items
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow


def test_two_namespaces_sharing_a_broker_db_never_take_each_others_messages(make_cluster, site):
    """A message taken by the other namespace's worker would be dropped there (the task is unknown in
    its namespace) and sent again only after ``CELERY_HA_REDISPATCH_AFTER`` (60 s here): every task
    must complete well before that, and no worker may drop a single message."""
    a = make_cluster(CELERY_HA_REDISPATCH_AFTER="60", CELERY_HA_WINDOW="6")
    b = make_cluster(broker_of=a, CELERY_HA_REDISPATCH_AFTER="60", CELERY_HA_WINDOW="6")
    assert a.broker_url == b.broker_url and a.crawl_queue != b.crawl_queue
    worker_a = a.worker("wa", concurrency=2)
    worker_b = b.worker("wb", concurrency=2)
    ids_a = a.q.enqueue_many([site.case_url(n) for n in range(0, 24)])
    ids_b = b.q.enqueue_many([site.case_url(n) for n in range(24, 48)])
    a.pump()
    b.pump()

    def done(cluster, ids):
        return all(info is not None and info.state == "completed" for info in cluster.q.get_many(ids))

    wait_for(lambda: done(a, ids_a) and done(b, ids_b), timeout=40, message="both namespaces drained")
    assert count_items(a.r, a.namespace) == 24 and count_items(b.r, b.namespace) == 24
    assert a.q.stats()["redispatched"] == 0 and b.q.stats()["redispatched"] == 0
    for cluster, proc in ((a, worker_a), (b, worker_b)):
        assert "dropped" not in cluster.log_text(proc), cluster.log_text(proc)[-2000:]


def test_one_worker_and_one_beat_serve_two_namespaces_and_lose_nothing_when_a_child_dies(make_cluster, site):
    """CELERY_HA_NAMESPACES: one worker consumes both namespaces' queues, runs each task in its own
    namespace (its items land in that namespace's sink), fills both windows at start, and releases a
    task of either namespace at once when the pool child running it is SIGKILLed; one beat sweeps
    both (an abandoned lease in the second namespace is reclaimed there and the task runs again)."""
    a = make_cluster(CELERY_HA_WINDOW="4", CELERY_HA_REDISPATCH_AFTER="60")
    b = make_cluster(broker_of=a, CELERY_HA_WINDOW="4", CELERY_HA_REDISPATCH_AFTER="60")
    both = {"CELERY_HA_NAMESPACES": f"{a.namespace},{b.namespace}"}
    ids_a = a.q.enqueue_many([site.case_url(n) for n in range(0, 12)])
    ids_b = b.q.enqueue_many([site.case_url(n) for n in range(12, 24)])
    # A task that SIGKILLs its own pool child on its first attempt, in each namespace.
    killer_a = a.q.enqueue(site.case_url(30), task="test_die_once")
    killer_b = b.q.enqueue(site.case_url(31), task="test_die_once")
    # A lease in the second namespace whose holder never renews it: only b's sweep frees it.
    orphan = b.q.enqueue(site.case_url(32), priority=9)
    assert b.q.claim(orphan, "gone@elsewhere:1") is not None
    worker = a.worker("both", concurrency=2, **both)
    wait_for(lambda: len(b.children(worker.node)) >= 2, timeout=30, message="the worker registered in b too")
    beat = a._spawn(["beat", "-s", str(a.tmp / "beat-both-schedule"), "-l", "info"], "beat-both", both)

    def done(cluster, ids):
        return all(info is not None and info.state == "completed" for info in cluster.q.get_many(ids))

    wait_for(lambda: done(a, [*ids_a, killer_a]) and done(b, [*ids_b, killer_b, orphan]), timeout=60,
             message="both namespaces drained by one worker")
    assert count_items(a.r, a.namespace) == 13 and count_items(b.r, b.namespace) == 14
    for cluster, killer in ((a, killer_a), (b, killer_b)):
        info = cluster.q.get(killer)
        assert info.stalls == 1 and info.attempts == 0, info  # released by fast failover, no attempt counted
    assert b.q.get(orphan).stalls == 1  # reclaimed when its lease expired

    def swept_by_beat(cluster) -> bool:
        return (cluster.r.hget(cluster.q.keys.meta, "last_sweep_by") or "").startswith("beat:")

    wait_for(lambda: swept_by_beat(a) and swept_by_beat(b), timeout=20, message="beat swept both namespaces")
    log = a.log_text(worker)
    assert "dropped" not in log and "not served" not in log, log[-3000:]
    assert beat.poll() is None


def test_a_namespace_with_a_large_backlog_does_not_starve_a_small_one_on_a_shared_worker(make_cluster, site):
    """Each namespace has its own window, and the worker's consumer rotates over the queues: the ten
    tasks of the small crawl finish while most of the large crawl's backlog still waits."""
    big = make_cluster(CELERY_HA_WINDOW="4")
    small = make_cluster(broker_of=big, CELERY_HA_WINDOW="4")
    big_ids = big.q.enqueue_many([site.case_url(n) for n in range(190)])
    small_ids = small.q.enqueue_many([site.case_url(n) for n in range(190, 200)])
    big.worker("shared", concurrency=2, CELERY_HA_NAMESPACES=f"{big.namespace},{small.namespace}")

    def small_done() -> bool:
        return all(info is not None and info.state == "completed" for info in small.q.get_many(small_ids))

    wait_for(small_done, timeout=60, message="the small crawl finished")
    big_done = sum(info.state == "completed" for info in big.q.get_many(big_ids))
    assert big_done <= 95, f"{big_done} of 190 tasks of the large crawl ran before the small crawl's 10"
    wait_for(lambda: big.q.stats()["completed"] == 190, timeout=120, message="the large crawl finished")


def test_a_worker_and_a_beat_of_a_pattern_serve_a_namespace_that_appears_while_they_run(make_cluster, site):
    """CELERY_HA_NAMESPACES=<prefix>-*: the worker serves its own namespace from the start and, within
    CELERY_HA_DISCOVERY_INTERVAL of a new crawl's first enqueue, consumes that crawl's queues, fills its
    window (no pump from outside), registers its children there; beat's fan-out sweeps it (an abandoned
    lease there is reclaimed and its task runs again). A namespace the pattern does not match is left
    alone."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    common = {"CELERY_HA_WINDOW": "4", "CELERY_HA_REDISPATCH_AFTER": "60"}
    a = make_cluster(namespace=f"{prefix}-a", **common)
    b = make_cluster(broker_of=a, namespace=f"{prefix}-b", **common)
    other = make_cluster(broker_of=a, namespace=f"q{prefix}-c", **common)
    pattern = {"CELERY_HA_NAMESPACES": f"{prefix}-*", "CELERY_HA_DISCOVERY_INTERVAL": "0.5"}
    ids_a = a.q.enqueue_many([site.case_url(n) for n in range(0, 10)])
    other.q.enqueue_many([site.case_url(n) for n in range(40, 43)])
    other.pump()
    worker = a.worker("pattern", concurrency=2, **pattern)
    schedule = str(a.tmp / "beat-pattern-schedule")
    beat = a._spawn(["beat", "-s", schedule, "-l", "info"], "beat-pattern", pattern)
    wait_for(lambda: a.all_completed(ids_a), timeout=40, message="the worker's own namespace drained")

    ids_b = b.q.enqueue_many([site.case_url(n) for n in range(10, 22)])  # the new crawl's first enqueue
    orphan = b.q.enqueue(site.case_url(32), priority=9)
    assert b.q.claim(orphan, "gone@elsewhere:1") is not None  # only b's sweep frees it
    wait_for(lambda: b.all_completed([*ids_b, orphan]), timeout=60, message="the new namespace drained")
    assert count_items(a.r, a.namespace) == 10 and count_items(b.r, b.namespace) == 13
    assert b.q.get(orphan).stalls == 1  # reclaimed when its lease expired
    wait_for(lambda: (b.r.hget(b.q.keys.meta, "last_sweep_by") or "").startswith("beat:"), timeout=20,
             message="beat's fan-out swept the new namespace")
    assert len(b.children(worker.node)) >= 2  # the pool children registered there too
    waiting = sum(other.broker.llen(k) for k in other.broker.keys(other.crawl_queue + "*"))  # priority lists
    assert other.q.stats()["completed"] == 0 and waiting == 3 and count_items(other.r, other.namespace) == 0
    log = a.log_text(worker)
    assert f"serving namespace '{prefix}-b'" in log, log[-3000:]
    assert "dropped" not in log and "not served" not in log and f"q{prefix}-c" not in log, log[-3000:]
    assert beat.poll() is None
