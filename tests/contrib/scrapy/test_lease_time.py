"""A request waits in its download slot (``DOWNLOAD_DELAY``) after it borrowed its proxy: the lease's
clock runs meanwhile. Real crawls on one proxy show that the download never outlives its lease: a
request whose lease ran out while it waited borrows again instead of sending through a proxy someone
else now holds, and one with some lease left gets a timeout that ends inside it."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

pytest.importorskip("scrapy")

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.proxy import ProxyLease, ProxyPool
from tests.contrib.scrapy.harness import assert_every_lease_returned, crawl_env, pool_for, run_crawls
from tests.contrib.scrapy.sites import CaseSite
from tests.support.polling import wait_until
from tests.support.proxy_farm import ProxyFarm

NS = "scrapylease"


@pytest.fixture
def case_site() -> Iterator[CaseSite]:
    site = CaseSite().start()
    yield site
    site.stop()


def _slot_settings(lock_ttl: float, delay: float) -> dict:
    return {"DOWNLOAD_DELAY": delay, "RANDOMIZE_DOWNLOAD_DELAY": False,
            "CELERY_HA_SCRAPY_POOL": {"lock_ttl": lock_ttl}, "CELERY_HA_SCRAPY_WORKER": "crawler"}


class OtherMachine(threading.Thread):
    """Another process on the same pool: once the crawl holds the lease of its second page, it
    borrows the proxy as soon as the pool lets it (the crawl's lease expired) and keeps it through a
    slow page, with a lease long enough for that page."""

    def __init__(self, pool: ProxyPool, site: CaseSite) -> None:
        super().__init__(daemon=True)
        self.pool, self.site = pool, site
        self.errors: list[BaseException] = []

    def _try_acquire(self) -> ProxyLease | None:
        try:
            return self.pool.acquire(self.site.domain, worker="other-machine", ttl=10)
        except NoProxyAvailable:
            return None

    def run(self) -> None:
        try:
            # The first page is done and its lease returned; the second page's lease is held.
            wait_until(lambda: self.site.hits("/p/0") and self.pool.stats().get("out_ok", 0) >= 1
                       and self.pool.stats()["in_use"] == 1, timeout=30, interval=0.02,
                       what="the crawl to borrow for its second page")
            lease = wait_until(self._try_acquire, timeout=20, interval=0.02, what="the proxy to free up")
            answer = requests.get(self.site.url("/slow/9?s=2.5"), proxies=lease.proxies, timeout=10)
            self.pool.release(lease, outcome="ok", status=answer.status_code)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


@pytest.mark.timeout(120)
def test_a_lease_that_ran_out_in_the_download_slot_is_given_back_and_borrowed_again(
    redis_url: str, tmp_path: Path, case_site: CaseSite, make_farm
) -> None:
    farm: ProxyFarm = make_farm(1, 210)
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    other = OtherMachine(pool, case_site)
    other.start()
    urls = [case_site.url("/p/0"), case_site.url("/p/1")]
    # A 2 s lease, a 4 s delay between the requests of the proxy's slot: the second page's lease runs
    # out while it waits for its turn, and the other machine takes the proxy meanwhile.
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "100/1"),
                          [{"urls": urls, "settings": _slot_settings(2, 4)}])
    other.join(15)
    assert not other.errors, other.errors
    assert crawl.returncode == 0, crawl.log[-3000:]

    # The site never saw two requests at once from the proxy's IP: the crawl's second page went out
    # only after the other machine's slow page, through a lease of its own.
    (slow,) = case_site.hits("/slow/9")
    (second,) = case_site.hits("/p/1")
    assert case_site.max_in_flight == {farm.proxies[0].exit_ip: 1}, case_site.visits
    assert second.at >= slow.ended
    assert sorted(p["url"] for p in crawl.output["pages"]) == urls

    # The run-out lease went back unused (the other machine's acquire had reaped it and locked the
    # proxy: stale), then the page borrowed again; every lease, the other machine's too, is back.
    assert crawl.stat("celery_ha/proxy/expired_in_slot") == 1
    assert crawl.stat("celery_ha/proxy/released/unused") == 1
    assert crawl.stat("celery_ha/proxy/release_reply/stale") == 1
    assert crawl.stat("celery_ha/proxy/acquired") == 3 and crawl.stat("celery_ha/proxy/released/ok") == 2
    stats = pool.stats()
    assert stats["in_use"] == 0 and stats["out_ok"] == 3 and stats["reaped"] == 1, stats
    assert "DOWNLOAD_DELAY=4s is not well below the proxy lease (lock_ttl=2s)" in crawl.log


@pytest.mark.timeout(120)
def test_the_download_timeout_is_what_is_left_of_the_lease_when_the_download_starts(
    redis_url: str, tmp_path: Path, case_site: CaseSite, make_farm
) -> None:
    farm: ProxyFarm = make_farm(1, 215)
    pool = pool_for(redis_url, NS)
    pool.add_many(farm.urls)
    urls = [case_site.url("/p/0"), case_site.url("/slow/1?s=3.5")]
    # A 4 s lease; the slow page borrows right after the first page and waits 2.5 s for its turn in
    # the slot, so its download starts with about 1.5-2 s of lease left (enough to go, not for 3.5 s).
    settings = {**_slot_settings(4, 2.5), "CELERY_HA_SCRAPY_MAX_ROTATIONS": 0}
    (crawl,) = run_crawls(tmp_path, crawl_env(redis_url, NS, "100/1"), [{"urls": urls, "settings": settings}])
    assert crawl.returncode == 0, crawl.log[-3000:]
    assert len(case_site.hits("/slow/1")) == 1

    # Scrapy gave up on the slow page within what was left of its lease (not 90 % of all of it,
    # 3.6 s, which would have ended after the lock): the lease came back in time, judged.
    failures = crawl.output["failures"]
    assert [f["error"] for f in failures] == ["DownloadTimeoutError"], (failures, crawl.output["pages"])
    taken = re.search(r"took longer than ([0-9.]+) seconds", failures[0]["message"])
    assert taken is not None and 0.9 <= float(taken.group(1)) < 3.0, failures
    assert crawl.stat("celery_ha/proxy/release_reply/late") == 0
    assert crawl.stat("celery_ha/proxy/release_reply/stale") == 0
    assert crawl.stat("celery_ha/proxy/expired_in_slot") == 0
    stats = assert_every_lease_returned(pool, [crawl])
    assert stats["out_transport"] == 1 and stats["out_ok"] == 1, stats
