"""Fixtures of the Scrapy crawls: the demo site and proxy farms on 127.0.0.x with passwords."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from celery_ha.demo import DemoSite
from tests.contrib.scrapy.harness import PASSWORD, USER
from tests.support.proxy_farm import ProxyFarm


@pytest.fixture
def site() -> Iterator[DemoSite]:
    with DemoSite(total=100) as s:
        yield s


@pytest.fixture
def make_farm() -> Iterator[Callable[[int, int], ProxyFarm]]:
    """``make_farm(n, first)``: n password-protected proxies on 127.0.0.<first>…, stopped at the end."""
    farms: list[ProxyFarm] = []

    def make(n: int, first: int) -> ProxyFarm:
        farm = ProxyFarm(n, first=first, auth=(USER, PASSWORD)).start()
        farms.append(farm)
        return farm

    yield make
    for farm in farms:
        farm.stop()
