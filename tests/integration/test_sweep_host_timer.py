"""The maintenance sweep arms its process's host timer (``integration/upkeep/maintenance.py``): a host the
sweep's own pump had to pass over is pumped when it may hand out its task, not at the next sweep.

The case: a task's holder stops past its lease mid-request under a concurrency limit of 1; the sweep
reclaims it, and its host's slot stays held until the request can no longer be in flight
(``_hosts.lua`` host_hold). Nothing else happens afterwards (no completion, no other pump in any
process): only the sweeping process's timer can dispatch the task when the hold ends. Real
redis-server, a real Celery app on a real broker database; the sweep runs in this process as a
watchdog's or a beat message's would in a pool process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_ha.base.settings import Settings
from celery_ha.integration.core.services import Services
from celery_ha.integration.dispatch import pump
from celery_ha.integration.upkeep.maintenance import sweep
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from tests.support.celery_fixtures import make_cluster  # noqa: F401  (the fixture)
from tests.support.polling import wait_until

HOST = "a.example"
HOLD = 2.0  # seconds the stopped holder's request may be in flight


@pytest.fixture
def gated(make_cluster: Any) -> Iterator[tuple[Any, Services]]:  # noqa: F811
    namespace = f"sw{uuid.uuid4().hex[:8]}"
    cluster = make_cluster(namespace=namespace)
    settings = Settings(redis_url=cluster.state_url, namespace=namespace, lease_ttl=5, heartbeat_interval=1,
                        window=10, hosts=True, redispatch_after=600)
    client = redis_client(cluster.state_url)
    rt = Services(settings=settings, redis_url=cluster.state_url, client=client,
                  queue=TaskQueue(client, namespace, lease_ttl=5, host_gate=True))
    yield cluster, rt
    timer = pump.host_timer(namespace).timer
    if timer is not None:
        timer.cancel()


def test_a_host_held_after_a_reclaim_is_pumped_when_the_hold_ends(gated: tuple[Any, Services]) -> None:
    cluster, rt = gated
    q = rt.queue
    q.hosts.set(HOST, concurrency=1)
    first, second = q.enqueue_many([f"http://{HOST}/p/1", f"http://{HOST}/p/2"])
    lease = q.claim(first, "w:1", ttl=0.3)
    assert lease is not None
    assert q.hosts.request(HOST, lease, in_flight=HOLD) == 0.0  # then its holder stops (SIGSTOP, say)
    wait_until(lambda: redis_now_ms(q.client) > lease.expires_at * 1000 + 10, timeout=10,
               what="the lease to expire")

    result = sweep(cluster.app, rt, source="watchdog")
    assert result is not None and result["reclaimed"] == 1
    held = int(q.client.hget(q.keys.host_state(HOST), f"x:{first}:{lease.token}"))
    assert held > redis_now_ms(q.client)  # the slot is held: the sweep's pump dispatched nothing
    assert result["sent"] == 0 and q.get(first).state == "queued" and q.get(second).state == "queued"

    # No other sweep, completion or pump follows: the sweeping process's timer serves the host.
    wait_until(lambda: q.get(first).state == "dispatched", timeout=HOLD + 10, interval=0.05,
               what="the held host's task dispatched once its hold ended")
    assert redis_now_ms(q.client) >= held
    # Its message follows (published right after the dispatch), in kombu's lists of the namespace's queue.
    broker = cluster.broker
    wait_until(lambda: sum(broker.llen(k) for k in broker.keys(cluster.crawl_queue + "*")) == 1, timeout=10,
               what="its message in the broker")
