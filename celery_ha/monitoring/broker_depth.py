"""How many Celery messages wait in the broker per queue, counted over all of kombu's priority lists
(a depth that reads only the plain list is wrong as soon as messages carry priorities).

Only a Redis broker can be read; for another one (RabbitMQ) :func:`broker_reader` returns None and the
metric is left out rather than reported as zero.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import CRAWL, MAINTENANCE, broker_queue
from celery_ha.integration.dispatch.broker import broker_lists
from celery_ha.redisio.client import is_redis_url, redis_client


class BrokerDepth:
    """Reads the lengths of every priority list of the namespace's broker queues, one round trip."""

    def __init__(self, client: redis.Redis, queues: Iterable[str]) -> None:
        self.client = client
        self.queues = list(dict.fromkeys(queues))

    def read(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        lists = {queue: broker_lists(queue) for queue in self.queues}
        for names in lists.values():
            for name in names:
                pipe.llen(name)
        lengths = iter(pipe.execute())
        return {queue: sum(next(lengths) for _ in names) for queue, names in lists.items()}


def broker_queues(namespace: str, logical: Iterable[str] = ()) -> list[str]:
    """The broker queues of ``namespace``: crawl and maintenance, plus any ``@durable_task(queue=)``."""
    return [broker_queue(namespace, name) for name in (CRAWL, MAINTENANCE, *logical)]


def broker_reader(settings: Settings, state_url: str, state_client: redis.Redis, namespace: str,
                  logical: Iterable[str] = ()) -> BrokerDepth | None:
    """A reader for the configured broker (default: the state Redis), or None for a non-Redis one."""
    url = settings.broker_url or state_url
    if not is_redis_url(url):
        return None
    client = state_client if url == state_url else redis_client(
        url, sentinel_master=settings.sentinel_master or None, socket_connect_timeout=5, socket_timeout=10)
    return BrokerDepth(client, broker_queues(namespace, logical))
