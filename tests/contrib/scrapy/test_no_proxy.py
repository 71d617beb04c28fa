"""When the pool cannot serve: an empty pool (direct only when asked to), a pool that stays busy past
the wait budget, a Redis that does not answer — each ends in a clear line, never in a hung crawl."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from celery_ha.demo.site import DemoSite
from celery_ha.runtime.redis_process import free_port
from tests.contrib.scrapy.harness import crawl_env, pool_for, run_crawls

NS = "scrapyempty"


@pytest.fixture
def site() -> Iterator[DemoSite]:
    with DemoSite(total=20) as s:
        yield s


@pytest.mark.timeout(120)
def test_empty_pool_busy_pool_and_unreachable_redis(redis_url: str, tmp_path: Path, site: DemoSite) -> None:
    urls = [site.case_url(n) for n in range(3)]
    short = {"CELERY_HA_SCRAPY_MAX_WAIT": 1.5}
    direct, waited, unreachable = run_crawls(tmp_path, crawl_env(redis_url, NS, "1/60"), [
        {"urls": urls, "settings": {"CELERY_HA_DIRECT_WHEN_EMPTY": True}},
        {"urls": urls, "settings": short},
        {"urls": urls, "settings": short,
         "env": {"CELERY_HA_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}},
    ])
    # Empty pool + CELERY_HA_DIRECT_WHEN_EMPTY: fetched directly, no lease taken.
    assert len(direct.output["pages"]) == 3 and direct.stat("celery_ha/proxy/direct") == 3
    assert all(p["proxy"] is None and not p["auth_header"] for p in direct.output["pages"])
    assert direct.stat("celery_ha/proxy/acquired") == 0
    # Empty pool without it: waited (without burning a retry), then gave up with one line per page.
    assert waited.output["pages"] == [] and waited.stat("celery_ha/proxy/gave_up_waiting") == 3
    assert [f["error"] for f in waited.output["failures"]] == ["IgnoreRequest"] * 3
    domain = site.url.split("//")[1]
    assert f"celery-ha: gave up on <GET {urls[0]}>: no proxy for {domain} within 1.5s (empty)" in waited.log
    assert waited.stat("celery_ha/retry/count") == 0 and waited.stat("celery_ha/proxy/rotations") == 0
    # Redis down: a warning, waiting like a busy pool, then the same give-up line.
    assert unreachable.log.count("celery-ha: proxy pool unreachable") == 1  # once, not per request
    assert unreachable.stat("celery_ha/proxy/gave_up_waiting") == 3
    assert "(pool unreachable)" in unreachable.log
    for c in (direct, waited, unreachable):
        assert c.returncode == 0
        assert c.output["max_gap"] < 0.75
    assert pool_for(redis_url, NS).stats()["in_use"] == 0
