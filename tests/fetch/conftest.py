"""Fixtures of the sitemap tests: a local sitemap site and a task queue in the module's namespace
(``NAMESPACE``). A module that defines its own ``site`` or ``q`` (the fetcher's, the pacing tests')
uses its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue
from tests.support.sitemap_site import SitemapSite


@pytest.fixture
def site() -> Iterator[SitemapSite]:
    s = SitemapSite().start()
    yield s
    s.stop()


@pytest.fixture
def q(redis_url: str, request: pytest.FixtureRequest) -> Iterator[TaskQueue]:
    client = redis_client(redis_url)
    yield TaskQueue(client, getattr(request.module, "NAMESPACE", "sm"))
    client.close()
