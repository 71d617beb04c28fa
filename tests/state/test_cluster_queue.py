"""The queue suite again, on a real 3-master Redis Cluster (``redis+cluster://``).

Every test of ``test_queue.py``, ``test_cancel.py`` and ``test_hosts.py`` runs here unchanged: the fixtures
below hand them the cluster's URL and a cluster client, so each transition, fence, refusal and raw-state
assertion is checked where every script must route on its keys' slot.
"""

from __future__ import annotations

import time

import pytest
from redis.cluster import RedisCluster

from celery_ha.state import TaskQueue
from celery_ha.state.url_rules import check_rules_reading
from tests.state.test_cancel import *  # noqa: F403  (the tests and their fixtures, collected here again)
from tests.state.test_hosts import *  # noqa: F403
from tests.state.test_queue import *  # noqa: F403
from tests.state.test_queue import CountingConnection
from tests.support.redis_cluster import (  # noqa: F401  (the fixtures redis_url and r, on the cluster)
    RedisClusterGroup,
    r_on_the_cluster,
    redis_url_on_the_cluster,
)


@pytest.fixture
def counted(cluster_url: str, redis_cluster: RedisClusterGroup) -> TaskQueue:
    """A cluster queue whose writes are counted (redis-py builds node pools with a connection class
    only on its from_url path)."""
    client = RedisCluster.from_url(f"redis://127.0.0.1:{redis_cluster.nodes[0].port}", decode_responses=True,
                                   connection_class=CountingConnection)
    queue = TaskQueue(client)
    queue._scripts.prepare()  # scripts and the function library loaded beforehand
    # The once-per-queue read of the URL rules (state/url_rules.py), done here: not a batch's trip.
    check_rules_reading(queue.client, queue.namespace, queue.url_rules)
    queue._rules_checked, queue._carries, queue._carries_at = True, [], time.monotonic()
    CountingConnection.writes = 0
    return queue
