"""Redis clients built from URLs: the one way any layer gets a connection.

``redis://``, ``rediss://`` (TLS) and ``unix://`` go to redis-py as they are (AUTH and ACL users
through the URL); ``sentinel://`` builds a client that follows the master Sentinel names
(``celery_ha.redisio.sentinel``); ``redis+cluster://`` and ``rediss+cluster://`` build redis-py's
``RedisCluster`` (``celery_ha.redisio.cluster``). The state layer takes all of them; a Celery broker
cannot be a cluster (kombu's Redis transport has no cluster support).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings, check_redis_url
from celery_ha.redisio.cluster import cluster_client, is_cluster_client, is_cluster_url
from celery_ha.redisio.sentinel import is_sentinel_url, sentinel_client

SCHEMES = ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis celery-ha can talk to (a broker URL may name RabbitMQ)."""
    return urlsplit(url.strip()).scheme.lower() in SCHEMES


def redis_client(url: str, *, sentinel_master: str | None = None, sentinel_password: str | None = None,
                 **kwargs: Any) -> redis.Redis:
    """A decoded Redis client for ``url``; a malformed URL becomes a one-line ConfigurationError.

    For a ``sentinel://`` URL the master's name and the sentinels' password default to
    ``CELERY_HA_SENTINEL_MASTER`` and ``CELERY_HA_SENTINEL_PASSWORD``. A cluster URL gives a
    ``redis.cluster.RedisCluster`` (same commands; scripts route on their first key).
    """
    options: dict[str, Any] = {"decode_responses": True, "health_check_interval": 30}
    options.update(kwargs)
    if is_sentinel_url(url):
        master = sentinel_master or Settings.one("sentinel_master")
        password = sentinel_password or Settings.one("sentinel_password") or None
        return sentinel_client(url, master, password, **options)
    if is_cluster_url(url):
        return cluster_client(url, **options)  # type: ignore[return-value]
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"unsupported Redis URL {mask_url(url)!r}: use redis://, rediss://, "
                                 "unix://, sentinel://, redis+cluster:// or rediss+cluster://")
    check_redis_url(url)  # a database that is no number: redis-py would use database 0
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigurationError(f"bad Redis URL {mask_url(url)!r}: {exc}") from None


def client_address(client: Any) -> str:
    """Where ``client`` talks to, without credentials: ``host:port/db``, or ``cluster host:port,…``."""
    if is_cluster_client(client):
        return "cluster " + ",".join(node.name for node in client.get_primaries())
    kw = client.connection_pool.connection_kwargs
    return f"{kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}/{kw.get('db', 0)}"
