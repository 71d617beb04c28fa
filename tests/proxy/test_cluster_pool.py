"""The proxy pool suite again, on a real 3-master Redis Cluster (``redis+cluster://``).

Every test of ``test_pool.py`` runs here unchanged: the fixtures below hand them the cluster's URL and a
cluster client, and its ``make_pool`` helper builds its pool on the cluster, so each script of the pool
(whose per-proxy and per-domain keys are computed inside Lua, in the namespace's slot) is run there.
"""

from __future__ import annotations

import pytest

from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.redisio.client import redis_client
from tests.proxy import test_pool
from tests.proxy.test_pool import *  # noqa: F403  (the tests, collected here again)
from tests.support.redis_cluster import (  # noqa: F401  (the fixtures redis_url and r, on the cluster)
    RedisClusterGroup,
    r_on_the_cluster,
    redis_url_on_the_cluster,
)


@pytest.fixture(autouse=True)
def _pools_on_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_pool(redis_url: str, **kw: object) -> ProxyPool:
        return ProxyPool(redis_client(redis_url), "default", PoolConfig(**kw))  # type: ignore[arg-type]

    monkeypatch.setattr(test_pool, "make_pool", make_pool)
