"""A crawl with RabbitMQ as the Celery broker: nothing in the pump, the window, fast failover or the
sweep needs a Redis broker.

The state is on the session's plain Redis; the broker is the RabbitMQ at 127.0.0.1:5672 (guest/guest),
or ``CELERY_HA_TEST_AMQP_URL``. Without an answering RabbitMQ the test skips with the reason. Each run
uses a fresh namespace, so fresh queues, which are deleted at the end.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import kombu
import pytest

from celery_ha.base.masking import mask_url
from celery_ha.integration.core.queues import MAINTENANCE, broker_queue
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_fixtures import make_cluster, site  # noqa: F401  (fixtures)
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow

AMQP_URL = os.environ.get("CELERY_HA_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture(scope="module")
def amqp_url() -> str:
    try:
        with kombu.Connection(AMQP_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # refused, unreachable, bad credentials: all mean "not here"
        pytest.skip(f"no RabbitMQ answering at {mask_url(AMQP_URL)}: {type(exc).__name__}: {exc}")
    return AMQP_URL


@pytest.fixture
def rabbit_cluster(make_cluster, amqp_url: str) -> Iterator:  # noqa: F811
    cluster = make_cluster(broker_url=amqp_url, CELERY_HA_LEASE_TTL="5", CELERY_HA_HEARTBEAT_INTERVAL="1")
    yield cluster
    cluster.stop_all()
    with kombu.Connection(amqp_url, connect_timeout=2) as conn:
        for queue in (cluster.crawl_queue, broker_queue(cluster.namespace, MAINTENANCE)):
            conn.default_channel.queue_delete(queue)


def test_a_crawl_on_rabbitmq_survives_a_killed_child_exactly_once(rabbit_cluster, site) -> None:  # noqa: F811
    cluster = rabbit_cluster
    site.total, site.page_size = 60, 5  # 12 list pages, 60 detail pages
    # Pages take long enough that the holder read below is still running the task when it is killed.
    site.delays["/case/"] = 0.3
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    tid = cluster.q.enqueue(site.list_url(), task="crawl_list", priority=5)
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 5, timeout=60, message="five pages done")
    holder = wait_for(lambda: next((t.worker for t in _running(cluster)), None), timeout=20,
                      message="a running task")
    os.kill(int(holder.rsplit(":", 1)[1]), signal.SIGKILL)
    wait_for(lambda: cluster.q.stats()["completed"] == 61, timeout=90, message="every page")

    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert len(keys) == len(set(keys)) == count_items(cluster.r, cluster.namespace) == 120
    stats = cluster.q.stats()
    assert cluster.q.get(tid).state == "completed"
    assert stats["dead"] == 0 and stats["queued"] == stats["running"] == stats["dispatched"] == 0
    assert stats["released"] + stats["reclaimed"] >= 1  # the killed child's task went back
    with kombu.Connection(cluster.broker_url, connect_timeout=2) as conn:  # every message consumed
        assert conn.default_channel.queue_declare(cluster.crawl_queue, passive=True).message_count == 0


def _running(cluster):
    ids = cluster.r.zrange(cluster.q.keys.running, 0, -1)
    return [t for t in cluster.q.get_many(ids) if t is not None and t.worker]
