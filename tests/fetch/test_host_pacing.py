"""The fetcher and the host gate (``fetch(..., gate=...)``): a site's 429/503 and the proxy pool's
politeness refusals hold the host back for the whole fleet and raise HostNotReady at once (no sleep in
the task); robots.txt's Crawl-delay is stored with the host. Real sites and proxies on loopback, a real
Redis; what the site saw is read from its own request log."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.fetch.errors import HostNotReady
from celery_ha.fetch.fetcher import Fetcher
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.state import TaskQueue
from tests.support.proxy_farm import ProxyFarm, TestSite, started


@pytest.fixture
def farm() -> Iterator[ProxyFarm]:
    yield from started(ProxyFarm(3, first=70))


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, host_gate=True)


def fetcher(pool: ProxyPool | None = None, **kw: object) -> Fetcher:
    slept: list[float] = []
    kw.setdefault("obey_robots", False)
    f = Fetcher(pool, backoff_base=0.001, sleep=slept.append, **kw)  # type: ignore[arg-type]
    f.slept = slept  # type: ignore[attr-defined]
    return f


def test_a_429_with_retry_after_blocks_the_host_until_then_and_hands_back_at_once(q: TaskQueue) -> None:
    for site in started(TestSite("a", limit=(1, 60))):
        f = fetcher()
        assert f.fetch(site.url("/ok"), gate=q.hosts).status_code == 200
        before = time.time()
        with pytest.raises(HostNotReady) as info:
            f.fetch(site.url("/ok"), gate=q.hosts)
        assert len(site.hits_for("/ok")) == 2 and f.slept == []  # no retry, no sleep in the task
        host = q.hosts.get(site.domain)
        assert host.blocked_until is not None and before + 0.5 < host.blocked_until < before + 2.5
        assert "429" in (host.block_reason or "") and info.value.host == site.domain


def test_a_429_without_retry_after_blocks_with_a_doubling_backoff(q: TaskQueue) -> None:
    for site in started(TestSite("a")):
        f = fetcher()
        spans = []
        for _ in range(2):
            with pytest.raises(HostNotReady):
                f.fetch(site.url("/status/429"), gate=q.hosts)
            spans.append(q.hosts.get(site.domain).blocked_until - time.time())
        assert q.hosts.get(site.domain).backoff_level == 2
        assert 50 < spans[0] < 70 and 100 < spans[1] < 140  # 60 s, then 120 s (jitter 10 %)


def test_without_a_gate_a_429_still_rotates_as_before(q: TaskQueue) -> None:
    for site in started(TestSite("a")):
        with pytest.raises(Exception) as info:
            fetcher().fetch(site.url("/status/429"))
        assert not isinstance(info.value, HostNotReady)
        assert len(site.hits_for("/status/429")) == 3  # direct_tries
        assert q.hosts.get(site.domain).blocked_until is None


def test_a_spent_proxy_budget_defers_the_host_instead_of_sleeping(
        q: TaskQueue, redis_url: str, farm: ProxyFarm) -> None:
    pool = ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default",
                     PoolConfig(rate=(1000, 1.0)))
    pool.add_many(farm.urls)
    for site in started(TestSite("a")):
        pool.set_domain_budget(site.domain, "1/20")
        f = fetcher(pool)
        assert f.fetch(site.url("/ok"), gate=q.hosts).status_code == 200
        with pytest.raises(HostNotReady) as info:
            f.fetch(site.url("/ok"), gate=q.hosts)
        assert f.slept == [] and len(site.hits_for("/ok")) == 1
        assert 0 < info.value.retry_after <= 21
        host = q.hosts.get(site.domain)
        assert host.next_eligible is not None and host.next_eligible > time.time() + 5


def test_the_budget_hint_counts_an_in_flight_request_as_sent_now(redis_url: str, farm: ProxyFarm) -> None:
    """The retry hint of a spent budget is about one window, not one window after the in-flight
    leases would expire (they are re-stamped when their response comes back)."""
    pool = ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default",
                     PoolConfig(rate=(1000, 1.0), lock_ttl=30.0))
    pool.add_many(farm.urls)
    pool.set_domain_budget("hint.example", "1/2")
    pool.acquire("hint.example", worker="w")  # in flight, reserved at its expiry (30 s on)
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("hint.example", worker="w")
    assert info.value.retry_after <= 3.0


@pytest.mark.parametrize(("declared", "kept"), [(2, 2.0), (100, 30.0)])
def test_crawl_delay_is_stored_with_the_host_capped(q: TaskQueue, declared: int, kept: float) -> None:
    for site in started(TestSite("a", robots=f"User-agent: *\nCrawl-delay: {declared}\n")):
        f = fetcher(obey_robots=True)
        f.fetch(site.url("/ok"), gate=q.hosts, crawl_delay_cap=30.0)
        assert q.hosts.get(site.domain).crawl_delay == kept
        assert len(site.hits_for("/robots.txt")) == 1


def test_the_spacing_counts_from_the_answer_so_a_slow_request_never_shortens_the_gap(
        q: TaskQueue, r: redis.Redis) -> None:
    """The site saw the request somewhere between the fetcher's two stamps: the host's last stamp is
    the answer's time (on the Redis clock), not the request's start."""
    for site in started(TestSite("a")):
        before = time.time()
        assert fetcher().fetch(site.url("/ok?delay=300"), gate=q.hosts).status_code == 200
        stamp = int(r.hget(q.keys.host_state(site.domain), "ls")) / 1000.0
        arrived = site.hits_for("/ok")[0].at
        assert stamp >= arrived + 0.25 and stamp >= before + 0.3
