"""The proxy-aware fetcher against a real site and real forward proxies on loopback."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
import requests

from celery_ha.base.errors import InvalidInput
from celery_ha.fetch.fetcher import Fetcher, FetchError, PermanentFetchError, RobotsDisallowed, classify
from celery_ha.proxy import PoolConfig, ProxyPool
from tests.support.polling import wait_until
from tests.support.proxy_farm import ProxyFarm, TestSite, started

P = "cha:{default}:px:"


@pytest.fixture
def site() -> Iterator[TestSite]:
    yield from started(TestSite("a"))


@pytest.fixture
def farm() -> Iterator[ProxyFarm]:
    yield from started(ProxyFarm(5, first=50))


@pytest.fixture
def pool(redis_url: str, farm: ProxyFarm) -> ProxyPool:
    p = ProxyPool(
        redis.Redis.from_url(redis_url, decode_responses=True),
        "default",
        PoolConfig(rate=(1000, 1.0), block_ban_base=30.0),
    )
    p.add_many(farm.urls)
    return p


def quick(pool: ProxyPool | None, **kw: object) -> Fetcher:
    slept: list[float] = []
    kw.setdefault("obey_robots", False)
    fetcher = Fetcher(pool, backoff_base=0.001, sleep=slept.append, **kw)  # type: ignore[arg-type]
    fetcher.slept = slept  # type: ignore[attr-defined]
    return fetcher


def test_every_retry_uses_a_different_proxy(
    site: TestSite, farm: ProxyFarm, pool: ProxyPool, r: redis.Redis
) -> None:
    """(d) Blocked/5xx/captcha answers rotate the proxy; the site never sees one IP twice for the page."""
    good = farm.proxies[4]
    site.blocked_ips = {p.exit_ip for p in farm.proxies[:2]}
    site.failing_ips = {farm.proxies[2].exit_ip, farm.proxies[3].exit_ip}
    # Make the good proxy the worst-ranked one, so every other proxy is tried first.
    r.zadd(P + "av", {f"127.0.0.1:{good.port}": 0.01})
    resp = quick(pool).fetch(site.url("/ok"))
    assert resp.status_code == 200 and good.exit_ip in resp.text
    ips = [h.ip for h in site.hits_for("/ok")]
    assert len(ips) == len(set(ips)) == resp.fetch_info.rotations == 5  # no IP twice
    assert ips[-1] == good.exit_ip
    assert (
        set(resp.fetch_info.outcomes[:-1]) <= {"blocked", "server"} and resp.fetch_info.outcomes[-1] == "ok"
    )
    for p in farm.proxies[:2]:  # blocked on this site only
        assert r.zscore(P + f"dban:{site.domain}", f"127.0.0.1:{p.port}") is not None


def test_exhausting_every_proxy_raises_a_retryable_fetch_error(
    site: TestSite, farm: ProxyFarm, pool: ProxyPool
) -> None:
    site.blocked_ips = {p.exit_ip for p in farm.proxies}
    with pytest.raises(FetchError) as info:
        quick(pool).fetch(site.url("/ok"))
    exc = info.value
    assert not exc.permanent and exc.retry_after > 0 and exc.outcome == "blocked"
    ips = [h.ip for h in site.hits_for("/ok")]
    assert sorted(ips) == sorted(p.exit_ip for p in farm.proxies)  # each proxy exactly once
    assert len(exc.proxies_tried) == 5


def test_rotations_are_capped_per_call(site: TestSite, farm: ProxyFarm, pool: ProxyPool) -> None:
    site.failing_ips = {p.exit_ip for p in farm.proxies}
    with pytest.raises(FetchError) as info:
        quick(pool, max_rotations=3).fetch(site.url("/ok"))
    assert len(site.hits_for("/ok")) == 3 and info.value.outcome == "server"


def test_permanent_errors_do_not_retry(site: TestSite, pool: ProxyPool, r: redis.Redis) -> None:
    with pytest.raises(PermanentFetchError) as info:
        quick(pool).fetch(site.url("/status/404"))
    assert info.value.permanent and info.value.status == 404
    assert len(site.hits_for("/status/404")) == 1
    with pytest.raises(PermanentFetchError):
        quick(pool).fetch(site.url("/status/410"))
    assert len(site.hits_for("/status/410")) == 1
    assert r.zcard(P + "iu") == 0  # both proxies returned


def test_captcha_counts_as_blocked_and_rotates(site: TestSite, pool: ProxyPool, r: redis.Redis) -> None:
    with pytest.raises(FetchError):
        quick(pool, max_rotations=2).fetch(site.url("/captcha"))
    hits = site.hits_for("/captcha")
    assert len(hits) == 2 and hits[0].ip != hits[1].ip
    assert int(pool.stats()["out_blocked"]) == 2


def test_retry_after_is_honoured(site: TestSite, farm: ProxyFarm, pool: ProxyPool, r: redis.Redis) -> None:
    site.blocked_ips = {farm.proxies[0].exit_ip}
    site.retry_after = "2"
    r.zadd(P + "av", {f"127.0.0.1:{farm.proxies[0].port}": 0.99})  # tried first
    fetcher = quick(pool)
    resp = fetcher.fetch(site.url("/ok"))
    assert resp.fetch_info.rotations == 2
    assert fetcher.slept and fetcher.slept[0] >= 2.0  # waited what the site asked
    until = r.zscore(P + f"dban:{site.domain}", f"127.0.0.1:{farm.proxies[0].port}")
    assert until is not None
    # A Retry-After beyond the wait budget ends the call with a retryable error carrying it.
    site.blocked_ips = {p.exit_ip for p in farm.proxies}
    site.retry_after = "120"
    with pytest.raises(FetchError) as info:
        quick(pool, max_wait=5).fetch(site.url("/ok?again=1"))
    assert info.value.retry_after >= 120


def test_robots_txt_is_obeyed_and_cached(site: TestSite, pool: ProxyPool) -> None:
    site.robots = "User-agent: *\nDisallow: /private\n"
    fetcher = quick(pool, obey_robots=True)
    assert fetcher.fetch(site.url("/ok")).status_code == 200
    with pytest.raises(RobotsDisallowed) as info:
        fetcher.fetch(site.url("/private/page"))
    assert info.value.permanent
    assert fetcher.fetch(site.url("/ok?2")).status_code == 200
    assert len(site.hits_for("/robots.txt")) == 1  # cached per domain
    assert site.hits_for("/private/page") == []
    site.robots = None  # a missing robots.txt allows everything
    other = quick(pool, obey_robots=True)
    assert other.fetch(site.url("/private/page")).status_code == 200


def test_direct_mode_without_any_proxy(site: TestSite, redis_url: str) -> None:
    resp = quick(None).fetch(site.url("/ok"))
    assert resp.status_code == 200 and resp.fetch_info.proxy_id is None
    assert site.hits_for("/ok")[0].ip == "127.0.0.1"
    hdrs = resp.request.headers
    assert hdrs["User-Agent"].startswith("Mozilla/5.0") and "Accept-Language" in hdrs
    empty = ProxyPool.from_url(redis_url, namespace="empty")
    with pytest.raises(FetchError):
        quick(empty, max_wait=0.2).fetch(site.url("/ok?strict"))  # no proxies and no direct fallback
    resp = quick(empty, direct_when_empty=True).fetch(site.url("/ok?fallback"))
    assert resp.status_code == 200 and resp.fetch_info.proxy_id is None
    with pytest.raises(InvalidInput):
        quick(None).fetch("ftp://127.0.0.1/x")


def test_politeness_delay_is_randomized_per_domain(site: TestSite) -> None:
    fetcher = quick(None, politeness={site.domain: (0.2, 0.4), "*": (0.0, 0.0)})
    fetcher.fetch(site.url("/ok"))
    fetcher.fetch(site.url("/ok"))
    assert len(fetcher.slept) == 2 and all(0.2 <= s <= 0.4 for s in fetcher.slept)


def test_classify() -> None:
    def resp(status: int, body: bytes = b"", ctype: str = "text/html") -> requests.Response:
        r = requests.Response()
        r.status_code = status
        r._content = body
        r.headers["Content-Type"] = ctype
        return r

    assert classify(None) == "transport"
    assert classify(resp(200, b"<html>fine</html>")) == "ok"
    assert classify(resp(200, b"<div class='g-recaptcha'>")) == "blocked"
    assert [classify(resp(s)) for s in (401, 403, 429)] == ["blocked"] * 3
    assert [classify(resp(s)) for s in (500, 502, 503)] == ["server"] * 3
    assert [classify(resp(s)) for s in (404, 410)] == ["permanent"] * 2
    assert classify(resp(407)) == "transport"


def test_fetch_errors_and_logs_never_show_credentials(
    site: TestSite, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.proxy_farm import ForwardProxy

    locked = ForwardProxy(["127.0.0.60"], auth=(r"alice", "right-password")).start()
    try:
        pool = ProxyPool.from_url(redis_url, namespace="auth", rate=(100, 1.0))
        pool.add(locked.url("alice", "s3cr3tPW"))  # wrong password: the proxy answers 407
        caplog.set_level(logging.DEBUG)
        with pytest.raises(FetchError) as info:
            quick(pool, max_wait=0.2).fetch(site.url("/ok"))
        assert locked.auth_failures == 1 and site.hits == []
        assert info.value.outcome == "transport"
        text = " ".join([str(info.value), repr(info.value.__dict__), caplog.text, repr(pool.list())])
        assert "s3cr3tPW" not in text
    finally:
        locked.stop()


class _Interrupted(BaseException):
    """Stands in for Celery's soft time limit firing while a request is in flight."""


class _InterruptAfterSend(requests.Session):
    def request(self, *args, **kwargs):
        super().request(*args, **kwargs)
        raise _Interrupted


def test_an_interrupted_fetch_returns_the_proxy_but_keeps_its_rate_hit(
    site: TestSite, pool: ProxyPool, r: redis.Redis
) -> None:
    session = _InterruptAfterSend()
    session.trust_env = False
    fetcher = Fetcher(pool, obey_robots=False, session=session)
    with pytest.raises(_Interrupted):
        fetcher.fetch(site.url("/ok"))
    assert len(site.hits_for("/ok")) == 1  # the request did reach the site ...
    windows = [k for k in r.keys(P + "rw:*") if k.endswith("|" + site.domain)]
    assert len(windows) == 1 and r.zcard(windows[0]) == 1  # ... so it still counts against the window
    assert r.keys(P + f"lk:*|{site.domain}") == []  # but the lock is free again
    assert pool.stats()["out_aborted"] == 1


def test_a_trickling_body_never_outlives_the_proxy_lease(site: TestSite, redis_url: str,
                                                         farm: ProxyFarm) -> None:
    """A site that sends one byte every 50 ms stays inside every read timeout for 15 s; through a
    proxy leased for 5 s the fetch must end, and the site see the connection gone, before the lease
    ends: after it, another worker may be handed the same proxy for the same site."""
    lock_ttl = 5.0
    pool = ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "trickle",
                     PoolConfig(rate=(1000, 1.0), lock_ttl=lock_ttl))
    pool.add_many(farm.urls[:1])
    fetcher = quick(pool, max_rotations=1, timeout=(2.0, 10.0))
    with pytest.raises(FetchError) as caught:
        fetcher.fetch(site.url("/trickle?bytes=300&every=50"))
    assert caught.value.outcome == "transport"
    wait_until(lambda: site.ended, timeout=20, what="the site's answer to end")
    end = site.ended[0]
    assert 0 < end.sent < 300  # cut off part-way, not sent whole
    assert end.ended - end.at < lock_ttl, "the site was still sending when the proxy's lease ended"
    assert pool.stats()["out_transport"] == 1

