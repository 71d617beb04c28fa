"""The fetcher and the host gate (``fetch(..., gate=...)``): a site's 429/503 and the proxy pool's
politeness refusals hold the host back for the whole fleet and raise HostNotReady at once (no sleep in
the task); robots.txt's Crawl-delay is stored with the host. Real sites and proxies on loopback, a real
Redis; what the site saw is read from its own request log."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
import redis

from celery_ha.base.errors import LeaseLost, NoProxyAvailable
from celery_ha.fetch.errors import HostNotReady
from celery_ha.fetch.fetcher import Fetcher, FetchError
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.state import TaskQueue
from tests.support.polling import wait_until
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
            q.hosts.block(site.domain, 0)  # the block is over (its backoff level stays)
        assert len(site.hits_for("/status/429")) == 2
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
    """...and counts at once: the page waits the Crawl-delay after the robots.txt request (a short
    one in the task, this fetcher's sleep never ends it here; a long one hands the task back)."""
    for site in started(TestSite("a", robots=f"User-agent: *\nCrawl-delay: {declared}\n")):
        f = fetcher(obey_robots=True)
        with pytest.raises(HostNotReady):
            f.fetch(site.url("/ok"), gate=q.hosts, crawl_delay_cap=30.0)
        assert q.hosts.get(site.domain).crawl_delay == kept
        assert [h.path for h in site.hits_for()] == ["/robots.txt"]
        assert all(kept - 0.5 < wait <= kept for wait in f.slept) and (f.slept == []) == (kept > 10)


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


def _gaps(site: TestSite) -> list[float]:
    times = sorted(h.at for h in site.hits_for())
    return [b - a for a, b in itertools.pairwise(times)]


def test_a_request_waits_for_the_spacing_from_another_workers_request(q: TaskQueue) -> None:
    """Two workers' tasks of one host, each claimed on time, reach their requests at about the same
    moment (one spent its head start on a slow robots.txt, say): the second request waits for the
    host's spacing at the site, however the hand-outs were timed."""
    for site in started(TestSite("a")):
        q.hosts.set(site.domain, delay=0.6)
        first, second = Fetcher(None, obey_robots=False), Fetcher(None, obey_robots=False)
        assert first.fetch(site.url("/ok"), gate=q.hosts).status_code == 200
        assert second.fetch(site.url("/ok"), gate=q.hosts).status_code == 200
        assert len(_gaps(site)) == 1 and _gaps(site)[0] >= 0.6 - 0.01  # the site's own log


def test_every_request_of_a_task_keeps_the_spacing_its_retries_and_its_robots_txt_too(
        q: TaskQueue) -> None:
    """A 5xx tried again inside the task, robots.txt before the page, a task's second page: each is a
    request the site sees, each spaced by the host's delay."""
    robots = "User-agent: *\nAllow: /\n"
    for site in started(TestSite("a", robots=robots)):
        q.hosts.set(site.domain, delay=0.4)
        f = Fetcher(None, backoff_base=0.001, direct_tries=2)  # obeys robots.txt
        with pytest.raises(FetchError):
            f.fetch(site.url("/status/500"), gate=q.hosts)  # robots.txt, then the page twice
        assert f.fetch(site.url("/ok"), gate=q.hosts).status_code == 200  # its next page
        assert [h.path for h in site.hits_for()] == ["/robots.txt", "/status/500", "/status/500", "/ok"]
        assert min(_gaps(site)) >= 0.4 - 0.01, _gaps(site)


def test_a_request_to_a_host_blocked_since_the_claim_is_not_sent(q: TaskQueue) -> None:
    """Another worker's 429 blocked the host after this task's claim: its request is not sent, the
    task goes back to the gate (HostNotReady) with no sleep in the task."""
    for site in started(TestSite("a")):
        q.hosts.block_until_retry(site.domain, 30, "HTTP 429 with Retry-After")
        f = fetcher()
        with pytest.raises(HostNotReady) as info:
            f.fetch(site.url("/ok"), gate=q.hosts)
        assert site.hits_for() == [] and f.slept == [] and 25 < info.value.retry_after <= 30


def test_a_429_on_robots_txt_blocks_the_host_for_the_fleet(q: TaskQueue) -> None:
    for site in started(TestSite("a", robots="User-agent: *\nAllow: /\n")):
        site.robots_status, site.retry_after = 429, "5"
        before = time.time()
        with pytest.raises(HostNotReady):
            fetcher(obey_robots=True).fetch(site.url("/ok"), gate=q.hosts)
        assert [h.path for h in site.hits_for()] == ["/robots.txt"]
        blocked = q.hosts.get(site.domain).blocked_until
        assert blocked is not None and before + 4 < blocked < before + 6.5
        with pytest.raises(HostNotReady):  # another worker's fetch: nothing sent while blocked
            fetcher(obey_robots=True).fetch(site.url("/ok"), gate=q.hosts)
        assert len(site.hits_for()) == 1


def test_a_zombie_whose_task_ran_again_elsewhere_sends_nothing(q: TaskQueue) -> None:
    """A worker stopped past its lease wakes while its task runs again under a newer lease: its
    request's ask is fenced by its lease (``ctx.fetch`` hands the fetcher ``hosts.for_lease``), so
    the site never sees the stale run; the live holder's request goes."""
    for site in started(TestSite("a")):
        tid = q.enqueue(site.url("/ok"))
        stale = q.claim_next("w:zombie", ttl=0.2)
        assert stale is not None and stale.task_id == tid
        wait_until(lambda: q.reclaim_expired() or q.stats()["running"] == 0, timeout=5,
                   what="the sweep to take the expired lease back")
        fresh = q.claim_next("w:live")
        assert fresh is not None and fresh.task_id == tid and fresh.token != stale.token
        with pytest.raises(LeaseLost):
            fetcher().fetch(site.url("/ok"), gate=q.hosts.for_lease(stale))
        assert site.hits_for() == []
        assert fetcher().fetch(site.url("/ok"), gate=q.hosts.for_lease(fresh)).status_code == 200
        assert len(site.hits_for()) == 1

