"""Fixtures of the Celery integration runs (imported by ``tests/chaos/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_ha.demo import DemoSite
from tests.support.celery_helpers import Cluster


@pytest.fixture
def site() -> Iterator[DemoSite]:
    """The simulated legal-documents site on a free loopback port (200 cases, 10 per page)."""
    s = DemoSite(total=200, page_size=10).start()
    yield s
    s.stop()


@pytest.fixture
def make_cluster(redis_server: Any, tmp_path: Path) -> Iterator[Any]:
    """Factory of clusters; every process any of them started is killed (by group) in teardown."""
    made: list[Cluster] = []

    def make(broker_of: Cluster | None = None, **env: Any) -> Cluster:
        cluster = Cluster(redis_server.url, tmp_path, broker_of=broker_of, **env)  # env may name URLs
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()
