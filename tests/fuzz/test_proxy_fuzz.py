"""Fuzz the ProxyPool's public API: typed refusals that write nothing, or success."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from celery_ha.base.errors import InvalidInput
from celery_ha.proxy import ProxyPool
from celery_ha.proxy.config import PoolConfig
from tests.fuzz.hostile import FUZZ, attempt, hostile_text, numbers, snapshot, wrong


class World:
    def __init__(self, url: str) -> None:
        self.raw = redis.Redis.from_url(url)
        self.pool = ProxyPool(redis.Redis.from_url(url, decode_responses=True), "fz", PoolConfig())

    def reset(self) -> None:
        self.raw.flushdb()
        self.pool.add("http://user:pw@10.0.0.1:8001")
        self.pool.add("http://10.0.0.2:8002")
        self.lease = self.pool.acquire("example.com", worker="w1")

    def lease_like(self, kind: str) -> Any:
        real = self.lease
        return {"real": real, "none": None, "str": "lease",
                "stale": dataclasses.replace(real, token="not-the-token"),
                "bad_domain": dataclasses.replace(real, domain="\ud800"),
                "bad_token": dataclasses.replace(real, token=["x"])}[kind]


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    w = World(redis_url)
    yield w
    w.raw.close()


PROXY_URLS = ["http://10.0.0.3:8003", "socks5://u:p@proxy.example:1080", "10.0.0.4:3128",
              "http://u:\ud800@10.0.0.5:1", "http://u:p\x00w@10.0.0.5:1", "http://10.0.0.5:1\n",
              "http://10.0.0.5:99999", "http://10.0.0.5", "ftp://10.0.0.5:21", "http://exa mple:1",
              "http://u:p@10.0.0.5:1/path", "http://" + "a" * 9000 + ":1", "http://%ed%a0%80:p@h.example:1"]
proxy_urls = st.one_of(st.sampled_from(PROXY_URLS), hostile_text, wrong)
domains = st.one_of(st.sampled_from(["example.com", "Example.COM:8080", "https://example.com/x",
                                     "example.com\n:80", "exa\x00mple.com", "example.com:²", "\ud800.com",
                                     "example.com:0", "1.2.3.4"]), hostile_text, wrong)
seconds = st.one_of(st.none(), st.sampled_from([0.5, 60]), numbers)
rates = st.one_of(st.none(), st.sampled_from(["5/60", "0/60", "5/0", "1/0.0001", "9" * 5000 + "/60",
                                              (5, 60), (5, float("nan")), (float("inf"), 1), (True, 1),
                                              ("5", 60), (5, 60, 1), "٥/60"]), hostile_text, wrong,
                  st.tuples(numbers, numbers))


@FUZZ
@given(url=proxy_urls, source=st.one_of(st.just("static"), hostile_text, wrong), ttl=seconds,
       verify=st.booleans(), group=st.one_of(st.none(), hostile_text, wrong),
       session=st.one_of(st.just(""), st.sampled_from(["s1", "s1\n", "x" * 65]), hostile_text, wrong))
def test_add(world: World, url: Any, source: Any, ttl: Any, verify: bool, group: Any, session: Any) -> None:
    world.reset()
    attempt(world.raw, lambda: world.pool.add(url, source=source, ttl=ttl, verify=verify, group=group,
                                              session=session))
    urls = url if not isinstance(url, str) else [url, "bad"]
    attempt(world.raw, lambda: world.pool.add_many(urls, ttl=ttl))


@FUZZ
@given(domain=domains, worker=st.one_of(st.just("w2"), hostile_text, wrong),
       exclude=st.one_of(st.just(()), st.lists(st.one_of(st.just("10.0.0.1:8001"), hostile_text, wrong),
                                               max_size=3), wrong, hostile_text),
       ttl=seconds)
def test_acquire(world: World, domain: Any, worker: Any, exclude: Any, ttl: Any) -> None:
    world.reset()
    stats = world.pool.keys.stats.encode()
    attempt(world.raw, lambda: world.pool.acquire(domain, worker=worker, exclude=exclude, ttl=ttl),
            ignore=(stats,))


@FUZZ
@given(kind=st.sampled_from(["real", "real", "none", "str", "stale", "bad_domain", "bad_token"]),
       ok=st.one_of(st.none(), st.booleans()), latency=st.one_of(st.none(), numbers),
       status=st.one_of(st.none(), st.sampled_from([200, 404, 429, 503]), numbers),
       outcome=st.one_of(st.none(), st.sampled_from(["ok", "blocked", "nope"]), hostile_text, wrong),
       retry_after=st.one_of(st.none(), numbers))
def test_release(world: World, kind: str, ok: Any, latency: Any, status: Any, outcome: Any,
                 retry_after: Any) -> None:
    world.reset()
    lease = world.lease_like(kind)
    attempt(world.raw, lambda: world.pool.release(lease, ok, latency_ms=latency, status=status,
                                                  outcome=outcome, retry_after=retry_after))


@FUZZ
@given(proxy=st.one_of(st.sampled_from(["10.0.0.1:8001", "http://10.0.0.2:8002", "10.0.0.9:1", "a~b"]),
                       proxy_urls),
       seconds=seconds, reason=st.one_of(st.just("manual"), hostile_text, wrong),
       domain=domains, rate=rates)
def test_ban_and_domain_rate(world: World, proxy: Any, seconds: Any, reason: Any, domain: Any,
                             rate: Any) -> None:
    world.reset()
    attempt(world.raw, lambda: world.pool.ban(proxy, seconds, reason))
    attempt(world.raw, lambda: world.pool.set_domain_rate(domain, rate))


def test_known_holes_are_typed() -> None:
    pool = ProxyPool(redis.Redis(port=1), "fz", PoolConfig())  # nothing listens: a write fails loudly
    for case in (lambda: pool.add("http://u:\ud800@10.0.0.1:1"), lambda: pool.acquire("e.com", exclude=5),
                 lambda: pool.acquire("e.com", ttl=5.8e14), lambda: pool.acquire("e.com", ttl=float("nan")),
                 lambda: pool.acquire("e.com", worker="\ud800"), lambda: pool.release(None),
                 lambda: pool.ban("10.0.0.1:1", float("inf")),
                 lambda: pool.set_domain_rate("e.com", "9" * 5000 + "/1")):
        with pytest.raises(InvalidInput):
            case()


@pytest.mark.parametrize("options", [
    {"lock_ttl": 0}, {"lock_ttl": float("inf")}, {"ban_base": float("nan")}, {"ban_cap": "60"},
    {"block_ban_base": -1}, {"window_margin": -0.1}, {"window_margin": float("inf")}, {"max_fails": 0},
    {"max_fails": 2.5}, {"max_temp_bans": -1}, {"max_temp_bans": True},
])
def test_pool_config_bounds(options: dict[str, Any]) -> None:
    from celery_ha.proxy.config import PoolConfig

    with pytest.raises(InvalidInput):
        PoolConfig(**options)


def test_health_plumbing_refuses_bad_input(redis_url: str) -> None:
    from celery_ha.proxy import ProxyPool

    raw = redis.Redis.from_url(redis_url)
    pool = ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "hp")
    pool.add("http://10.0.0.1:8080")
    for call in (lambda: pool.reap(limit=0), lambda: pool.reap(limit=float("inf")),
                 lambda: pool.claim_for_check(limit=-1),
                 lambda: pool.claim_for_check(claim_seconds=float("nan")),
                 lambda: pool.record_check(None, True), lambda: pool.record_check("x", "yes"),
                 lambda: pool.record_check("x", True, latency_ms=float("inf"))):
        before = snapshot(raw)
        with pytest.raises(InvalidInput):
            call()
        assert snapshot(raw) == before
