"""Providers (tunnel, extraction API, free list) and the health check, against real local servers."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.fetch.fetcher import Fetcher, FetchError
from celery_ha.proxy import (
    ApiProvider,
    FreeListProvider,
    PoolConfig,
    ProxyPool,
    StaticProvider,
    TunnelProvider,
    check_proxies,
    parse_alive,
)
from tests.support.proxy_farm import ApiEndpoint, ForwardProxy, ProxyFarm, TestSite, started

P = "cha:{default}:px:"
SECRET = "s3cr3tPW"


@pytest.fixture
def site() -> Iterator[TestSite]:
    yield from started(TestSite("a"))


@pytest.fixture
def tunnel() -> Iterator[ForwardProxy]:
    exits = [f"127.0.0.{70 + i}" for i in range(8)]
    yield from started(ForwardProxy(exits, auth=(r"cust-session-(?P<session>\w+)|cust", SECRET)))


def make_pool(redis_url: str, **kw: object) -> ProxyPool:
    kw.setdefault("rate", (1000, 1.0))
    return ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default", PoolConfig(**kw))


def test_tunnel_sticky_sessions_with_auth(
    redis_url: str, r: redis.Redis, site: TestSite, tunnel: ForwardProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """(f) One pool entry per sticky session; each session keeps its exit IP; credentials never shown."""
    pool = make_pool(redis_url)
    provider = TunnelProvider(
        tunnel.url("cust-session-{session}", SECRET), name="tun", sessions=4, concurrency=2
    )
    assert provider.install(pool)["added"] == 4
    ids = sorted(r.smembers(P + "all"))
    assert ids == [f"127.0.0.1:{tunnel.port}~tuns{i}" for i in range(4)]
    assert r.hget(P + "gcap", "tun") == "2" and all(r.hget(P + "grp", i) == "tun" for i in ids)
    caplog.set_level(logging.DEBUG)
    fetcher = Fetcher(pool, obey_robots=False, backoff_base=0.0)
    seen: dict[str, set[str]] = {}
    for i in range(12):
        resp = fetcher.fetch(site.url(f"/ok?n={i}"))
        session = resp.fetch_info.proxy_id.split("~")[1]
        seen.setdefault(session, set()).add(site.hits[-1].ip)
    assert tunnel.auth_failures == 0
    for session, ips in seen.items():
        assert ips == {tunnel.sticky_ip(session)}, session  # sticky: one exit per session
    texts = [caplog.text, repr(pool.list()), repr(provider), repr(pool.acquire("x.example"))]
    assert all(SECRET not in t for t in texts)
    assert pool.list()[0].url.startswith("http://cust-session-tun") and ":***@" in pool.list()[0].url


def test_tunnel_concurrency_cap_is_shared_by_all_workers(
    redis_url: str, r: redis.Redis, tunnel: ForwardProxy
) -> None:
    pool = make_pool(redis_url)
    TunnelProvider(
        tunnel.url("cust-session-{session}", SECRET), name="tun", sessions=4, concurrency=2
    ).install(pool)
    other_worker = make_pool(redis_url)  # a second client: the cap lives in Redis, not in the process
    a = pool.acquire("a.example", worker="w1")
    b = other_worker.acquire("a.example", worker="w2")
    assert a.proxy_id != b.proxy_id  # per-session locks: two sessions serve one domain at once
    assert r.zcard(P + "sem:tun") == 2
    with pytest.raises(NoProxyAvailable):
        other_worker.acquire("b.example")  # sessions are free, but the tunnel is at its cap
    pool.release(a, ok=True, status=200)
    c = other_worker.acquire("b.example")
    assert r.zcard(P + "sem:tun") == 2
    other_worker.release(b, ok=True, status=200)
    other_worker.release(c, ok=True, status=200)
    assert r.zcard(P + "sem:tun") == 0


def test_tunnel_without_sessions_is_one_rotating_endpoint(
    redis_url: str, r: redis.Redis, site: TestSite, tunnel: ForwardProxy
) -> None:
    pool = make_pool(redis_url)
    TunnelProvider(tunnel.url("cust", SECRET), name="rot", concurrency=5).install(pool)
    assert r.smembers(P + "all") == {f"127.0.0.1:{tunnel.port}"}
    lease = pool.acquire(site.domain)
    with pytest.raises(NoProxyAvailable):
        pool.acquire(site.domain)  # locks and limits are per endpoint
    pool.release(lease, outcome="unused")
    fetcher = Fetcher(pool, obey_robots=False)
    for i in range(4):
        fetcher.fetch(site.url(f"/ok?{i}"))
    assert len({h.ip for h in site.hits}) == 4  # the provider rotated the exit on every request
    with pytest.raises(InvalidInput):
        TunnelProvider("http://cust:pw@127.0.0.1:1/{session}", name="bad").install(pool)


def test_api_provider_good_empty_garbage_and_failed_payloads(
    redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """(g) A good payload fills the pool; empty, garbage and failed ones log one line and change nothing."""
    api = ApiEndpoint().start()
    try:
        pool = make_pool(redis_url)
        provider = ApiProvider(
            pool,
            api.url(f"/get?key={SECRET}").replace("http://", f"http://u:{SECRET}@"),
            path="data.list",
            expire_key="expire",
            cache_ttl=30,
        )
        api.payload = json.dumps(
            {
                "code": 0,
                "data": {
                    "list": [
                        {"ip": "127.0.0.81", "port": 8001, "expire": 300},
                        {"ip": "127.0.0.82", "port": "8002", "expire": 300},
                        {"ip": "127.0.0.83", "port": 8003},
                    ]
                },
            }
        ).encode()
        assert provider.refresh() == 3
        assert sorted(r.zrange(P + "av", 0, -1)) == ["127.0.0.81:8001", "127.0.0.82:8002", "127.0.0.83:8003"]
        assert r.hget(P + "m:127.0.0.81:8001", "source") == "api"
        assert int(r.hget(P + "m:127.0.0.81:8001", "expires_at")) > 0
        assert r.zscore(P + "exp", "127.0.0.83:8003") is None  # no expiry given, none invented
        assert provider.refresh() == 0 and api.calls == 1  # cached for ~30 s
        before = sorted(r.zrange(P + "av", 0, -1, withscores=True))

        for payload, status in [
            (b"", 200),
            (b"<html>rate limited</html>", 200),
            (b'{"data": {}}', 200),
            (b'{"data": {"list": ["127.0.0.90:1", "bogus"]}}', 200),
            (b"[]", 500),
            (b'{"data": {"list": []}}', 200),
        ]:
            api.payload, api.status = payload, status
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="celery_ha.proxy.providers"):
                assert provider.refresh(force=True) == 0
            lines = [rec for rec in caplog.records if rec.name == "celery_ha.proxy.providers"]
            assert len(lines) == 1 and "pool unchanged" in lines[0].getMessage(), payload
            assert SECRET not in caplog.text
            assert sorted(r.zrange(P + "av", 0, -1, withscores=True)) == before
    finally:
        api.stop()


def test_api_provider_is_fetched_by_one_worker_at_a_time(redis_url: str, r: redis.Redis) -> None:
    api = ApiEndpoint().start()
    try:
        api.payload = b"127.0.0.81:8001\n127.0.0.82:8001\n"
        api.delay = 0.3
        pools = [make_pool(redis_url) for _ in range(8)]
        results: list[int] = []
        barrier = threading.Barrier(8)

        def worker(pool: ProxyPool) -> None:
            barrier.wait()
            results.append(ApiProvider(pool, api.url()).refresh())

        threads = [threading.Thread(target=worker, args=(p,)) for p in pools]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert api.calls == 1 and sorted(results) == [0] * 7 + [2]
        assert r.zcard(P + "av") == 2 and r.keys(P + "api:api:lock") == []
    finally:
        api.stop()


def test_free_list_admits_only_long_lived_entries_on_probation(
    redis_url: str, r: redis.Redis, site: TestSite, tmp_path: Path
) -> None:
    farm = ProxyFarm(2, first=90).start()
    try:
        listing = tmp_path / "free.txt"
        listing.write_text(
            "# ip:port  survival\n"
            f"127.0.0.1:{farm.proxies[0].port}  3小时\n"
            f"127.0.0.1:{farm.proxies[1].port}  2h30m\n"
            "127.0.0.1:1  45分钟\n"  # too young
            "127.0.0.1:2  2h\n",  # exactly 2 h is not more than 2 h
            encoding="utf-8",
        )
        # A pool whose beat runs the check (unban_by_time False): probation lasts until a check passes.
        # Without a check URL the entries join unchecked instead: test_verify_without_check.py.
        pool = make_pool(redis_url, unban_by_time=False)
        result = FreeListProvider(str(listing)).install(pool)
        assert result["added"] == 2 and result["too_young"] == 2
        assert r.zcard(P + "new") == 2 and r.zcard(P + "av") == 0  # on probation: not handed out yet
        with pytest.raises(NoProxyAvailable):
            pool.acquire("a.example")
        farm.proxies[1].alive = False
        report = check_proxies(pool, site.url("/ok"), concurrency=2, timeout=2)
        good, bad = (f"127.0.0.1:{p.port}" for p in farm.proxies)
        assert report.restored == [good] and report.demoted == {bad: "pban"}  # a free proxy gets one chance
        assert pool.acquire("a.example").proxy_id == good
        assert {h.ip for h in site.hits} == {farm.proxies[0].exit_ip}
    finally:
        farm.stop()


def test_health_check_runs_probes_concurrently_with_a_timeout(redis_url: str, site: TestSite) -> None:
    farm = ProxyFarm(6, first=100, delay=(0.3, 0.3)).start()
    try:
        pool = make_pool(redis_url)
        pool.add_many(farm.urls, verify=True)
        import time

        started = time.monotonic()
        report = check_proxies(pool, site.url("/ok"), concurrency=6, timeout=2)
        elapsed = time.monotonic() - started
        assert report.checked == 6 and len(report.restored) == 6
        assert elapsed < 6 * 0.3  # in parallel, not one after another
        # A second run finds nothing due.
        assert check_proxies(pool, site.url("/ok"), concurrency=2, timeout=1).checked == 0
        with pytest.raises(InvalidInput):
            check_proxies(pool, "ftp://x", concurrency=2, timeout=1)
        # A probe slower than the timeout fails.
        slow = ForwardProxy(["127.0.0.110"], delay=(1.5, 1.5)).start()
        try:
            pool.add(slow.url(), verify=True)
            report = check_proxies(pool, site.url("/ok"), concurrency=2, timeout=0.5)
            assert report.demoted == {f"127.0.0.1:{slow.port}": "tban"}
        finally:
            slow.stop()
    finally:
        farm.stop()


def test_fetcher_refreshes_providers_when_the_pool_is_empty(redis_url: str, site: TestSite) -> None:
    farm = ProxyFarm(1, first=120).start()
    api = ApiEndpoint().start()
    try:
        api.payload = json.dumps([f"127.0.0.1:{farm.proxies[0].port}"]).encode()
        pool = make_pool(redis_url)
        fetcher = Fetcher(pool, obey_robots=False, providers=[ApiProvider(pool, api.url())])
        resp = fetcher.fetch(site.url("/ok"))
        assert resp.status_code == 200 and site.hits[-1].ip == "127.0.0.120" and api.calls == 1
    finally:
        api.stop()
        farm.stop()


def test_static_provider_and_alive_parsing(redis_url: str, tmp_path: Path) -> None:
    f = tmp_path / "static.txt"
    f.write_text(f"# mine\nhttp://u:{SECRET}@127.0.0.2:8001\n\n127.0.0.3:8001\n", encoding="utf-8")
    pool = make_pool(redis_url)
    assert StaticProvider.from_file(f).install(pool)["added"] == 2
    assert parse_alive("2小时15分") == 8100 and parse_alive("125min") == 7500 and parse_alive("7200") == 7200
    assert parse_alive("1d") == 86400
    with pytest.raises(InvalidInput):
        parse_alive("forever")
    assert requests is not None and FetchError is not None
