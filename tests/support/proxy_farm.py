"""Real servers on loopback for the proxy tests: a target site, an API stand-in, spawned workers.

* :class:`TestSite` logs every request's client IP and arrival time, enforces its own per-IP limit
  (answering 429 and recording a violation), tracks in-flight requests per IP and per IP × site, and serves
  a few behaviours (``/ok?delay=ms``, ``/trickle?bytes=N&every=ms``, ``/status/<code>``, ``/captcha``,
  ``/robots.txt``; IPs in ``blocked_ips`` get 403, IPs in ``failing_ips`` get 503).
* :class:`ForwardProxy` and :class:`ProxyFarm` are the product's (``celery_ha.demo.proxy_farm``), re-exported
  here: proxies whose upstream connections leave from their own 127.0.0.N source address, so the site sees
  one client IP per proxy.

Everything binds to 127.0.0.x only.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

from celery_ha.demo.proxy_farm import ForwardProxy, LoopbackServer, ProxyFarm, client_gone
from tests.support.polling import wait_until

__all__ = [
    "ApiEndpoint",
    "Ended",
    "ForwardProxy",
    "Hit",
    "ProxyFarm",
    "TestSite",
    "Tracker",
    "borrow_and_hang",
    "crawl_worker",
    "started",
    "wait_until",
    "window_violations",
]

_S = TypeVar("_S", bound="LoopbackServer | ProxyFarm")


def started(server: _S) -> Iterator[_S]:
    """The body of a fixture: start ``server``, yield it, stop it (``yield from started(...)``)."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Hit:
    site: str
    ip: str
    at: float  # time.time() at arrival
    path: str
    status: int


@dataclass
class Ended:
    """A trickled answer's end: when the site stopped sending it, and how many bytes it sent."""

    ip: str
    at: float  # time.time() at arrival
    ended: float  # time.time() when the last byte went or the client was seen gone
    sent: int


@dataclass
class Tracker:
    """In-flight counters shared by several sites (one proxy serving two domains shows up here)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    per_pair: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    per_ip: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    max_pair: int = 0
    max_ip: int = 0

    def enter(self, ip: str, site: str) -> None:
        with self.lock:
            self.per_pair[(ip, site)] += 1
            self.per_ip[ip] += 1
            self.max_pair = max(self.max_pair, self.per_pair[(ip, site)])
            self.max_ip = max(self.max_ip, self.per_ip[ip])

    def leave(self, ip: str, site: str) -> None:
        with self.lock:
            self.per_pair[(ip, site)] -= 1
            self.per_ip[ip] -= 1


class TestSite(LoopbackServer):
    """A target site on 127.0.0.1 with a per-client-IP request log and limit."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        name: str = "site",
        limit: tuple[int, float] | None = None,
        tracker: Tracker | None = None,
        robots: str | None = None,
    ) -> None:
        self.name = name
        self.limit = limit
        self.tracker = tracker or Tracker()
        self.robots = robots
        self.blocked_ips: set[str] = set()
        self.failing_ips: set[str] = set()
        self.retry_after: str | None = None
        self.robots_status = 200  # another status answers /robots.txt with it (and retry_after)
        self.hits: list[Hit] = []
        self.violations: list[Hit] = []
        self.ended: list[Ended] = []
        self._lock = threading.Lock()
        self._recent: dict[str, list[float]] = defaultdict(list)
        self._serve(self._handler())

    @property
    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/ok") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hits_for(self, path: str | None = None) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if path is None or h.path == path]

    def _admit(self, ip: str, now: float) -> bool:
        """The site's own limit: at most n accepted requests per IP in any window of w seconds."""
        if self.limit is None:
            return True
        n, w = self.limit
        recent = [t for t in self._recent[ip] if now - t < w]
        self._recent[ip] = recent
        if len(recent) >= n:
            return False
        recent.append(now)
        return True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                now = time.time()
                ip = self.client_address[0]
                parts = urlsplit(self.path)
                path = parts.path
                if path == "/trickle":
                    self._trickle(ip, now, parse_qs(parts.query))
                    return
                with site._lock:
                    admitted = site._admit(ip, now) if path != "/robots.txt" else True
                site.tracker.enter(ip, site.name)
                try:
                    status, body, headers = self._respond(ip, path, parse_qs(parts.query), admitted)
                finally:
                    site.tracker.leave(ip, site.name)
                hit = Hit(site.name, ip, now, path, status)
                with site._lock:
                    site.hits.append(hit)
                    if not admitted:
                        site.violations.append(hit)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self, ip: str, now: float, query: dict[str, list[str]]) -> None:
                """``/trickle?bytes=N&every=ms``: a body of N bytes, one byte every ``every`` ms (each
                read of a client inside any read timeout), until it is sent or the client goes; the
                end goes to ``site.ended``."""
                size, every = int(query["bytes"][0]), float(query["every"][0]) / 1000.0
                with site._lock:
                    site.hits.append(Hit(site.name, ip, now, "/trickle", 200))
                site.tracker.enter(ip, site.name)
                sent = 0
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    self.wfile.flush()
                    while sent < size and not client_gone(self.connection):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        sent += 1
                        time.sleep(every)
                except OSError:
                    pass
                finally:
                    site.tracker.leave(ip, site.name)
                    with site._lock:
                        site.ended.append(Ended(ip, now, time.time(), sent))
                    self.close_connection = True

            def _respond(
                self, ip: str, path: str, query: dict[str, list[str]], admitted: bool
            ) -> tuple[int, bytes, dict[str, str]]:
                if path == "/robots.txt":
                    if site.robots_status != 200:  # robots.txt refused (a 429/503, with Retry-After)
                        headers = {"Retry-After": site.retry_after} if site.retry_after else {}
                        return site.robots_status, b"not now", headers
                    if site.robots is None:
                        return 404, b"no robots", {}
                    return 200, site.robots.encode(), {}
                if not admitted:
                    return 429, b"slow down", {"Retry-After": "1"}
                delay = float(query.get("delay", ["0"])[0]) / 1000.0
                if delay:
                    time.sleep(delay)  # the site being slow, on purpose
                if ip in site.blocked_ips:
                    headers = {"Retry-After": site.retry_after} if site.retry_after else {}
                    return 403, b"<html>forbidden</html>", headers
                if ip in site.failing_ips:
                    return 503, b"<html>overloaded</html>", {}
                m = re.fullmatch(r"/status/(\d{3})", path)
                if m:
                    return int(m.group(1)), b"<html>status</html>", {}
                if path == "/captcha":
                    return 200, b'<html><div class="g-recaptcha"></div></html>', {}
                return 200, f"<html>hello {ip}</html>".encode(), {}

        return Handler


def window_violations(times: list[float], n: int, w: float) -> list[tuple[float, float]]:
    """Pairs (t_i, t_{i+n}) closer than ``w``: more than n requests inside one window."""
    ts = sorted(times)
    return [(ts[i], ts[i + n]) for i in range(len(ts) - n) if ts[i + n] - ts[i] < w]


# ------------------------------------------------------------------ child processes (spawned)
def crawl_worker(
    redis_url: str,
    namespace: str,
    rate: tuple[int, float],
    urls: list[str],
    seconds: float,
    worker: str,
    barrier,
    results,
) -> None:
    """A worker process: once every worker is ready, fetch ``urls`` round-robin through the pool for
    ``seconds``; puts the number of pages fetched on ``results``."""
    from celery_ha.fetch.fetcher import Fetcher, FetchError
    from celery_ha.proxy import ProxyPool

    pool = ProxyPool.from_url(redis_url, namespace, rate=rate)
    fetcher = Fetcher(
        pool, worker=worker, obey_robots=False, max_wait=1.0, backoff_base=0.01, max_rotations=3
    )
    pool.client.ping()
    barrier.wait(60)
    until = time.monotonic() + seconds
    done = 0
    for url in itertools.cycle(urls):
        if time.monotonic() >= until:
            break
        try:
            fetcher.fetch(url)
            done += 1
        except FetchError:
            pass
    fetcher.close()
    results.put(done)


def borrow_and_hang(redis_url: str, namespace: str, domain: str, ttl: float, conn) -> None:
    """Borrow a proxy, report the lease, then block forever (the test SIGKILLs this process)."""
    from celery_ha.proxy import ProxyPool

    pool = ProxyPool.from_url(redis_url, namespace, rate=(100, 1.0))
    lease = pool.acquire(domain, worker="doomed", ttl=ttl)
    conn.send((lease.proxy_id, lease.token, time.time()))
    threading.Event().wait()


class ApiEndpoint(LoopbackServer):
    """A proxy-extraction API stand-in: serves ``payload`` with ``status``, counts calls, can be slow."""

    def __init__(self) -> None:
        self.payload: bytes = b"[]"
        self.status = 200
        self.delay = 0.0
        self.calls = 0
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                with endpoint._lock:
                    endpoint.calls += 1
                if endpoint.delay:
                    time.sleep(endpoint.delay)  # a slow API, on purpose
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(endpoint.payload)))
                self.end_headers()
                self.wfile.write(endpoint.payload)

        self._serve(Handler)

    def url(self, path: str = "/get") -> str:
        return f"http://127.0.0.1:{self.port}{path}"
