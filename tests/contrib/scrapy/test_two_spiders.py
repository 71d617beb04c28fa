"""Two real Scrapy crawls, two processes, one pool: the site's own log is the judge.

The demo site limits each client IP to ``N`` requests per ``W`` seconds (answering 429 beyond it); the
pool is told the same rate. Five forward proxies with passwords, each leaving from its own 127.0.0.x
address; one of them is dead (accepts connections, never answers).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
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
from tests.support.proxy_farm import ProxyFarm, window_violations

N, W = 2, 1.0
NS = "scrapy2"


@pytest.fixture
def site() -> Iterator[DemoSite]:
    with DemoSite(total=100, rate_limit=(N, W)) as s:
        yield s


@pytest.fixture
def farm(make_farm) -> ProxyFarm:
    farm = make_farm(5, 120)
    farm.proxies[0].alive = False
    return farm


@pytest.mark.timeout(150)
def test_two_spiders_share_one_pool(redis_url: str, tmp_path: Path, site: DemoSite, farm: ProxyFarm) -> None:
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    dead = farm.proxies[0].id
    site.fail("/case/3", "captcha", times=1)
    site.fail("/case/30", "503", times=1)
    settings = {
        "CELERY_HA_SCRAPY_POOL": {"block_ban_base": 1.0, "block_ban_cap": 2.0},
        # The environment names the real namespace: it wins over this settings file.
        "CELERY_HA_NAMESPACE": "not-this-one",
    }
    first = [site.case_url(n) for n in range(24)] + [site.url + "/case/999"]
    second = [site.case_url(n) for n in range(24, 48)]
    env = crawl_env(redis_url, NS, f"{N}/{W:g}")
    crawls = run_crawls(tmp_path, env, [
        {"urls": first, "settings": {**settings, "CELERY_HA_SCRAPY_WORKER": "a"}},
        {"urls": second, "settings": {**settings, "CELERY_HA_SCRAPY_WORKER": "b"}},
    ])
    for c in crawls:
        assert c.returncode == 0, c.log[-3000:]

    # Every page arrived (the 404 as an answer, not retried), each through a live proxy.
    pages = [p for c in crawls for p in c.output["pages"]]
    assert sorted(p["url"] for p in pages) == sorted(first[:-1] + second)
    assert [f["url"] for c in crawls for f in c.output["failures"]] == [site.url + "/case/999"]
    assert len(site.hits("/case/999")) == 1

    # The site's own log: no IP ever went over N requests in W seconds, not once refused.
    log = site.requests
    assert [r for r in log if r.status == 429] == []
    by_ip: dict[str, list[float]] = defaultdict(list)
    for r in log:
        by_ip[r.client_ip].append(r.time)
    assert set(by_ip) <= {p.exit_ip for p in farm.proxies[1:]}
    for ip, times in by_ip.items():
        assert window_violations(times, N, W) == [], ip
    assert len(by_ip) == 4  # the load was spread over every live proxy

    # The dead proxy: banned after its max_fails failures, for both crawls, and never tried twice
    # for a page; the pages it failed went through another proxy.
    info = pool.get(dead)
    assert info is not None and info.state == "tban"
    assert info.borrowed == info.transport_errors == 3
    # A request that ended in a failure (the 404) may have met the dead proxy first: its tries count.
    failures = [f for c in crawls for f in c.output["failures"]]
    dead_tries = [p for p in pages + failures if dead in p["tried"]]
    assert len(dead_tries) == 3
    for p in pages + failures:
        assert len(p["tried"]) == len(set(p["tried"])), p
    for p in pages:
        assert p["proxy"] != dead and len(p["tried"]) == len(set(p["tried"])), p
    assert sum(c.stat("celery_ha/proxy/rotations") for c in crawls) >= 4  # 3 dead + the captcha
    assert sum(c.stat("celery_ha/retry/count") for c in crawls) == 1  # the 503: a page retry
    assert sum(c.stat("celery_ha/proxy/released/transport") for c in crawls) == 3
    assert sum(c.stat("celery_ha/proxy/released/blocked") for c in crawls) == 1
    assert sum(c.stat("celery_ha/proxy/released/permanent") for c in crawls) == 1

    # Credentials: sent as Scrapy sends them (header, bare proxy URL in meta), never logged.
    for p in pages:
        assert p["auth_header"] and p["meta_proxy"].startswith("http://127.0.0.1:")
        assert "@" not in p["meta_proxy"]
    assert_no_secrets(*(c.log for c in crawls), *(str(c.output) for c in crawls))
    for c in crawls:
        assert "celery_ha/proxy/acquired" in c.log  # Scrapy's stats dump carries the pool's counters

    # Exactly once per acquire, and the pool holds no lease after the crawl.
    assert_every_lease_returned(pool, crawls)
    assert {i.last_used_by for i in pool.list()} <= {"a", "b", ""}
