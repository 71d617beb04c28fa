"""Exactly one release per acquire when another middleware drops, replaces or answers the request:
a real crawl with ``tests/contrib/scrapy/meddlers.py`` numbered above the pool's middleware."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from celery_ha.demo.site import DemoSite
from tests.contrib.scrapy.crawl import SNIPPET
from tests.contrib.scrapy.harness import (
    assert_every_lease_returned,
    crawl_env,
    pool_for,
    run_crawls,
)
from tests.support.proxy_farm import ProxyFarm

NS = "scrapymeddle"


@pytest.fixture
def farm(make_farm) -> ProxyFarm:
    return make_farm(3, 160)


@pytest.mark.timeout(120)
def test_dropped_replaced_and_answered_requests_return_their_lease(
    redis_url: str, tmp_path: Path, site: DemoSite, farm: ProxyFarm
) -> None:
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    modes = ["replace", "same", "ignore", "fake", "redo", "refused", "refused-retry"]
    urls = [f"{site.case_url(n)}?m={m}" for n, m in enumerate(modes, start=1)]
    urls += [site.case_url(20), site.case_url(21)]
    middlewares = {**SNIPPET["DOWNLOADER_MIDDLEWARES"], "tests.contrib.scrapy.meddlers.Meddler": 960}
    settings = {"DOWNLOADER_MIDDLEWARES": middlewares, "RETRY_TIMES": 0}
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "100/1"),
                          [{"urls": urls, "settings": settings, "skip": [site.case_url(21)]}])
    assert crawl.returncode == 0, crawl.log[-3000:]
    by_url = {p["url"]: p for p in crawl.output["pages"]}

    # What the spider got: replacements fetched through the pool, answers made up by the meddler.
    assert by_url[site.case_url(1)]["proxy"]  # "replace": the replacement went through a proxy
    assert site.case_url(2) + "?m=same" not in by_url  # dropped by the dupefilter
    assert [f["error"] for f in crawl.output["failures"]] == ["IgnoreRequest"]
    assert by_url[site.case_url(4) + "?m=fake"]["status"] == 200 and not site.hits(prefix="/case/4")
    assert site.case_url(5) in by_url and len(site.hits(prefix="/case/5")) == 2  # "redo": downloaded twice
    assert site.case_url(6) + "?m=refused" in by_url and not site.hits(prefix="/case/6")
    assert by_url[site.case_url(7)]["proxy"] and len(site.hits(prefix="/case/7")) == 1
    # A skipped request went direct: no proxy, no lease, no Proxy-Authorization.
    skipped = by_url[site.case_url(21)]
    assert skipped["proxy"] is None and not skipped["auth_header"]
    assert [h.client_ip for h in site.hits("/case/21")] == ["127.0.0.1"]

    # Each lease returned once, with the outcome of what really happened to it.
    assert crawl.stat("celery_ha/proxy/released/unused") == 4  # replace, same, ignore, fake
    assert crawl.stat("celery_ha/proxy/released/transport") == 2  # refused, refused-retry
    assert crawl.stat("celery_ha/proxy/swept") == 5  # all but "ignore", which our process_exception saw
    stats = assert_every_lease_returned(pool, [crawl])
    assert stats["out_unused"] == 4 and stats["out_transport"] == 2
    # The start-up check named the middleware that runs after the pool's.
    assert "tests.contrib.scrapy.meddlers.Meddler run(s) after the celery-ha proxy middleware" in crawl.log
