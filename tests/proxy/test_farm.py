"""The pool against real servers: a site that logs client IPs and a farm of forward proxies whose
upstream connections leave from distinct 127.0.0.x addresses (so the site sees one IP per proxy).

Assertions are on what the site logged and on Redis state, never on the pool's own counters alone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest
import redis
import requests

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.fetch.fetcher import Fetcher, FetchError
from celery_ha.proxy import PoolConfig, ProxyPool, check_proxies
from tests.support.proxy_farm import (
    ProxyFarm,
    TestSite,
    Tracker,
    borrow_and_hang,
    crawl_worker,
    wait_until,
    window_violations,
)

P = "cha:{default}:px:"


@pytest.fixture
def tracker() -> Tracker:
    return Tracker()


@pytest.fixture
def sites(tracker: Tracker) -> Iterator[list[TestSite]]:
    started = [TestSite("a", tracker=tracker).start(), TestSite("b", tracker=tracker).start()]
    yield started
    for s in started:
        s.stop()


def redis_ms(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec * 1000 + usec / 1000


def pool_for(redis_url: str, **kw: object) -> ProxyPool:
    return ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), "default", PoolConfig(**kw))


def test_16_borrowers_never_share_a_proxy_for_one_domain(
    redis_url: str, sites: list[TestSite], tracker: Tracker, r: redis.Redis
) -> None:
    """(a) The site sees at most one request at a time per IP × site, yet one IP serves two sites at once."""
    farm = ProxyFarm(4, first=2).start()
    try:
        pool = pool_for(redis_url, rate=(10_000, 1.0))
        pool.add_many(farm.urls)
        errors: list[BaseException] = []
        done = [0]
        lock = threading.Lock()

        def borrower(seed: int) -> None:
            rnd = random.Random(seed)
            session = requests.Session()
            session.trust_env = False
            try:
                for _ in range(12):
                    site = rnd.choice(sites)
                    while True:
                        try:
                            lease = pool.acquire(site.domain, worker=f"t{seed}")
                            break
                        except NoProxyAvailable as exc:
                            time.sleep(min(exc.retry_after, 0.01))  # backoff between tries
                    resp = session.get(site.url("/ok?delay=15"), proxies=lease.proxies, timeout=10)
                    pool.release(lease, ok=resp.ok, status=resp.status_code, latency_ms=15)
                    with lock:
                        done[0] += 1
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=borrower, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert done[0] == 16 * 12
        hits = sites[0].hits_for("/ok") + sites[1].hits_for("/ok")
        assert len(hits) == 16 * 12 and all(h.status == 200 for h in hits)
        assert {h.ip for h in hits} <= {p.exit_ip for p in farm.proxies}
        assert tracker.max_pair == 1  # never two requests of one IP on one site at once
        assert tracker.max_ip >= 2  # but one IP did serve both sites in parallel
        assert r.zcard(P + "iu") == 0 and r.keys(P + "lk:*") == []
    finally:
        farm.stop()


@pytest.mark.timeout(120)
def test_8_processes_stay_inside_every_window_as_the_site_counts(redis_url: str, r: redis.Redis) -> None:
    """(b) 8 worker processes, 5 requests / 2 s per proxy × site, checked on the site's per-IP log."""
    n, w = 5, 2.0
    site_a, site_b = TestSite("a", limit=(n, w)).start(), TestSite("b", limit=(n, w)).start()
    farm = ProxyFarm(6, first=30, delay=(0.0, 0.06)).start()  # a jittery hop makes arrival order vary
    try:
        pool = pool_for(redis_url, rate=(n, w))
        pool.add_many(farm.urls)
        ctx = mp.get_context("spawn")
        urls = [site_a.url("/ok"), site_b.url("/ok")]
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [
            ctx.Process(
                target=crawl_worker,
                args=(
                    redis_url,
                    "default",
                    (n, w),
                    urls[i % 2 :] + urls[: i % 2],
                    5.0,
                    f"p{i}",
                    barrier,
                    results,
                ),
            )
            for i in range(8)
        ]
        for proc in procs:
            proc.start()
        done = sum(results.get(timeout=90) for _ in procs)
        for proc in procs:
            proc.join(10)
        hits = site_a.hits_for("/ok") + site_b.hits_for("/ok")
        assert site_a.violations == [] and site_b.violations == []  # the site never had to say 429
        assert all(h.status == 200 for h in hits)
        per_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
        for h in hits:
            per_pair[(h.ip, h.site)].append(h.at)
        for pair, times in per_pair.items():
            assert window_violations(times, n, w) == [], pair
        # The limit was actually exercised: every pair went past one window's worth of requests.
        assert len(per_pair) == 12 and min(len(t) for t in per_pair.values()) > n
        assert done == len(hits)
    finally:
        farm.stop()
        site_a.stop()
        site_b.stop()


def test_dead_proxy_is_banned_until_ban_expires_and_a_check_passes(redis_url: str, r: redis.Redis) -> None:
    """(c) A dead proxy gets banned; it is not handed out again before its ban ran out AND a check passed."""
    site = TestSite("a").start()
    farm = ProxyFarm(3, first=40).start()
    dead = farm.proxies[0]
    dead.alive = False
    try:
        # A health check is configured (CELERY_HA_PROXY_CHECK_URL): a ban then ends only by a check.
        pool = pool_for(redis_url, rate=(1, 30.0), max_fails=1, ban_base=0.6, ban_cap=5.0,
                        unban_by_time=False)
        pool.add_many(farm.urls)
        dead_id = f"127.0.0.1:{dead.port}"
        fetcher = Fetcher(pool, obey_robots=False, backoff_base=0.0, max_wait=0.3)
        outcomes = []
        for path in ("/ok?x=1", "/ok?x=2", "/ok?x=3"):  # rate 1/30 s: by the 3rd fetch the dead one was tried
            try:
                outcomes.append(fetcher.fetch(site.url(path)).fetch_info.outcomes)
            except FetchError as exc:
                outcomes.append(exc.outcome)
        assert sum(o.count("transport") for o in outcomes) == 1, outcomes
        assert r.hget(P + "m:" + dead_id, "state") == "tban"
        assert r.zscore(P + "tb", dead_id) is not None and r.zscore(P + "av", dead_id) is None
        assert r.hget(P + "m:" + dead_id, "n_tr") == "1"
        assert dead.exit_ip not in {h.ip for h in site.hits}

        pool.set_domain_rate("probe.example", "100000/1")

        def handed_out() -> set[str]:
            """Borrow until the pool says no: every proxy it is willing to hand out right now."""
            leases = []
            try:
                while True:
                    leases.append(pool.acquire("probe.example"))
            except NoProxyAvailable:
                pass
            for lease in leases:
                pool.release(lease, outcome="unused")
            return {lease.proxy_id for lease in leases}

        assert handed_out() == {f"127.0.0.1:{p.port}" for p in farm.proxies[1:]}
        ban_until = r.zscore(P + "tb", dead_id)
        wait_until(lambda: redis_ms(r) > ban_until + 5, 5, what="ban expiry")
        assert dead_id not in handed_out()  # ban over, but no health check yet
        report = check_proxies(pool, site.url("/ok?health=1"), concurrency=2, timeout=1.0)
        assert report.demoted == {dead_id: "tban"}  # still dead: banned again, longer
        second = r.zscore(P + "tb", dead_id)
        assert r.hget(P + "m:" + dead_id, "tbans") == "2" and second > ban_until
        assert dead_id not in handed_out()

        dead.alive = True
        wait_until(lambda: redis_ms(r) > second + 5, 5, what="second ban expiry")
        report = check_proxies(pool, site.url("/ok?health=2"), concurrency=2, timeout=2.0)
        assert report.restored == [dead_id]
        assert r.hget(P + "m:" + dead_id, "state") == "avail" and r.zscore(P + "tb", dead_id) is None
        assert dead.exit_ip in {h.ip for h in site.hits_for("/ok")}  # the passing check reached the site
        wait_until(lambda: dead_id in handed_out(), 2, what="restored proxy handed out")
    finally:
        farm.stop()
        site.stop()


def test_sigkilled_borrower_does_not_hold_its_lock_beyond_the_ttl(redis_url: str, r: redis.Redis) -> None:
    """(e) A borrower killed with SIGKILL: its lock frees at the TTL; the reaper empties the in-use zone."""
    pool = pool_for(redis_url, rate=(100, 1.0))
    pid = pool.add("http://127.0.0.2:8001")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=borrow_and_hang, args=(redis_url, "default", "a.example", 1.5, child))
    proc.start()
    try:
        assert parent.poll(30), "borrower did not report"
        got_pid, token, _ = parent.recv()
        assert got_pid == pid and r.get(P + f"lk:{pid}|a.example") == token
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        killed_at = time.monotonic()
        ttl_left = r.pttl(P + f"lk:{pid}|a.example") / 1000.0
        assert 0 < ttl_left <= 1.5
        with pytest.raises(NoProxyAvailable):
            pool.acquire("a.example")

        def borrowed() -> object:
            try:
                return pool.acquire("a.example", worker="survivor")
            except NoProxyAvailable:
                return None

        lease = wait_until(borrowed, 5, what="lock expiry")
        waited = time.monotonic() - killed_at
        assert waited <= ttl_left + 0.75  # freed at the TTL (plus polling slack on a busy machine)
        assert lease.proxy_id == pid
        members = r.zrange(P + "iu", 0, -1)
        assert all(token not in m for m in members)  # the dead borrower's lease was reaped
        assert r.hget(P + "m:" + pid, "n_abandoned") == "1" and pool.stats()["reaped"] == 1
        pool.release(lease, ok=True, status=200)
    finally:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(5)
