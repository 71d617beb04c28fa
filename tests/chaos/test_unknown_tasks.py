"""A task name no worker knows, at a higher priority than valid work: it never loops, never starves."""

from __future__ import annotations

import pytest

from celery_ha.state.worker_registry import known_task_names
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("batch", ["", "*=4"])
def test_unknown_task_names_end_dead_and_valid_tasks_behind_them_run(make_cluster, site, batch):
    """4 tasks of a misspelt name at priority 10 fill a window of 4 in front of 5 valid tasks. Each
    receipt counts a failed attempt (freeing the slot), so the valid tasks run well before the 60 s
    redispatch timeout, and the misspelt ones end dead after max_attempts, naming the known tasks.
    With batches one message carries the four misspelt ids: each of them counts, not only the first."""
    cluster = make_cluster(CELERY_HA_WINDOW="4", CELERY_HA_REDISPATCH_AFTER="60", CELERY_HA_BATCH=batch)
    cluster.worker("w1", concurrency=2)
    known = wait_for(lambda: known_task_names(cluster.r, cluster.namespace, max_age=30),
                     message="the worker to register its task names")
    assert {"fetch_page", "crawl_list"} <= known and "fetch_pgae" not in known
    # enqueue refuses a name no live worker runs; allow_unknown_task queues it as a rolling upgrade would
    bad = cluster.q.enqueue_many([{"url": site.case_url(n), "task": "fetch_pgae", "priority": 10,
                                   "max_attempts": 2} for n in range(4)], allow_unknown_task=True)
    good = cluster.q.enqueue_many([site.case_url(n) for n in range(10, 15)])
    cluster.pump()

    def states(ids):
        return [info.state for info in cluster.q.get_many(ids)]

    wait_for(lambda: set(states(good)) == {"completed"}, timeout=40, message="the valid tasks")
    wait_for(lambda: set(states(bad)) == {"dead"}, timeout=40, message="the misspelt tasks to end dead")
    for info in cluster.q.get_many(bad):
        assert info.attempts == 2 and "fetch_pgae" in info.error and "fetch_page" in info.error
