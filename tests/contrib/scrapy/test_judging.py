"""How a download is judged, in real crawls: a body over ``DOWNLOAD_MAXSIZE`` is nobody's fault (not
the proxy's), and a captcha page the site compressed is still a block."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("scrapy")

from tests.contrib.scrapy.harness import (
    assert_every_lease_returned,
    assert_no_secrets,
    crawl_env,
    pool_for,
    run_crawls,
)
from tests.contrib.scrapy.sites import CaseSite
from tests.support.proxy_farm import ProxyFarm

NS = "scrapyjudge"
CODINGS = ("gzip", "deflate", "br", "zstd")


@pytest.fixture
def case_site() -> Iterator[CaseSite]:
    site = CaseSite().start()
    yield site
    site.stop()


@pytest.fixture
def plain_site() -> Iterator[CaseSite]:
    """A second domain, for pages that must not wait behind the first one's bans."""
    site = CaseSite().start()
    yield site
    site.stop()


@pytest.mark.timeout(120)
def test_a_body_over_download_maxsize_is_aborted_not_charged_to_the_proxy(
    redis_url: str, tmp_path: Path, case_site: CaseSite, make_farm
) -> None:
    farm: ProxyFarm = make_farm(4, 180)
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    big = [f"/big/{n}" for n in range(3)]
    urls = [case_site.url(f"{path}?bytes=200000") for path in big] + [case_site.url("/p/1")]
    settings = {"DOWNLOAD_MAXSIZE": 100_000, "CELERY_HA_SCRAPY_MAX_ROTATIONS": 3}
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "100/1"), [{"urls": urls, "settings": settings}])
    assert crawl.returncode == 0, crawl.log[-3000:]

    # The site served each oversized page once: Scrapy cancelled it, nobody sent it through another
    # proxy (every proxy would have fetched the same body).
    for path in big:
        assert len(case_site.hits(path)) == 1, (path, case_site.hits(path))
    assert sorted((f["url"], f["error"], f["tried"]) for f in crawl.output["failures"]) == [
        (url, "DownloadCancelledError", []) for url in sorted(urls[:3])
    ]
    assert [p["url"] for p in crawl.output["pages"]] == [case_site.url("/p/1")]
    assert crawl.stat("celery_ha/proxy/released/aborted") == 3
    assert crawl.stat("celery_ha/proxy/released/transport") == 0
    assert crawl.stat("celery_ha/proxy/rotations") == 0 and crawl.stat("celery_ha/retry/gave_up") == 0

    # The pool judged no proxy: none banned, no transport error recorded against any.
    stats = assert_every_lease_returned(pool, [crawl])
    assert stats["out_aborted"] == 3 and stats.get("out_transport", 0) == 0, stats
    assert stats["temp_banned"] == 0 and stats["available"] == 4, stats
    assert all(info.transport_errors == 0 and info.state == "avail" for info in pool.list())


@pytest.mark.timeout(150)
def test_a_compressed_captcha_page_is_blocked_banned_and_rotated(
    redis_url: str, tmp_path: Path, case_site: CaseSite, plain_site: CaseSite, make_farm
) -> None:
    # Each captcha page goes through three proxies (1 + 2 rotations), each then banned for the
    # domain: twelve proxies, so no page waits for a ban to end.
    farm: ProxyFarm = make_farm(12, 190)
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    captchas = [f"/captcha/{coding}/{n}" for n, coding in enumerate(CODINGS)]
    plain = [f"/page/{coding}/{n}" for n, coding in enumerate(CODINGS)]
    urls = [case_site.url(p) for p in captchas] + [plain_site.url(p) for p in plain]
    settings = {"CELERY_HA_SCRAPY_MAX_ROTATIONS": 2}
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "100/1"), [{"urls": urls, "settings": settings}])
    assert crawl.returncode == 0, crawl.log[-3000:]
    ips = {p.exit_ip for p in farm.proxies}

    # Every captcha page was answered compressed, judged blocked and fetched again through another
    # IP until the rotations ran out; one give-up line each.
    for path in captchas:
        coding = path.split("/")[2]
        hits = case_site.hits(path)
        assert [h.coding for h in hits] == [coding] * 3, (path, hits)
        assert len({h.ip for h in hits}) == 3 and {h.ip for h in hits} <= ips
        assert (f"celery-ha: gave up on <GET {case_site.url(path)}>: last blocked (HTTP 200) via "
                in crawl.log)
    assert crawl.stat("celery_ha/proxy/released/blocked") == 12
    assert crawl.stat("celery_ha/proxy/rotations") == 8 and crawl.stat("celery_ha/retry/gave_up") == 4
    # Ordinary pages compressed the same way are answers: once each, ok, decoded for the spider.
    for path in plain:
        assert [h.coding for h in plain_site.hits(path)] == [path.split("/")[2]]
    pages = {p["url"]: p for p in crawl.output["pages"]}
    assert all(pages[plain_site.url(p)]["rotations"] == 0 for p in plain)
    assert crawl.stat("celery_ha/proxy/released/ok") == 4

    # The pool: each proxy that served a captcha is banned for that domain, and only for it.
    stats = assert_every_lease_returned(pool, [crawl])
    assert stats["out_blocked"] == 12 and stats["out_ok"] == 4, stats
    banned = set(pool.client.zrange(pool.prefix + f"dban:{case_site.domain}", 0, -1))
    blocked = {info.id for info in pool.list() if info.blocked}
    assert len(banned) == 12 and banned == blocked
    assert pool.client.zcard(pool.prefix + f"dban:{plain_site.domain}") == 0
    assert stats["available"] == 12  # a domain ban, not a ban from the pool
    assert_no_secrets(crawl.log, str(crawl.output))
