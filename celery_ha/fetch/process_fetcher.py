"""The fetcher a durable task's HTTP request goes through (``ctx.fetch``), one per process.

Each process keeps one :class:`celery_ha.fetch.fetcher.Fetcher` (rebuilt after a fork). It borrows
from the namespace's proxy pool whenever the pool holds any proxy at all, and fetches directly only
when no proxy was ever configured (or ``CELERY_HA_DIRECT_WHEN_EMPTY=1`` allows it when every proxy is
banned). The reading "the pool has proxies" is trusted for ``POOL_RECHECK_SECONDS``.

Its robots.txt answers are the namespace's, shared in Redis (``state/robots_store.py``): one fetch
per site and ``CELERY_HA_ROBOTS_TTL`` for the whole fleet, not one per pool process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis

from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings
from celery_ha.fetch.fetcher import Fetcher
from celery_ha.proxy import ProxyPool
from celery_ha.state.robots_store import RobotsStore

#: How long a process trusts its "the pool has proxies / has none" reading.
POOL_RECHECK_SECONDS = 10.0


@dataclass
class _Choice:
    lock: threading.Lock = field(default_factory=threading.Lock)
    pool: ProxyPool | None = None
    robots: RobotsStore | None = None
    fetcher: Fetcher | None = None
    checked: float = float("-inf")


_choice: PerProcess[_Choice] = PerProcess(_Choice)


def process_fetcher(client: redis.Redis, settings: Settings, worker: str) -> Fetcher:
    """This process's fetcher: through the pool when it has proxies, else direct."""
    choice = _choice.get()
    now = time.monotonic()
    with choice.lock:
        if choice.fetcher is not None and now - choice.checked < POOL_RECHECK_SECONDS:
            return choice.fetcher
        if choice.pool is None:
            choice.pool = ProxyPool(client, settings.namespace)
        if choice.robots is None:
            choice.robots = RobotsStore(client, settings.namespace)
        use_pool = choice.pool.has_proxies()
        current = choice.fetcher
        if current is None or (current.pool is not None) != use_pool:
            current = Fetcher(choice.pool if use_pool else None, worker=worker,
                              obey_robots=settings.obey_robots, direct_when_empty=settings.direct_when_empty,
                              robots_ttl=settings.robots_ttl, robots_store=choice.robots)
        choice.fetcher, choice.checked = current, now
        return current
