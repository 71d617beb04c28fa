"""The pool's state over time: leases of mixed lengths, proxies that expire or leave while banned or
borrowed, health checks racing manual bans, per-domain bans on unban, and keys that must stay bounded.

Each test asserts on the Redis state and on what ``acquire`` hands out; waits poll the Redis clock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.proxy import (
    ApiProvider,
    FreeListProvider,
    PoolConfig,
    ProxyPool,
    TunnelProvider,
    check_proxies,
)
from tests.support.polling import wait_until
from tests.support.proxy_farm import ApiEndpoint

P = "cha:{default}:px:"


def make_pool(redis_url: str, **kw: object) -> ProxyPool:
    kw.setdefault("rate", (100, 1.0))
    return ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default", PoolConfig(**kw))


def redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def refusal(pool: ProxyPool, domain: str, **kw: object) -> str:
    """The reason acquire gives for refusing ``domain`` ('' when it hands out a proxy, released unused)."""
    try:
        lease = pool.acquire(domain, **kw)  # type: ignore[arg-type]
    except NoProxyAvailable as exc:
        return str(exc.reason)  # type: ignore[attr-defined]
    pool.release(lease, outcome="unused")
    return ""


def test_a_short_lease_never_shortens_a_long_leases_group_slot_or_budget(
    redis_url: str, r: redis.Redis
) -> None:
    pool = make_pool(redis_url)
    TunnelProvider("http://u-{session}:pw@127.0.0.3:9000", name="t", sessions=4, concurrency=2).install(pool)
    long = pool.acquire("a.example", ttl=120)
    short = pool.acquire("a.example", ttl=0.3)
    pool.release(short, ok=True, status=200)
    assert r.pttl(P + "sem:t") > 119_000  # the long lease's slot lives as long as that lease
    wait_until(lambda: redis_ms(r) > short.expires_at_ms + 1_500, what="the short lease's key TTL")
    assert r.zrange(P + "sem:t", 0, -1) == [long.token]
    second = pool.acquire("a.example", ttl=5)
    assert refusal(pool, "a.example") == "busy"  # cap 2: the long lease and `second`
    pool.release(second, outcome="unused")
    pool.release(long, outcome="unused")

    pool.set_domain_budget("b.example", "2/60")
    b_long = pool.acquire("b.example", ttl=120)
    b_short = pool.acquire("b.example", ttl=0.3)
    pool.release(b_short, ok=True, status=200)
    assert r.pttl(P + "bud:b.example") > 179_000  # 120 s lease + 60 s window
    assert r.zscore(P + "bud:b.example", b_long.token) == b_long.expires_at_ms
    assert refusal(pool, "b.example") == "budget"


def test_a_banned_proxy_that_expires_keeps_its_ban_when_its_provider_adds_it_again(
    redis_url: str, r: redis.Redis
) -> None:
    pool = make_pool(redis_url, max_fails=1, ban_base=30, ban_cap=30)
    perm = pool.add("http://10.1.2.3:8080", ttl=0.3)
    pool.ban(perm, reason="known bad exit")  # permanent
    temp = pool.add("http://10.1.2.4:8080", ttl=0.3)
    pool.release(pool.acquire("x.example", exclude=[perm]), ok=False)  # transport error: tban, tbans 1
    until = int(r.hget(P + "m:" + temp, "ban_until"))
    wait_until(lambda: pool.reap() >= 0 and not any(r.smismember(P + "all", [perm, temp])),
               what="both proxies' expiry")
    assert r.pttl(P + "tomb:" + perm) == -1  # a permanent ban's tombstone lasts until unban/remove
    now = redis_ms(r)  # read before the TTL (+1 ms: the script's clock and PTTL's round apart)
    assert 0 < r.pttl(P + "tomb:" + temp) <= until - now + 86_400_000 + 1

    added = pool.add_many(["http://10.1.2.3:8080", "http://10.1.2.4:8080"])
    assert added == {"added": 1, "updated": 0, "skipped": 1}
    assert pool.get(perm) is None and r.exists(P + "tomb:" + perm) == 1
    assert r.hmget(P + "m:" + temp, "state", "tbans", "ban_until") == ["tban", "1", str(until)]
    assert r.zscore(P + "tb", temp) == until and r.exists(P + "tomb:" + temp) == 0
    assert refusal(pool, "x.example") == "empty"

    assert pool.unban(perm) is None  # lifts the tombstone: the provider may add it again
    assert pool.add("http://10.1.2.3:8080") == perm
    assert pool.acquire("x.example").proxy_id == perm


def test_a_ban_made_while_a_health_probe_runs_is_not_undone_by_the_probe(
    redis_url: str, r: redis.Redis
) -> None:
    pool = make_pool(redis_url)
    pid = pool.add("http://127.0.0.3:8001", verify=True)
    [(claimed, _url, zone, _source, claim)] = pool.claim_for_check(limit=10)
    assert (claimed, zone) == (pid, "new") and r.hget(P + "m:" + pid, "ck") == claim
    assert pool.ban(pid, 3600, reason="operator") == "tban"
    assert pool.record_check(pid, True, 100, claim) == "skip"
    assert pool.record_check(pid, True, 100) == "skip"
    assert r.hmget(P + "m:" + pid, "state", "ban_reason") == ["tban", "operator"]
    assert r.zscore(P + "av", pid) is None

    other = pool.add("http://127.0.0.4:8001", verify=True)
    [(_, _, _, _, claim)] = pool.claim_for_check(limit=10)
    assert pool.record_check(other, True, 100, "new:1") == "skip"  # another claim's stamp
    assert pool.record_check(other, True, 100, claim) == "avail"
    assert pool.acquire("x.example").proxy_id == other


def test_the_group_slot_of_a_session_removed_while_borrowed_frees_at_release(
    redis_url: str, r: redis.Redis
) -> None:
    pool = make_pool(redis_url, lock_ttl=20)
    TunnelProvider("http://u-{session}:pw@gw.example:9000", name="t", sessions=2, concurrency=1).install(pool)
    lease = pool.acquire("a.example")
    assert pool.remove(lease.proxy_id)
    assert pool.release(lease, ok=True, status=200) == "ok"
    assert r.zcard(P + "sem:t") == 0
    assert pool.acquire("a.example").proxy_id != lease.proxy_id  # the group's one slot is free again


def test_unban_and_remove_lift_per_domain_bans_and_block_counts(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, block_ban_base=600, block_ban_cap=3600)
    pid = pool.add("http://127.0.0.2:8001")
    for domain in ("shop.example", "news.example"):
        pool.release(pool.acquire(domain), ok=False, status=403)
    assert r.hget(P + "blk:shop.example", pid) == "1"
    assert 7_000_000 < r.pttl(P + "blk:shop.example") <= 7_201_000  # two block caps, not for ever
    assert refusal(pool, "shop.example") == "busy"
    pool.unban(pid)
    assert r.exists(P + "blk:shop.example", P + "dban:shop.example", P + "pd:" + pid) == 0
    assert refusal(pool, "shop.example") == "" and refusal(pool, "news.example") == ""

    pool.release(pool.acquire("shop.example"), ok=False, status=403)
    assert pool.remove(pid)
    assert r.exists(P + "blk:shop.example", P + "dban:shop.example", P + "pd:" + pid) == 0


def test_the_domain_counters_stay_bounded(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    pool.add("http://127.0.0.2:8001")
    r.hset(P + "dom", mapping={f"a:site{i}.example": 1 for i in range(4000)})
    pool.release(pool.acquire("new.example"), outcome="unused")
    pool.release(pool.acquire("site7.example"), outcome="unused")
    assert r.hlen(P + "dom") == 4001  # the one overflow field, whatever the number of domains
    assert r.hget(P + "dom", "a:~other") == "1" and r.hget(P + "dom", "a:site7.example") == "2"


def test_a_temporary_ban_ends_by_time_when_no_health_check_runs(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CELERY_HA_PROXY_CHECK_URL", raising=False)
    assert PoolConfig().unban_by_time is True
    monkeypatch.setenv("CELERY_HA_PROXY_CHECK_URL", "http://check.example/")
    assert PoolConfig().unban_by_time is False
    monkeypatch.delenv("CELERY_HA_PROXY_CHECK_URL")

    pool = make_pool(redis_url, max_fails=1, ban_base=0.3, ban_cap=0.3)
    pid = pool.add("http://127.0.0.2:8001")
    pool.release(pool.acquire("x.example"), ok=False)
    assert r.hget(P + "m:" + pid, "state") == "tban"
    assert refusal(pool, "x.example") == "empty"
    wait_until(lambda: refusal(pool, "x.example") == "", timeout=3, what="the ban's end")
    assert r.hget(P + "m:" + pid, "state") == "avail" and r.zcard(P + "tb") == 0


def test_tunnel_providers_on_one_endpoint_never_share_a_session(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    TunnelProvider("http://u-{session}:pw@gw:7000", name="t1", sessions=3, concurrency=1).install(pool)
    TunnelProvider("http://u-{session}:pw@gw:7000", name="t", sessions=12, concurrency=1).install(pool)
    ids = r.smembers(P + "all")
    assert len(ids) == 15
    assert sum(r.hget(P + "grp", i) == "t1" for i in ids) == 3
    # An id is never moved to another group: the second claimant is skipped.
    other = TunnelProvider("http://u-{session}:pw@gw:7000", name="x", sessions=1, session_tags=["ts0"])
    assert other.install(pool) == {"added": 0, "updated": 0, "skipped": 1}
    assert r.hget(P + "grp", "gw:7000~ts0") == "t"


def test_bad_provider_and_check_input_is_one_line_not_a_traceback(
    redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    pool = make_pool(redis_url)
    api = ApiEndpoint().start()
    try:
        expire_ms = redis_ms(r) + 600_000  # a UNIX time in ms: 10 minutes from now
        api.payload = json.dumps([{"ip": "127.0.0.81", "port": 8001, "expire": expire_ms}]).encode()
        assert ApiProvider(pool, api.url("/ms"), name="ms", expire_key="expire").refresh() == 1
        left = int(r.hget(P + "m:127.0.0.81:8001", "expires_at")) - redis_ms(r)
        assert 590_000 < left <= 600_000
        api.payload = b"[" * 100_000 + b"]" * 100_000  # nested past Python's recursion limit
        deep = ApiProvider(pool, api.url("/deep"), name="deep")
        assert deep.refresh() == 0 and r.exists(P + "api:deep:fresh") == 1  # cached like any garbage
    finally:
        api.stop()
    with pytest.raises(InvalidInput, match="check_url"):
        check_proxies(pool, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="concurrency"):
        check_proxies(pool, "http://127.0.0.1:9/", concurrency="8")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="concurrency"):
        TunnelProvider("http://u-{session}:p@h.example:1", concurrency="3").install(pool)  # type: ignore[arg-type]
    listed = tmp_path / "free.json"
    listed.write_text('[{"ip": "1.2.3.4"}]')
    with pytest.raises(InvalidInput, match="port"):
        FreeListProvider(str(listed)).install(pool)
    # A long run's claim is capped at a day instead of failing on an internal bound.
    assert check_proxies(pool, "http://127.0.0.1:9/", concurrency=1, timeout=300, limit=100_000).checked == 0
    assert sorted(r.smembers(P + "all")) == ["127.0.0.81:8001"]
