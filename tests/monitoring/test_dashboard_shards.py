"""The dashboard document covers every shard of a sharded namespace (CELERY_HA_SHARDS)."""

from __future__ import annotations

import redis

from celery_ha.monitoring.dashboard import Reader, dashboard
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue


def test_dead_letters_and_throughput_count_every_shard(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = TaskQueue(client, "dsh", shards=3)
    ids = q.enqueue_many([f"https://example.com/{n}" for n in range(30)])
    for n, tid in enumerate(ids):
        lease = q.claim(tid, "w:1")
        assert lease is not None
        if n % 3 == 0:
            q.fail(lease, f"gone {n}", retry=False)
        else:
            q.complete(lease)
    assert len({q._of(t) for t in ids}) == 3  # the tasks do span the three shards
    doc = dashboard(Reader(client, q, ProxyPool(client, "dsh"), worker_max_age=30))
    assert {d["id"] for d in doc["dead"]} == {t for n, t in enumerate(ids) if n % 3 == 0}
    series = doc["throughput"]["series"]
    assert sum(b["completed"] for b in series) == 20 and sum(b["dead"] for b in series) == 10
    assert doc["stats"]["completed"] == 20 and doc["stats"]["dead"] == 10
