"""The dashboard's hosts panel: the host gate's busiest hosts and zone counts, over every shard."""

from __future__ import annotations

import redis

from celery_ha.monitoring.dashboard import Reader, dashboard
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue


def test_the_document_lists_the_busiest_hosts_and_the_zones(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    plain = TaskQueue(client, "dh")
    assert dashboard(Reader(client, plain, ProxyPool(client, "dh"), 30))["hosts"]["enabled"] is False
    q = TaskQueue(client, "dh", shards=2, host_gate=True)
    q.enqueue_many([f"http://a.example/{n}" for n in range(5)] + [f"http://b.example/{n}" for n in range(2)])
    q.hosts.block("b.example", 60, "429")
    doc = dashboard(Reader(client, q, ProxyPool(client, "dh"), 30))
    assert doc["hosts"]["enabled"] and doc["hosts"]["known"] == 2
    assert [(h["host"], h["queued"], h["state"]) for h in doc["hosts"]["top"]] == [
        ("a.example", 5, "ready"), ("b.example", 2, "blocked")]
    assert doc["host_zones"] == {"eligible": 1, "waiting": 1, "parked": 0}
