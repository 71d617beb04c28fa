"""Two namespaces on one broker database: each worker runs only its own namespace's tasks."""

from __future__ import annotations

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
