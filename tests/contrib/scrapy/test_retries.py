"""Retries that switch proxy first, in a real crawl: rotations vs page retries, backoff and Retry-After,
giving up with one clear line, and waiting for a free proxy without blocking the reactor."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from celery_ha.demo.site import DemoSite
from tests.contrib.scrapy.harness import (
    assert_every_lease_returned,
    assert_no_secrets,
    crawl_env,
    pool_for,
    run_crawls,
)
from tests.support.proxy_farm import ProxyFarm

NS = "scrapyretry"


@pytest.fixture
def farm(make_farm) -> ProxyFarm:
    return make_farm(4, 140)


@pytest.mark.timeout(120)
def test_rotations_retries_backoff_and_give_up(
    redis_url: str, tmp_path: Path, site: DemoSite, farm: ProxyFarm
) -> None:
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    site.fail("/case/1", "429", times=1)  # blocked, Retry-After: 1 -> a rotation, not before 1 s
    site.fail("/case/2", "503", times=1)  # the site's trouble -> a page retry
    site.fail("/case/3", "captcha", times=1)  # blocked -> a rotation
    site.fail("/case/4", "captcha")  # always: rotations run out
    site.fail("/case/5", "404")  # gone: never retried
    site.fail("/case/6", "503")  # always: page retries run out
    urls = [site.case_url(n) for n in range(1, 15)]
    settings = {
        "CELERY_HA_SCRAPY_MAX_ROTATIONS": 2,
        "RETRY_TIMES": 1,
        "CELERY_HA_SCRAPY_POOL": {"block_ban_base": 0.5, "block_ban_cap": 1.0},
    }
    # One request per proxy per second: most pages wait for a free proxy.
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "1/1"), [{"urls": urls, "settings": settings}])
    assert crawl.returncode == 0, crawl.log[-3000:]
    pages = {p["url"]: p for p in crawl.output["pages"]}
    ips = {p.exit_ip for p in farm.proxies}

    def hits(n: int) -> list:
        return site.hits(f"/case/{n}")

    # 429 + Retry-After: 1 -> the retry went out through another IP, at least a second later.
    first, second = hits(1)
    assert second.client_ip != first.client_ip and second.time - first.time >= 1.0
    assert pages[site.case_url(1)]["rotations"] == 1 and pages[site.case_url(1)]["retry_times"] == 0
    # 503 -> a page retry on another IP; captcha -> a rotation on another IP.
    assert [h.status for h in hits(2)] == [503, 200] and hits(2)[0].client_ip != hits(2)[1].client_ip
    assert pages[site.case_url(2)]["retry_times"] == 1 and pages[site.case_url(2)]["rotations"] == 0
    assert len({h.client_ip for h in hits(3)}) == 2 and pages[site.case_url(3)]["rotations"] == 1
    # Always a captcha: 1 + 2 rotations, three different IPs, then one line and the page as it came.
    assert len(hits(4)) == 3 and len({h.client_ip for h in hits(4)}) == 3
    assert (f"celery-ha: gave up on <GET {site.case_url(4)}>: last blocked (HTTP 200) via "
            in crawl.log) and "proxy rotations 2/2, page retries 0/1" in crawl.log
    # 404: once, not retried, handed to the spider's errback by Scrapy's HttpError middleware.
    assert len(hits(5)) == 1
    # Always 503: 1 + RETRY_TIMES tries, then the give-up line counting page retries.
    assert len(hits(6)) == 2
    assert f"celery-ha: gave up on <GET {site.case_url(6)}>: last server (HTTP 503)" in crawl.log
    assert "proxy rotations 0/2, page retries 1/1" in crawl.log
    assert sorted(f["url"] for f in crawl.output["failures"]) == [site.case_url(5), site.case_url(6)]

    # Pages that only waited for a proxy burned neither a retry nor a rotation.
    for n in range(7, 15):
        page = pages[site.case_url(n)]
        assert page["rotations"] == 0 and page["retry_times"] == 0 and len(hits(n)) == 1
    assert {h.client_ip for h in site.requests} <= ips
    assert crawl.stat("celery_ha/proxy/waits") >= 5
    assert crawl.stat("celery_ha/proxy/rotations") == 1 + 1 + 2  # /case/1, /case/3, /case/4 twice
    assert crawl.stat("celery_ha/retry/count") == 1 + 1  # /case/2, /case/6
    assert crawl.stat("celery_ha/retry/gave_up") == 2
    # Waiting was an await: the reactor kept ticking every 20 ms through seconds of waiting.
    assert crawl.output["max_gap"] < 0.75, crawl.output["max_gap"]
    assert crawl.stats["celery_ha/proxy/wait_seconds"] > 2.0

    assert_no_secrets(crawl.log, str(crawl.output))
    assert_every_lease_returned(pool, [crawl])
