"""A worker process that serves several namespaces (CELERY_HA_NAMESPACES) keeps one host timer, and one
cached window, per namespace: arming one namespace's timer never replaces another's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_ha.base.settings import Settings
from celery_ha.integration.core.services import Services
from celery_ha.integration.dispatch import pump
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from tests.integration.test_sender import Recorder
from tests.support.polling import wait_until


def _services(redis_url: str, namespace: str) -> Services:
    settings = Settings(redis_url=redis_url, namespace=namespace, lease_ttl=5, heartbeat_interval=1,
                        window=10, hosts=True)
    client = redis_client(redis_url)
    return Services(settings=settings, redis_url=redis_url, client=client,
                    queue=TaskQueue(client, namespace, lease_ttl=5, host_gate=True))


@pytest.fixture
def two(redis_url: str) -> Iterator[tuple[Services, Services]]:
    pair = (_services(redis_url, "tna"), _services(redis_url, "tnb"))
    yield pair
    for rt in pair:
        timer = pump.host_timer(rt.queue.namespace).timer
        if timer is not None:
            timer.cancel()


def test_each_namespace_has_its_own_host_timer(two: tuple[Services, Services]) -> None:
    a, b = two
    (task_a,) = a.queue.enqueue_many(["https://a.example/1"])
    (task_b,) = b.queue.enqueue_many(["https://b.example/1"])
    a.queue.hosts.block("a.example", 0.3)
    b.queue.hosts.block("b.example", 0.6)
    app = Recorder()
    pump.arm_host_timer(app, b)  # b.example may start in 0.6 s
    pump.arm_host_timer(app, a)  # a.example in 0.3 s: an earlier time, in another namespace
    assert pump.host_timer("tna").timer is not None and pump.host_timer("tnb").timer is not None
    # Each timer pumps its own namespace when its host's block ends: nothing else pumps here.
    wait_until(lambda: a.queue.get(task_a).state == "dispatched", timeout=5, what="a's timer")
    wait_until(lambda: b.queue.get(task_b).state == "dispatched", timeout=5, what="b's timer")
