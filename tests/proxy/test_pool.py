"""ProxyPool semantics against a real Redis: locks, rate windows, bans, scores, masking, bad input."""

from __future__ import annotations

import pytest
import redis

from celery_ha.base.errors import ConfigurationError, InvalidInput, NoProxyAvailable
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.proxy import scoring as S

P = "cha:{default}:px:"
SECRET = "s3cr3tPW"


def make_pool(redis_url: str, **kw: object) -> ProxyPool:
    kw.setdefault("rate", (100, 1.0))
    return ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default", PoolConfig(**kw))


def test_acquire_release_contract_and_lock_per_proxy_domain(redis_url: str, r: redis.Redis) -> None:
    pool = ProxyPool.from_url(redis_url, namespace="default")
    pid = pool.add(f"http://user:{SECRET}@127.0.0.2:8001", source="static")
    assert pid == "127.0.0.2:8001"
    pl = pool.acquire("example.com", worker="w1")
    assert pl.proxy_id == pid and pl.url == f"http://user:{SECRET}@127.0.0.2:8001"
    # The lock holds the lease token, with a TTL (30 s default).
    assert r.get(P + "lk:127.0.0.2:8001|example.com") == pl.token
    assert 0 < r.pttl(P + "lk:127.0.0.2:8001|example.com") <= 30_000
    assert r.zcard(P + "iu") == 1
    assert r.hget(P + "m:" + pid, "last_used_by") == "w1"
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("example.com", worker="w2")
    assert 0 < info.value.retry_after <= 30
    other = pool.acquire("other.example", worker="w2")  # same proxy, another domain: allowed in parallel
    assert other.proxy_id == pid
    assert pool.release(pl, ok=True, latency_ms=120, status=200) == "ok"
    assert r.exists(P + "lk:127.0.0.2:8001|example.com") == 0
    assert pool.release(pl, ok=True, latency_ms=120, status=200) == "stale"  # a second release folds nothing
    assert r.hget(P + "m:" + pid, "n_ok") == "1"
    pool.release(other, ok=True, latency_ms=100, status=200)
    assert r.zcard(P + "iu") == 0


def test_release_with_a_wrong_token_does_not_free_the_lock(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    pool.add("http://127.0.0.2:8001")
    lease = pool.acquire("a.example")
    forged = type(lease)(lease.proxy_id, lease.domain, "not-the-token", lease.url)
    assert pool.release(forged, ok=True, status=200) == "stale"
    assert r.get(P + "lk:127.0.0.2:8001|a.example") == lease.token


def test_rate_window_counts_reservations_and_restamps_at_release(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(2, 30.0))
    pool.add("http://127.0.0.2:8001")
    first = pool.acquire("a.example")
    win = P + "rw:127.0.0.2:8001|a.example"
    reserved = r.zscore(win, first.token)
    assert reserved == first.expires_at_ms  # reserved until the latest moment the request may leave
    pool.release(first, ok=True, status=200, latency_ms=5)
    restamped = r.zscore(win, first.token)
    assert first.acquired_at_ms <= restamped < reserved  # re-stamped with the return time
    second = pool.acquire("a.example")
    pool.release(second, ok=True, status=200)
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("a.example")
    assert 25 < info.value.retry_after <= 30.1  # the oldest hit leaves the window in ~30 s
    # An unused lease gives its slot back.
    pool.set_domain_rate("b.example", "1/30")
    b = pool.acquire("b.example")
    pool.release(b, outcome="unused")
    assert r.zcard(P + "rw:127.0.0.2:8001|b.example") == 0
    pool.release(pool.acquire("b.example"), ok=True, status=200)
    with pytest.raises(NoProxyAvailable):
        pool.acquire("b.example")


def test_per_domain_rate_override_and_domain_budget(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(1, 30.0), domain_rates={"fast.example": "3/30"})
    for i in range(3):
        pool.add(f"http://127.0.0.{2 + i}:8001")
    leases = []
    for _ in range(4):
        leases.append(pool.acquire("fast.example"))
        pool.release(leases[-1], ok=True, status=200)
    # the override lets the top proxy serve 3 requests in the window; the 4th goes elsewhere
    assert [lease.proxy_id for lease in leases].count(leases[0].proxy_id) == 3
    assert leases[3].proxy_id != leases[0].proxy_id
    pool.release(pool.acquire("slow.example"), ok=True, status=200)
    assert (
        r.zcard(P + "rw:" + leases[3].proxy_id + "|slow.example")
        + r.zcard(P + "rw:" + leases[0].proxy_id + "|slow.example")
        == 1
    )
    pool.set_domain_budget("capped.example", "2/30")
    assert r.hget(P + "dcfg", "capped.example") == "0 0 2 30000"
    got = [pool.acquire("capped.example"), pool.acquire("capped.example")]
    assert len({g.proxy_id for g in got}) == 2
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("capped.example")
    assert "budget" in str(info.value)
    pool.set_domain_budget("capped.example", None)
    assert r.hget(P + "dcfg", "capped.example") is None


def test_exclude_skips_proxies_a_retry_already_used(redis_url: str) -> None:
    pool = make_pool(redis_url)
    ids = [pool.add(f"http://127.0.0.{2 + i}:8001") for i in range(3)]
    used: list[str] = []
    for _ in range(3):
        lease = pool.acquire("a.example", exclude=used)
        pool.release(lease, ok=False, status=503)
        used.append(lease.proxy_id)
    assert sorted(used) == sorted(ids)
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("a.example", exclude=used)
    assert info.value.reason == "excluded"  # type: ignore[attr-defined]


def test_block_bans_the_proxy_for_that_domain_only(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, block_ban_base=30.0)
    pid = pool.add("http://127.0.0.2:8001")
    before = r.zscore(P + "av", pid)
    lease = pool.acquire("strict.example")
    pool.release(lease, ok=False, status=403, latency_ms=50)
    until = r.zscore(P + "dban:strict.example", pid)
    assert until is not None and until > lease.acquired_at_ms + 20_000
    assert r.hget(P + "blk:strict.example", pid) == "1"
    with pytest.raises(NoProxyAvailable):
        pool.acquire("strict.example")
    pool.release(pool.acquire("other.example"), ok=True, status=200)  # still serves other sites
    assert r.hget(P + "m:" + pid, "state") == "avail"
    assert r.zscore(P + "av", pid) >= before - 0.05  # a block does not sink the global score


def test_consecutive_transport_failures_ban_with_backoff_then_permanently(
    redis_url: str, r: redis.Redis
) -> None:
    pool = make_pool(redis_url, max_fails=2, ban_base=10.0, ban_cap=15.0, max_temp_bans=2)
    pid = pool.add("http://127.0.0.2:8001")
    durations = []
    for round_ in range(3):
        for _ in range(2):
            lease = pool.acquire(f"d{round_}.example")
            pool.release(lease, ok=False)  # transport error
        if round_ < 2:
            assert r.hget(P + "m:" + pid, "state") == "tban"
            until = r.zscore(P + "tb", pid)
            durations.append(until - lease.acquired_at_ms)
            assert r.zscore(P + "av", pid) is None
            with pytest.raises(NoProxyAvailable):
                pool.acquire("x.example")
            pool.unban(pid)
            r.hset(P + "m:" + pid, "tbans", round_ + 1)  # keep the ban history the manual unban cleared
    assert 7_400 <= durations[0] <= 12_600  # 10 s ± 25 %
    assert 14_990 <= durations[1] <= 15_010  # 20 s ± 25 % is above the 15 s cap
    assert r.hget(P + "m:" + pid, "state") == "pban"
    assert r.zscore(P + "pb", pid) is not None and r.zscore(P + "tb", pid) is None
    # A permanently banned proxy is not re-admitted by a provider re-adding it.
    assert pool.add_many(["http://127.0.0.2:8001"]) == {"added": 0, "updated": 0, "skipped": 1}


def test_manual_ban_unban_remove(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    pid = pool.add(f"http://u:{SECRET}@127.0.0.2:8001")
    assert pool.ban(f"http://u:{SECRET}@127.0.0.2:8001", seconds=60) == "tban"
    assert r.zscore(P + "tb", pid) is not None
    assert pool.ban(pid) == "pban"
    assert r.zscore(P + "pb", pid) is not None and r.zscore(P + "tb", pid) is None
    assert [i.id for i in pool.list("pban")] == [pid]
    pool.unban(pid)
    assert r.zscore(P + "av", pid) is not None and r.hget(P + "m:" + pid, "state") == "avail"
    assert pool.remove(pid) is True
    assert r.keys(P + "m:*") == [] and r.zcard(P + "av") == 0 and r.scard(P + "all") == 0
    with pytest.raises(InvalidInput):
        pool.ban("127.0.0.9:1")


def test_score_follows_the_formula_and_orders_acquire(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, max_fails=100)
    history = {  # id -> list of (ok, latency)
        "127.0.0.2:8001": [(True, 100)] * 10,  # fast and reliable
        "127.0.0.3:8001": [(True, 2000)] * 10,  # reliable, slow
        "127.0.0.4:8001": [(True, 100), (False, None)] * 5,  # fast, flaky
        "127.0.0.5:8001": [],  # new: probation
    }
    for pid in history:
        pool.add(f"http://{pid}")
    pool.add("http://127.0.0.6:8001", ttl=1000)  # a provider lease: lifetime counts 10 %
    everyone = [*history, "127.0.0.6:8001"]
    for i, (pid, results) in enumerate(history.items()):
        for j, (ok, latency) in enumerate(results):
            lease = pool.acquire(f"h{i}-{j}.example", exclude=[p for p in everyone if p != pid])
            pool.release(lease, ok=ok, latency_ms=latency, status=200 if ok else None)

    def expected(pid: str) -> float:
        s = t = ln = ld = 0.0
        for ok, latency in history.get(pid, []):
            s, t = s * S.DECAY + (1 if ok else 0), t * S.DECAY + 1
            if latency is not None:
                ln, ld = ln * S.DECAY + latency, ld * S.DECAY + 1
        sr = (s + S.PRIOR_WEIGHT * S.PRIOR_SUCCESS) / (t + S.PRIOR_WEIGHT)
        lat = (ln + S.LATENCY_PRIOR_WEIGHT * S.LATENCY_REF) / (ld + S.LATENCY_PRIOR_WEIGHT)
        return 0.6 * sr + 0.3 * (S.LATENCY_REF / (S.LATENCY_REF + lat)) + 0.1 * 1.0

    for pid in history:
        assert r.zscore(P + "av", pid) == pytest.approx(expected(pid), abs=1e-9), pid
    m = r.hgetall(P + "m:127.0.0.6:8001")
    life = (int(m["expires_at"]) - int(m["added_at"])) / 1_000_000  # span in ms / 1000 s = fraction
    assert m["expires_at"] != "0" and life == pytest.approx(1.0)
    assert r.zscore(P + "av", "127.0.0.6:8001") == pytest.approx(0.6 * 0.5 + 0.3 * 0.5 + 0.1, abs=1e-4)
    order = r.zrevrange(P + "av", 0, -1)
    assert order[:2] == ["127.0.0.2:8001", "127.0.0.3:8001"]
    assert order.index("127.0.0.4:8001") < order.index("127.0.0.5:8001")  # 50 % at 100 ms beats unknown
    assert pool.acquire("fresh.example").proxy_id == "127.0.0.2:8001"
    # Probation: one result moves a new proxy by less than 0.1.
    new_score = r.zscore(P + "av", "127.0.0.5:8001")
    lease = pool.acquire("p.example", exclude=[p for p in everyone if p != "127.0.0.5:8001"])
    pool.release(lease, ok=False)
    assert 0 < new_score - r.zscore(P + "av", "127.0.0.5:8001") < 0.1
    # The Python mirror in scoring.py agrees with the scripts.
    s, t, ln, ld = 0.0, 0.0, 0.0, 0.0
    for ok, latency in history["127.0.0.4:8001"]:
        s, t, ln, ld = S.fold(s, t, ln, ld, success=ok, latency_ms=latency)
    assert S.score(s, t, ln, ld, 1.0) == pytest.approx(r.zscore(P + "av", "127.0.0.4:8001"), abs=1e-9)


def test_expired_proxies_leave_the_pool(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url)
    pid = pool.add("http://127.0.0.2:8001", ttl=0.2)
    assert pool.acquire("a.example").proxy_id == pid
    from tests.support.proxy_farm import wait_until

    def gone() -> bool:
        try:
            pool.acquire("b.example")
        except NoProxyAvailable as exc:
            return exc.reason == "empty"  # type: ignore[attr-defined]
        return False

    wait_until(gone, 3.0, what="proxy expiry")
    assert r.exists(P + "m:" + pid) == 0 and pool.stats()["expired"] == 1


def test_credentials_are_masked_everywhere(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool(redis_url)
    pid = pool.add(f"http://alice:{SECRET}@127.0.0.2:8001")
    lease = pool.acquire("a.example")
    texts = [
        repr(pool),
        repr(lease),
        str(lease.__dict__.get("worker")),
        repr(pool.list()),
        repr([i.to_dict() for i in pool.list()]),
        repr(pool.get(pid)),
        repr(pool.stats()),
    ]
    with pytest.raises(InvalidInput) as bad:
        pool.add(f"http://alice:{SECRET}@127.0.0.2")  # no port
    texts.append(str(bad.value))
    with pytest.raises(InvalidInput) as bad2:
        pool.add(f"ftp://alice:{SECRET}@127.0.0.2:21")
    texts.append(str(bad2.value))
    texts.append(caplog.text)
    for text in texts:
        assert SECRET not in text
    assert "alice:***@127.0.0.2:8001" in repr(lease)
    assert pool.list()[0].url == "http://alice:***@127.0.0.2:8001"


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.add("not a url"),
        lambda p: p.add("http://127.0.0.2"),
        lambda p: p.add("http://127.0.0.2:99999"),
        lambda p: p.add("http://127.0.0.2:80/path"),
        lambda p: p.add("gopher://127.0.0.2:70"),
        lambda p: p.add("http://bad_host!:80"),
        lambda p: p.add_many(["http://127.0.0.2:8001", "http://nope"]),
        lambda p: p.acquire("bad domain!"),
        lambda p: p.acquire(""),
        lambda p: p.acquire("example.com:0"),
        lambda p: p.set_domain_rate("example.com", "abc"),
        lambda p: p.set_domain_rate("example.com", "0/60"),
        lambda p: p.set_domain_rate("example.com", "5/-1"),
        lambda p: p.set_domain_rate("bad domain", "5/60"),
        lambda p: p.add("http://127.0.0.2:8001", ttl=-1),
        lambda p: p.ban("http://127.0.0.2:8001", seconds=-5),
        lambda p: p.release(object.__new__(type("L", (), {})), outcome="weird"),
    ],
)
def test_bad_input_raises_invalid_input_and_writes_nothing(redis_url: str, r: redis.Redis, call) -> None:
    pool = make_pool(redis_url)
    with pytest.raises(InvalidInput):
        call(pool)
    assert r.keys("*") == []


@pytest.mark.parametrize("rate", ["abc", "0/60", "5/0", (0, 60), (5, -1), "5 per minute"])
def test_bad_rate_in_config(rate: object) -> None:
    with pytest.raises(InvalidInput):
        PoolConfig(rate=rate)  # type: ignore[arg-type]


def test_rate_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_HA_PROXY_RATE", "7/30")
    monkeypatch.setenv("CELERY_HA_PROXY_DOMAIN_RATES", "Slow.Example=1/10, fast.example:8080=50/1")
    cfg = PoolConfig.from_env()
    assert cfg.rate == (7, 30.0)
    assert cfg.domain_rates == {"slow.example": (1, 10.0), "fast.example:8080": (50, 1.0)}
    monkeypatch.setenv("CELERY_HA_PROXY_DOMAIN_RATES", "slow.example")
    with pytest.raises(ConfigurationError, match="CELERY_HA_PROXY_DOMAIN_RATES"):
        PoolConfig.from_env()


def test_full_windows_cool_down_per_domain_and_clear_on_release(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(1, 30.0), lock_ttl=20.0)
    pid = pool.add("http://127.0.0.2:8001")
    lease = pool.acquire("a.example")
    # While in flight the hit is reserved until the lease ends (now + 20 s) ...
    assert r.zscore(P + f"rw:{pid}|a.example", lease.token) == lease.expires_at_ms
    pool.release(lease, ok=True, status=200)
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("a.example")
    # ... but once returned, the window reopens 30 s after the return, not after the reservation.
    assert 29.0 < info.value.retry_after <= 30.1
    reopen = r.zscore(P + "cd:a.example", pid)
    assert reopen is not None and r.pttl(P + "cd:a.example") > 0
    pool.acquire("b.example")  # a cool-down is per domain
    pool.set_domain_rate("a.example", "2/30")  # new rate: cool-downs recomputed
    assert r.exists(P + "cd:a.example") == 0
    second = pool.acquire("a.example")
    pool.release(second, outcome="unused")  # never sent: the slot comes back at once
    assert r.zcard(P + f"rw:{pid}|a.example") == 1
    assert pool.acquire("a.example").proxy_id == pid


def test_an_exhausted_domain_is_refused_cheaply(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(2, 60.0))
    pool.add_many([f"http://127.0.1.{i}:8080" for i in range(1, 101)])
    for _ in range(200):
        pool.release(pool.acquire("busy.example"), ok=True, latency_ms=50, status=200)
    with pytest.raises(NoProxyAvailable):
        pool.acquire("busy.example")
    before = r.info("stats")["total_commands_processed"]
    for _ in range(5):
        with pytest.raises(NoProxyAvailable) as info:
            pool.acquire("busy.example")
        assert info.value.reason == "busy" and 55 < info.value.retry_after <= 60  # type: ignore[attr-defined]
    per_call = (r.info("stats")["total_commands_processed"] - before - 1) / 5
    assert per_call < 20  # bulk-loaded cool-downs: no per-proxy commands for 100 exhausted proxies


def _calls(r: redis.Redis, command: str) -> int:
    """How many times ``command`` ran on the server (every node of a cluster), scripts' inner calls
    included."""
    if isinstance(r, redis.RedisCluster):
        per_node = r.info("commandstats", target_nodes=redis.RedisCluster.ALL_NODES).values()
    else:
        per_node = [r.info("commandstats")]
    return sum(int(info.get(f"cmdstat_{command}", {}).get("calls", 0)) for info in per_node)


def test_an_exhausted_domain_is_remembered_until_a_proxy_may_free(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(1, 60.0))
    pool.add_many([f"http://127.0.1.1:{8000 + i}" for i in range(1, 301)])
    for _ in range(300):
        pool.release(pool.acquire("busy.example"), ok=True, latency_ms=50, status=200)
    with pytest.raises(NoProxyAvailable):
        pool.acquire("busy.example")  # walks the pool once and remembers the domain as exhausted
    assert 55_000 < r.pttl(P + "dx:busy.example") <= 60_000
    walks = _calls(r, "zrevrange") + _calls(r, "zrangebyscore")
    for _ in range(5):
        with pytest.raises(NoProxyAvailable) as info:
            pool.acquire("busy.example")
        assert info.value.reason == "busy" and 55 < info.value.retry_after <= 60  # type: ignore[attr-defined]
    # The housekeeping's four bounded ZRANGEBYSCOREs per call (expired proxies, dead leases, and, no
    # health check being configured here, due temporary bans and new proxies waiting for a check),
    # and no walk of the 300 proxies.
    assert _calls(r, "zrevrange") + _calls(r, "zrangebyscore") - walks == 4 * 5
    # A new proxy may serve the domain: it is handed out at once.
    new = pool.add("http://127.0.2.1:8080")
    assert pool.acquire("busy.example").proxy_id == new


def test_what_frees_a_proxy_voids_the_exhausted_mark(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, rate=(1, 60.0), lock_ttl=30.0)
    a, b = pool.add("http://127.0.1.1:8080"), pool.add("http://127.0.1.2:8080")
    pool.ban(b)
    pool.release(pool.acquire("x.example"), ok=True, status=200)  # a's window for x is full for 60 s
    with pytest.raises(NoProxyAvailable):
        pool.acquire("x.example")
    assert r.exists(P + "dx:x.example")
    pool.unban(b)  # back in the pool: the mark is void
    held = pool.acquire("x.example")
    assert held.proxy_id == b
    # Locked and rate-limited: exhausted again; the lease's release frees the lock at once.
    pool.set_domain_rate("x.example", "5/60")  # a new rate: a's window is judged again
    other = pool.acquire("x.example")
    assert other.proxy_id == a
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("x.example")
    assert info.value.retry_after <= 0.25 and r.exists(P + "dx:x.example")  # type: ignore[attr-defined]
    pool.release(held, ok=True, status=200)
    assert pool.acquire("x.example").proxy_id == b


def test_a_freed_group_slot_voids_other_domains_marks(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, lock_ttl=30.0)
    pid = pool.add("http://127.0.1.1:8080", group="tunnel")
    pool.set_group_cap("tunnel", 1)
    lease = pool.acquire("a.example")
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("b.example")  # the group's one slot is taken, for 30 s at most
    assert info.value.retry_after > 25 and r.exists(P + "dx:b.example")  # type: ignore[attr-defined]
    pool.release(lease, ok=True, status=200)
    assert pool.acquire("b.example").proxy_id == pid


def test_a_walk_that_excluded_proxies_marks_nothing(redis_url: str, r: redis.Redis) -> None:
    pool = make_pool(redis_url, lock_ttl=30.0)
    a, b = pool.add("http://127.0.1.1:8080"), pool.add("http://127.0.1.2:8080")
    held = pool.acquire("a.example", exclude=[b])
    assert held.proxy_id == a
    with pytest.raises(NoProxyAvailable) as info:
        pool.acquire("a.example", exclude=[b])  # a is locked, b excluded by this caller only
    assert info.value.reason == "busy"  # type: ignore[attr-defined]
    assert not r.exists(P + "dx:a.example")
    assert pool.acquire("a.example").proxy_id == b
