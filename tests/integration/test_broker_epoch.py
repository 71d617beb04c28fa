"""The broker marker: a broker that lost its data is noticed once; one that kept it never is."""

from __future__ import annotations

from types import SimpleNamespace

import redis

from celery_ha.base.settings import Settings
from celery_ha.integration.core.services import Services
from celery_ha.integration.upkeep.broker_epoch import broker_lost_messages, marker_key
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue


def _services(url: str) -> Services:
    client = redis_client(url)
    return Services(settings=Settings(redis_url=url, namespace="epoch"), redis_url=url, client=client,
                    queue=TaskQueue(client, "epoch"))


def test_marker_tells_a_lost_broker_from_a_kept_one(redis_url: str) -> None:
    broker_url = redis_url.rsplit("/", 1)[0] + "/7"
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    app = SimpleNamespace(conf=SimpleNamespace(broker_url=broker_url))
    rt = _services(redis_url)
    assert broker_lost_messages(app, rt) is False  # first sight: nothing remembered, marker planted
    assert broker.exists(marker_key("epoch"))
    assert broker_lost_messages(app, rt) is False  # the broker kept its data
    broker.flushdb()  # what a restart without persistence looks like
    assert broker_lost_messages(app, rt) is True
    assert broker_lost_messages(app, rt) is False  # said once: the new marker is remembered


def test_non_redis_broker_and_unreachable_broker_are_not_checked(redis_url: str) -> None:
    rt = _services(redis_url)
    rabbit = SimpleNamespace(conf=SimpleNamespace(broker_url="amqp://g:g@h//"))
    assert broker_lost_messages(rabbit, rt) is False
    gone = SimpleNamespace(conf=SimpleNamespace(broker_url="redis://127.0.0.1:1/0"))
    assert broker_lost_messages(gone, rt) is False
