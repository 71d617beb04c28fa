"""robots.txt shared by the fleet (``fetch/robots.py``, ``state/robots_store.py``) and read as RFC 9309
says: statuses, redirects, a body bounded at 512 KiB. Real sites on loopback addresses, a real Redis,
real forward proxies; what a site saw is read from its own request log.

Several :class:`Fetcher` objects stand for several worker processes here: each has its own cache,
as each pool process has its own (the real prefork run is ``test_robots_fleet.py``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.fetch.body_limit import read_at_most
from celery_ha.fetch.errors import HostNotReady
from celery_ha.fetch.fetcher import Fetcher, FetchError, RobotsDisallowed
from celery_ha.fetch.robots import LOCAL_HOLD, RobotsUnreachable
from celery_ha.fetch.robots_file import ROBOTS_MAX_BYTES, UNREACHABLE, RobotsFile
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.state import TaskQueue
from celery_ha.state.robots_store import RobotsStore
from tests.support.polling import wait_until
from tests.support.proxy_farm import ProxyFarm
from tests.support.robots_site import RobotsSite

NS = "rob"
RULES = "User-agent: *\nDisallow: /private\nCrawl-delay: 2\n"


@pytest.fixture
def site() -> Iterator[RobotsSite]:
    s = RobotsSite("127.0.0.2", robots=RULES).start()
    yield s
    s.close()


@pytest.fixture
def store(r: redis.Redis) -> RobotsStore:
    return RobotsStore(r, NS)


def fetcher(store: RobotsStore | None = None, pool: ProxyPool | None = None, **kw: object) -> Fetcher:
    """One "process": its own fetcher, obeying robots.txt, sharing ``store`` (None: per process)."""
    kw.setdefault("backoff_base", 0.001)
    if store is not None:
        kw["robots_store"] = store
    return Fetcher(pool, **kw)  # type: ignore[arg-type]


def test_processes_that_miss_at_once_fetch_robots_txt_once(site: RobotsSite, store: RobotsStore) -> None:
    """Six processes reach a site's first page together behind a slow robots.txt: one fetches it,
    under the fetch lock; the others wait for its answer in Redis and obey it."""
    site.robots_secs = 0.5
    fetchers = [fetcher(store) for _ in range(6)]
    errors: list[BaseException] = []

    def crawl(f: Fetcher, i: int) -> None:
        try:
            assert f.fetch(site.url(f"/p/{i}")).status_code == 200
            with pytest.raises(RobotsDisallowed):
                f.fetch(site.url(f"/private/{i}"))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=crawl, args=(f, i)) for i, f in enumerate(fetchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert site.robots_count() == 1, [a.path for a in site.hits()]
    assert len(site.pages()) == 6 and all(not a.path.startswith("/private") for a in site.pages())
    # One key per origin, expiring with the TTL (3600 s by default).
    key = store.key(f"http://{site.host}")
    assert 3590_000 < store.client.pttl(key) <= 3600_000


def test_the_others_wait_for_a_slow_fetch_as_long_as_its_lock_is_held(
        site: RobotsSite, store: RobotsStore) -> None:
    """A robots.txt that takes 7 s (a slow site, a loaded machine): the waiting processes do not
    fetch it too (they waited 5 s at most before, then each fetched it)."""
    site.robots_secs = 7.0
    fetchers = [fetcher(store) for _ in range(3)]
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda f=f, i=i: statuses.append(f.fetch(site.url(f"/w/{i}"))
                                                                        .status_code))
               for i, f in enumerate(fetchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert statuses == [200, 200, 200]
    assert site.robots_count() == 1, [a.path for a in site.hits()]


def test_a_frozen_fetchers_lock_lapses_and_another_process_fetches(site: RobotsSite, store: RobotsStore,
                                                                  r: redis.Redis) -> None:
    """A process SIGSTOPped while it fetches robots.txt (the lock taken, its request in flight) stops
    renewing the lock: another process fetches the file after the lock lapses (within 6 s), instead
    of waiting out a 30 s lock (a re-run elsewhere of a frozen worker's task stalled on it)."""
    site.robots_secs = 60.0  # the frozen process's request hangs
    kw = r.connection_pool.connection_kwargs
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import redis
        from celery_ha.fetch.fetcher import Fetcher
        from celery_ha.state.robots_store import RobotsStore
        client = redis.Redis(host={kw["host"]!r}, port={kw["port"]}, decode_responses=True)
        store = RobotsStore(client, {NS!r})
        Fetcher(None, robots_store=store, backoff_base=0.001).fetch({site.url("/held")!r})
        """)], cwd=str(Path(__file__).resolve().parents[2]))
    try:
        lock = store.lock_key(f"http://{site.host}")
        wait_until(lambda: r.exists(lock) and site.robots_started == 1, timeout=20,
                   what="the holder's robots.txt request to reach the site")
        os.kill(holder.pid, signal.SIGSTOP)
        site.robots_secs = 0.0
        done: list[int] = []
        other = threading.Thread(
            target=lambda: done.append(fetcher(store).fetch(site.url("/other")).status_code))
        other.start()
        other.join(20)
        assert done == [200], "the other process still waits for the frozen holder's lock"
        # One answered robots.txt request, ours (the frozen process's is still hanging, unlogged).
        assert [a.path for a in site.hits("/robots.txt")] == ["/robots.txt"]
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_fetchers_lock_is_waited_out_then_the_file_fetched_once(
        site: RobotsSite, store: RobotsStore) -> None:
    """The fetch lock of a process that died mid-fetch (left in Redis with 1.5 s to live): the next
    process waits until it expires, then fetches robots.txt itself, once."""
    origin = f"http://{site.host}"
    assert store.lock(origin, 1.5) is not None  # what a SIGKILLed holder leaves behind
    started = time.monotonic()
    assert fetcher(store).fetch(site.url("/after")).status_code == 200
    assert time.monotonic() - started >= 1.0
    assert site.robots_count() == 1


def test_the_shared_copy_expires_with_the_ttl_and_is_fetched_once_again(
        site: RobotsSite, store: RobotsStore) -> None:
    first, second = fetcher(store, robots_ttl=1.5), fetcher(store, robots_ttl=1.5)
    assert first.fetch(site.url("/a")).status_code == 200
    assert second.fetch(site.url("/b")).status_code == 200
    assert site.robots_count() == 1
    key = store.key(f"http://{site.host}")
    wait_until(lambda: not store.client.exists(key), timeout=5, what="the robots.txt key to expire")
    # Each process's own copy lived no longer than the Redis one had left.
    assert second.fetch(site.url("/c")).status_code == 200
    assert first.fetch(site.url("/d")).status_code == 200
    assert site.robots_count() == 2


def test_a_process_reads_redis_at_most_once_per_local_hold(site: RobotsSite, store: RobotsStore) -> None:
    """The parsed copy of a process serves its pages: no Redis read per request."""
    assert LOCAL_HOLD >= 30
    f = fetcher(store)
    f.fetch(site.url("/first"))
    client = store.client

    def gets() -> int:
        return int(client.info("commandstats").get("cmdstat_get", {}).get("calls", 0))

    before = gets()
    for i in range(30):
        f.fetch(site.url(f"/p/{i}"))
    assert gets() == before
    assert site.robots_count() == 1


def test_crawl_delay_reaches_the_gate_from_the_shared_copy(site: RobotsSite, store: RobotsStore,
                                                           redis_url: str) -> None:
    """A process that never fetched robots.txt itself hands its Crawl-delay to the host gate."""
    q = TaskQueue.from_url(redis_url, namespace=NS, host_gate=True)
    assert fetcher(store).fetch(site.url("/a")).status_code == 200  # no gate: nothing stored
    assert not q.hosts.get(site.host).crawl_delay
    assert fetcher(store).fetch(site.url("/b"), gate=q.hosts).status_code == 200
    assert q.hosts.get(site.host).crawl_delay == 2.0
    assert site.robots_count() == 1


def test_a_5xx_robots_txt_holds_the_pages_back_and_is_asked_again_after_a_short_hold(
        site: RobotsSite, store: RobotsStore, redis_url: str) -> None:
    """RFC 9309 §2.3.1.4: unreachable (5xx) means disallow, for now. No page is fetched; the task's
    error is retryable; the answer is held fleet-wide min(60 s, TTL), then robots.txt is asked again."""
    site.robots_status = 500
    ttl = 2.0
    with pytest.raises(RobotsUnreachable) as info:
        fetcher(store, robots_ttl=ttl, direct_tries=2).fetch(site.url("/a"))
    exc = info.value
    assert isinstance(exc, FetchError) and not exc.permanent and 0 < exc.retry_after <= ttl
    assert site.robots_count() == 2 and site.pages() == []  # the page's tries, then the answer held
    origin = f"http://{site.host}"
    stored = RobotsFile.decode(store.read(origin)[0])  # type: ignore[index]
    assert stored is not None and stored.verdict == UNREACHABLE and stored.status == 500
    with pytest.raises(RobotsUnreachable):  # another process: the held answer, no request
        fetcher(store, robots_ttl=ttl).fetch(site.url("/b"))
    # A gated task hands its host back to the gate, uncounted, for what the answer is held.
    q = TaskQueue.from_url(redis_url, namespace=NS, host_gate=True)
    with pytest.raises(HostNotReady) as held:
        fetcher(store, robots_ttl=ttl).fetch(site.url("/c"), gate=q.hosts)
    assert 0 < held.value.retry_after <= ttl and held.value.host == site.host
    assert site.robots_count() == 2 and site.pages() == []
    site.robots_status = 200
    wait_until(lambda: store.read(origin) is None, timeout=5, what="the unreachable answer to expire")
    assert fetcher(store, robots_ttl=ttl).fetch(site.url("/d")).status_code == 200
    assert site.robots_count() == 3 and [a.path for a in site.pages()] == ["/d"]


def test_a_5xx_robots_txt_is_held_per_process_without_redis(site: RobotsSite) -> None:
    """A plain fetcher (no store) reads the statuses the same way, in its own cache."""
    site.robots_status = 503
    f = fetcher(None, robots_ttl=60, direct_tries=2)
    for path in ("/a", "/b"):
        with pytest.raises(RobotsUnreachable):
            f.fetch(site.url(path))
    assert site.robots_count() == 2 and site.pages() == []  # the second page asked nothing


def test_no_answer_at_all_is_unreachable(store: RobotsStore) -> None:
    gone = RobotsSite("127.0.0.3").start()
    url = gone.url("/a")
    gone.close()  # nothing listens there any more: every try fails in transport
    with pytest.raises(RobotsUnreachable) as info:
        fetcher(store, direct_tries=2).fetch(url)
    assert info.value.status is None and not info.value.permanent


@pytest.mark.parametrize(("status", "allowed"), [(401, False), (403, False), (404, True), (410, True),
                                                 (418, True), (400, True)])
def test_a_4xx_robots_txt(site: RobotsSite, store: RobotsStore, status: int, allowed: bool) -> None:
    """401/403 forbid everything; any other 4xx means no rules (RFC 9309 §2.3.1.3)."""
    site.robots_status = status
    for f in (fetcher(store), fetcher(None)):
        if allowed:
            assert f.fetch(site.url("/private/x")).status_code == 200
        else:
            with pytest.raises(RobotsDisallowed):
                f.fetch(site.url("/ok"))
    assert site.robots_count() == 2  # one for the fleet, one for the plain fetcher


@pytest.mark.parametrize(("hops", "obeyed"), [(1, True), (5, True), (6, False)])
def test_redirects_are_followed_up_to_five_hops(site: RobotsSite, hops: int, obeyed: bool) -> None:
    """RFC 9309 §2.3.1.2: at least five redirects followed; past that the file counts as absent."""
    real = RobotsSite("127.0.0.3", robots="User-agent: *\nDisallow: /private\n").start()
    site.robots = None
    # /robots.txt -> /moved/1 -> ... (relative Locations) -> the other host's file (absolute: robots.txt
    # may redirect across hosts), ``hops`` redirects in all
    paths = ["/robots.txt", *(f"/moved/{i}" for i in range(1, hops))]
    site.redirects = dict(zip(paths, [*paths[1:], real.url("/robots.txt")], strict=True))
    try:
        f = fetcher(None)
        if obeyed:
            with pytest.raises(RobotsDisallowed):
                f.fetch(site.url("/private/x"))
            assert real.robots_count() == 1
        else:
            assert f.fetch(site.url("/private/x")).status_code == 200
            assert real.robots_count() == 0
        assert len(site.hits()) == hops + (0 if obeyed else 1)  # the hops, then the page if allowed
    finally:
        real.close()


@pytest.mark.parametrize("via", ["direct", "proxy"])
def test_an_oversized_robots_txt_is_read_bounded(
        site: RobotsSite, store: RobotsStore, redis_url: str, via: str) -> None:
    """A 2 MB robots.txt: 512 KiB are read and parsed, its first rules apply, a rule past the bound
    does not, the fleet's copy stays under the bound, and the cut connection serves nothing after."""
    filler = "".join(f"# filler line {i:07d} of an oversized robots.txt\n" for i in range(45_000))
    site.robots = "User-agent: *\nDisallow: /early\n" + filler + "Disallow: /late\n"
    assert len(site.robots) > 2_000_000
    farm = ProxyFarm(1, first=110).start() if via == "proxy" else None
    try:
        pool = None
        if farm is not None:
            pool = ProxyPool(redis.Redis.from_url(redis_url, decode_responses=True), NS,
                             PoolConfig(rate=(1000, 1.0)))
            pool.add_many(farm.urls)
        f = fetcher(store, pool)
        with pytest.raises(RobotsDisallowed):
            f.fetch(site.url("/early/x"))
        page = f.fetch(site.url("/late/x"))  # the same session, maybe the same connection
        assert page.status_code == 200 and "page /late/x" in page.text
        stored = store.read(f"http://{site.host}")
        assert stored is not None and len(stored[0]) < ROBOTS_MAX_BYTES + 100
        robots = RobotsFile.decode(stored[0])
        assert robots is not None and "Disallow: /early" in robots.text and "/late" not in robots.text
        assert len(robots.text.encode()) <= ROBOTS_MAX_BYTES and robots.text.endswith("\n")
    finally:
        if farm is not None:
            farm.stop()


def test_read_at_most_stops_at_the_limit_and_drops_the_cut_connection(site: RobotsSite) -> None:
    site.robots = "x" * 2_000_000
    session = requests.Session()
    big = session.get(site.url("/robots.txt"), stream=True, timeout=5)
    assert read_at_most(big, 1000) is True and big.content == b"x" * 1000
    assert session.get(site.url("/next"), timeout=5).text.endswith("page /next</html>")  # its own answer
    small = session.get(site.url("/small"), stream=True, timeout=5)
    assert read_at_most(small, 1000, time.monotonic() + 5) is False and b"page /small" in small.content
    session.close()


def test_memory_of_a_typical_robots_txt(store: RobotsStore) -> None:
    """MEMORY USAGE of one origin's key for a typical 2 KB robots.txt (stored zlib + base64)."""
    text = typical_robots_txt()
    assert 1900 < len(text) < 2100
    store.write("https://shop.example", RobotsFile("rules", 200, time.time(), text).encode(), 3600)
    used = store.client.memory_usage(store.key("https://shop.example"))
    assert used is not None and used < 1200, used  # zlib + base64: well under the text's own size


def typical_robots_txt(size: int = 2048) -> str:
    """A shop's robots.txt of about ``size`` bytes: a few agents' groups of Disallow/Allow paths
    made of the usual words, a Crawl-delay and Sitemap lines (seeded: the same text every run)."""
    rnd = random.Random(7)
    words = ["search", "cart", "checkout", "account", "login", "admin", "api", "tmp", "print", "compare",
             "wishlist", "filter", "sort", "session", "private", "internal", "cgi-bin", "static", "review"]
    lines = ["# robots.txt for www.example-shop.com", "User-agent: *"]
    while sum(len(line) + 1 for line in lines) < size - 200:
        path = "/" + "/".join(rnd.choice(words) for _ in range(rnd.randint(1, 3)))
        lines.append(rnd.choice(["Disallow: ", "Disallow: ", "Allow: "]) + path
                     + rnd.choice(["", "/", "?*", "*.json$"]))
        if rnd.random() < 0.05:
            lines += ["", f"User-agent: {rnd.choice(['Googlebot', 'Bingbot', 'AhrefsBot', 'GPTBot'])}"]
    lines += ["Crawl-delay: 2", "Sitemap: https://www.example-shop.com/sitemap.xml",
              "Sitemap: https://www.example-shop.com/sitemap-products.xml"]
    return "\n".join(lines) + "\n"


def test_the_store_works_on_a_cluster(cluster_url: str) -> None:
    """Every key of a namespace's robots.txt store sits in the namespace's slot (its hash tag)."""
    from celery_ha.redisio.client import redis_client

    client = redis_client(cluster_url)
    shared = RobotsStore(client, "shop")
    token = shared.lock("https://a.example", 5)
    assert token is not None and shared.lock("https://a.example", 5) is None
    shared.write("https://a.example", "R1 allow 404 1 t\n", 5)
    got = shared.read("https://a.example")
    assert got is not None and got[0].startswith("R1 allow") and 0 < got[1] <= 5
    shared.unlock("https://a.example", token)
    assert shared.lock("https://a.example", 5) is not None
    slot = client.keyslot("cha:{shop}:x")
    assert client.keyslot(shared.key("https://a.example")) == slot == client.keyslot(
        shared.lock_key("https://a.example"))


def test_the_ttl_setting_is_bounded_by_a_day() -> None:
    """CELERY_HA_ROBOTS_TTL: RFC 9309 §2.4 says a cached robots.txt SHOULD NOT be used past 24 h."""
    assert Settings().robots_ttl == 3600.0
    assert Settings.from_env({"CELERY_HA_ROBOTS_TTL": "600"}).robots_ttl == 600.0
    with pytest.raises(ConfigurationError, match="CELERY_HA_ROBOTS_TTL"):
        Settings.from_env({"CELERY_HA_ROBOTS_TTL": "90000"})
