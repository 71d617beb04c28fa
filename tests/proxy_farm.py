"""Real servers on loopback for the proxy tests: a target site and a farm of forward proxies.

* :class:`TestSite` logs every request's client IP and arrival time, enforces its own per-IP limit
  (answering 429 and recording a violation), tracks in-flight requests per IP and per IP × site, and serves
  a few behaviours (``/ok?delay=ms``, ``/status/<code>``, ``/captcha``, ``/robots.txt``; IPs in
  ``blocked_ips`` get 403, IPs in ``failing_ips`` get 503).
* :class:`ForwardProxy` is a threaded plain-HTTP forward proxy (absolute-URI requests) that opens its
  upstream connection from its own 127.0.0.N source address, so the site sees one client IP per proxy.
  It can require Basic ``Proxy-Authorization`` and act as a rotating tunnel with sticky sessions.

Everything binds to 127.0.0.x only.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import random
import re
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

HOP_HEADERS = {
    "connection",
    "proxy-connection",
    "proxy-authorization",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
}


@dataclass
class Hit:
    site: str
    ip: str
    at: float  # time.time() at arrival
    path: str
    status: int


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        """Stay quiet: a client that gave up (timeout test) or a stopped upstream is expected here."""


class TestSite:
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
        self.hits: list[Hit] = []
        self.violations: list[Hit] = []
        self._lock = threading.Lock()
        self._recent: dict[str, list[float]] = defaultdict(list)
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/ok") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> TestSite:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

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

            def _respond(
                self, ip: str, path: str, query: dict[str, list[str]], admitted: bool
            ) -> tuple[int, bytes, dict[str, str]]:
                if path == "/robots.txt":
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


class ForwardProxy:
    """A plain-HTTP forward proxy on 127.0.0.1 whose upstream connections leave from ``exit_ips``.

    ``auth=(user_pattern, password)``: require Basic Proxy-Authorization; ``user_pattern`` is a regex whose
    optional group ``session`` selects a sticky exit (crc32(session) % len(exit_ips)). Without a session
    the exits rotate per request (a tunnel). ``alive=False`` drops every connection without answering.
    """

    def __init__(
        self,
        exit_ips: list[str],
        auth: tuple[str, str] | None = None,
        delay: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        assert all(ip.startswith("127.0.0.") for ip in exit_ips)
        self.exit_ips = exit_ips
        self.auth = auth
        self.delay = delay
        self.alive = True
        self.requests = 0
        self.auth_failures = 0
        self._rotation = itertools.cycle(range(len(exit_ips)))
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def url(self, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    @property
    def exit_ip(self) -> str:
        return self.exit_ips[0]

    def sticky_ip(self, session: str) -> str:
        return self.exit_ips[zlib.crc32(session.encode()) % len(self.exit_ips)]

    def start(self) -> ForwardProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _choose_exit(self, session: str | None) -> str:
        if session:
            return self.sticky_ip(session)
        with self._lock:
            return self.exit_ips[next(self._rotation)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if not proxy.alive:
                    self.close_connection = True
                    self.connection.close()
                    return
                with proxy._lock:
                    proxy.requests += 1
                session = None
                if proxy.auth is not None:
                    session, ok = self._check_auth()
                    if not ok:
                        with proxy._lock:
                            proxy.auth_failures += 1
                        self.send_response(407)
                        self.send_header("Proxy-Authenticate", 'Basic realm="farm"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                target = urlsplit(self.path)
                if target.scheme != "http" or not target.hostname:
                    self.send_error(400, "absolute http URI required")
                    return
                low, high = proxy.delay
                if high:
                    time.sleep(random.uniform(low, high))  # a slow hop, on purpose
                exit_ip = proxy._choose_exit(session)
                conn = http.client.HTTPConnection(
                    target.hostname, target.port or 80, timeout=10, source_address=(exit_ip, 0)
                )
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    headers["Connection"] = "close"
                    path = target.path or "/"
                    if target.query:
                        path += "?" + target.query
                    conn.request("GET", path, headers=headers)
                    upstream = conn.getresponse()
                    body = upstream.read()
                except OSError:
                    self.send_error(502, "upstream failed")
                    return
                finally:
                    conn.close()
                self.send_response(upstream.status)
                for k, v in upstream.getheaders():
                    if k.lower() not in HOP_HEADERS and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _check_auth(self) -> tuple[str | None, bool]:
                header = self.headers.get("Proxy-Authorization", "")
                if not header.startswith("Basic "):
                    return None, False
                try:
                    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                except ValueError:
                    return None, False
                pattern, expected = proxy.auth  # type: ignore[misc]
                m = re.fullmatch(pattern, user)
                if not m or password != expected:
                    return None, False
                return (m.groupdict().get("session") if m.groupdict() else None), True

        return Handler


class ProxyFarm:
    """``n`` forward proxies, proxy i leaving from 127.0.0.(first + i)."""

    def __init__(self, n: int, first: int = 2, delay: tuple[float, float] = (0.0, 0.0)) -> None:
        assert first + n < 255
        self.proxies = [ForwardProxy([f"127.0.0.{first + i}"], delay=delay) for i in range(n)]

    def start(self) -> ProxyFarm:
        for p in self.proxies:
            p.start()
        return self

    def stop(self) -> None:
        for p in self.proxies:
            p.stop()

    @property
    def urls(self) -> list[str]:
        return [p.url() for p in self.proxies]

    def by_id(self, proxy_id: str) -> ForwardProxy:
        port = int(proxy_id.split("~")[0].rsplit(":", 1)[1])
        return next(p for p in self.proxies if p.port == port)

    def ip_of(self, proxy_id: str) -> str:
        return self.by_id(proxy_id).exit_ip


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes (then fail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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
    from celery_ha.fetcher import Fetcher, FetchError
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


class ApiEndpoint:
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

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str = "/get") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> ApiEndpoint:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
