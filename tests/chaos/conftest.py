"""The chaos runs' fixtures: real Celery clusters (``make_cluster``), the demo site (``site``) and a
broker Redis of its own that a test may SIGKILL and restart on the same port (``broker_redis``)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.celery_fixtures import make_cluster, site

__all__ = ["make_cluster", "site"]


@pytest.fixture
def broker_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "broker").start()
    yield server
    server.stop()
