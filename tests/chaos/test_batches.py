"""CELERY_HA_BATCH: several task ids per Celery message, and none of them stranded when the pool
process running the batch dies or is stopped (the redispatch timeout is far beyond every deadline
here: only the batch handling itself can pass these tests)."""

from __future__ import annotations

import os
import signal

import pytest

from celery_ha.state.sink import count_items
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow

BATCH = {"CELERY_HA_BATCH": "fetch_page=6", "CELERY_HA_REDISPATCH_AFTER": "300"}


def test_a_batch_runs_every_id_once(make_cluster, site) -> None:
    cluster = make_cluster(**BATCH)
    worker = cluster.worker("w1", concurrency=2)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(30)])
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every page")
    assert count_items(cluster.r, cluster.namespace) == 30
    assert len(site.hits(prefix="/case/")) == 30  # each page fetched once
    assert "batch of 6:" in cluster.log_text(worker)  # one Celery message carried six ids


def test_a_killed_child_strands_nothing_of_its_batch(make_cluster, site) -> None:
    cluster = make_cluster(**BATCH, CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/case/"] = 0.3
    cluster.worker("w1", concurrency=2)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(24)])
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 2, timeout=30, message="two pages")
    running = [i for i in cluster.q.get_many(ids) if i is not None and i.state == "running"]
    assert running
    victim = running[0]
    os.kill(int(victim.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every page after the kill")
    infos = cluster.q.get_many(ids)
    assert [i.id for i in infos if i.stalls] == [victim.id]  # only the one it was running
    assert not [i.id for i in infos if i.attempts]
    assert count_items(cluster.r, cluster.namespace) == 24


def test_a_graceful_stop_hands_the_rest_of_the_batch_on(make_cluster, site) -> None:
    cluster = make_cluster(**BATCH, CELERY_HA_SOFT_SHUTDOWN_TIMEOUT="1", CELERY_HA_WINDOW="6")
    site.delays["/case/"] = 1.0  # six pages: six seconds of work in one message
    w1 = cluster.worker("w1", concurrency=1)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(6)])
    cluster.pump()  # one message of six ids, taken by w1's only pool process
    wait_for(lambda: cluster.q.stats()["completed"] >= 1, timeout=30, message="the first page")
    # Warm shutdown at once (five pages still ahead of w1): w1 stops after its grace period. w2 starts
    # after the signal, since a worker's start can take longer than the rest of the batch.
    os.killpg(w1.pid, signal.SIGTERM)
    cluster.worker("w2", concurrency=1)
    wait_for(lambda: cluster.all_completed(ids), timeout=40, message="every page, w2 doing the rest")
    infos = cluster.q.get_many(ids)
    assert not [(i.id, i.attempts, i.stalls) for i in infos if i.attempts or i.stalls]
    assert count_items(cluster.r, cluster.namespace) == 6
    assert "batch stopped before" in cluster.log_text(w1)


def test_a_batch_message_has_the_time_limits_of_all_its_ids(make_cluster, site) -> None:
    """Six pages of 1 s in one message, a time limit of 2 s a task: each page is well inside its
    limit, so none may be charged an attempt or a stall for the batch's total length."""
    cluster = make_cluster(**BATCH, CELERY_HA_TASK_TIME_LIMIT="2", CELERY_HA_WINDOW="6")
    site.delays["/case/"] = 1.0
    cluster.worker("w1", concurrency=1)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(6)])
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every page")
    assert [(i.attempts, i.stalls) for i in cluster.q.get_many(ids)] == [(0, 0)] * 6
    assert len(site.hits(prefix="/case/")) == 6  # each page fetched once
