"""A crawl with real Celery workers whose state lives on a 3-master Redis Cluster, sharded over 3 tags.

The broker is a database of the plain session Redis (Celery's Redis transport has no cluster support);
every task, lease, checkpoint and item is on the cluster (``CELERY_HA_REDIS_URL=redis+cluster://…``,
``CELERY_HA_SHARDS=3``: each master holds a shard). A pool child is SIGKILLed mid-crawl: the crawl
still ends with every item stored exactly once; beat sweeps on the cluster meanwhile.
"""

from __future__ import annotations

import os
import signal

import pytest

from celery_ha.state import TaskQueue
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_helpers import wait_for
from tests.support.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.slow


def test_a_crawl_on_a_cluster_survives_a_killed_child_exactly_once(
        make_cluster, site, cluster_url: str, redis_cluster: RedisClusterGroup) -> None:
    site.total, site.page_size = 100, 5  # 20 list pages, 100 detail pages
    # Pages take long enough that a task read as running is still running when its child is killed.
    site.delays["/case/"] = 0.3
    cluster = make_cluster(state_url=cluster_url, CELERY_HA_LEASE_TTL="5", CELERY_HA_HEARTBEAT_INTERVAL="1",
                           CELERY_HA_SHARDS="3")
    cluster.q = TaskQueue(cluster.r, cluster.namespace, lease_ttl=5, shards=3)
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()  # its sweep (locks, reclaim, pump) runs on the cluster too
    cluster.q.enqueue(site.list_url(), task="crawl_list", priority=5)
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 10, timeout=60, message="ten pages done")
    # The victim is paused (SIGSTOP) first and killed only once it is seen still holding a running task:
    # a child read as running may have finished its page before a kill reached it (nothing would go back).
    victim = None
    while victim is None:
        held = wait_for(lambda: next((t for t in _running(cluster)), None), timeout=30,
                        message="a running task")
        pid = int(held.worker.rsplit(":", 1)[1])
        os.kill(pid, signal.SIGSTOP)
        now = cluster.q.get(held.id)
        if now is not None and now.state == "running" and now.worker == held.worker:
            victim = pid
        else:
            os.kill(pid, signal.SIGCONT)  # it finished first: let it go on, pick again
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: cluster.q.stats()["completed"] == 101, timeout=90, message="every page")

    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    assert len(keys) == len(set(keys)) == count_items(cluster.r, cluster.namespace) == 200
    stats = cluster.q.stats()
    assert stats["dead"] == 0 and stats["queued"] == stats["running"] == 0
    assert stats["reclaimed"] + stats["released"] >= 1  # the killed child's task went back
    per_node = redis_cluster.keys_per_node(f"cha:{{{cluster.namespace}*")
    assert all(n > 0 for n in per_node), per_node  # every master holds a shard of the crawl
    assert not list(cluster.broker.scan_iter(match="cha:*"))  # the broker database holds no state
    wait_for(lambda: cluster.r.hget(cluster.q.keys.meta, "last_sweep"), timeout=20, message="a sweep")


def _running(cluster):
    ids = [tid for k in cluster.q.shard_keys() for tid in cluster.r.zrange(k.running, 0, -1)]
    # A task may finish between the two reads: only records still running, with their holder.
    return [t for t in cluster.q.get_many(ids) if t is not None and t.state == "running" and t.worker]
