"""A farm of small forward proxies on loopback, each leaving from its own 127.0.0.x address.

The demo needs many "IPs" without a network: on Linux the whole 127.0.0.0/8 block is local, so a
proxy that binds its *upstream* socket to 127.0.0.N makes the target site see client IP 127.0.0.N.
The site's per-IP rate limit then behaves as it would against real proxies.

This is the one implementation, used by the demo and by the tests (``tests/proxy_farm.py`` imports it):

* :class:`ForwardProxy` is a threaded plain-HTTP forward proxy (absolute-URI requests) that streams a
  body of known length as it arrives. It can require
  Basic ``Proxy-Authorization`` and act as a rotating tunnel with sticky sessions, add a random delay
  per hop, or play dead.
* :class:`ProxyFarm` is ``n`` such proxies, proxy i leaving from 127.0.0.(first + i).

Everything listens on, and leaves from, 127.0.0.x only.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import random
import re
import select
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar
from urllib.parse import urlsplit

HOP_HEADERS = frozenset({"connection", "proxy-connection", "proxy-authorization", "keep-alive",
                         "transfer-encoding", "te", "trailer", "upgrade"})

_S = TypeVar("_S", bound="LoopbackServer")


def _loopback(ip: str) -> str:
    """The guard: only 127.0.0.x addresses, so nothing here ever touches a real network."""
    if not ip.startswith("127.0.0."):
        raise ValueError(f"the proxy farm only uses 127.0.0.x addresses, not {ip!r}")
    return ip


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        """Stay quiet: clients killed mid-request (the demo's chaos), clients that gave up (timeout
        tests) and stopped upstreams are all expected here."""


class LoopbackServer:
    """An HTTP server on a 127.0.0.x address, served by a daemon thread: ``start()`` / ``stop()``."""

    def _serve(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1",
               name: str | None = None) -> None:
        self.host = _loopback(host)
        self.server = QuietServer((host, 0), handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name=name, daemon=True)

    def start(self: _S) -> _S:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ForwardProxy(LoopbackServer):
    """A plain-HTTP forward proxy on 127.0.0.1 whose upstream connections leave from ``exit_ips``.

    ``exit_ips`` is one 127.0.0.x address or a list of them. ``auth=(user_pattern, password)``: require
    Basic Proxy-Authorization; ``user_pattern`` is a regex whose optional group ``session`` selects a
    sticky exit (crc32(session) % len(exit_ips)). Without a session the exits rotate per request (a
    tunnel). ``delay=(lo, hi)`` sleeps uniformly in [lo, hi] seconds per hop. ``alive=False`` drops every
    connection without answering (a dead proxy).
    """

    upstream_timeout = 15.0

    def __init__(
        self,
        exit_ips: str | Sequence[str],
        auth: tuple[str, str] | None = None,
        delay: tuple[float, float] = (0.0, 0.0),
        host: str = "127.0.0.1",
    ) -> None:
        exits = [exit_ips] if isinstance(exit_ips, str) else list(exit_ips)
        if not exits:
            raise ValueError("a forward proxy needs at least one exit address")
        self.exit_ips = [_loopback(ip) for ip in exits]
        self.auth = auth
        self.delay = delay
        self.alive = True
        self.requests = 0  # every request answered (including 407s)
        self.auth_failures = 0
        self.errors = 0  # upstream failures (answered 502)
        self._rotation = itertools.cycle(range(len(self.exit_ips)))
        self._lock = threading.Lock()
        self._serve(self._handler(), host, name=f"proxy-{self.exit_ips[0]}")

    def url(self, user: str = "", password: str = "") -> str:
        creds = f"{user}:{password}@" if user else ""
        return f"http://{creds}{self.host}:{self.port}"

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def exit_ip(self) -> str:
        return self.exit_ips[0]

    def sticky_ip(self, session: str) -> str:
        return self.exit_ips[zlib.crc32(session.encode()) % len(self.exit_ips)]

    def _choose_exit(self, session: str | None) -> str:
        if session:
            return self.sticky_ip(session)
        with self._lock:
            return self.exit_ips[next(self._rotation)]

    def _check_auth(self, header: str) -> tuple[str | None, bool]:
        """(session or None, authorized?) for a Proxy-Authorization header value."""
        if self.auth is None:
            return None, True
        if not header.startswith("Basic "):
            return None, False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None, False
        pattern, expected = self.auth
        m = re.fullmatch(pattern, user)
        if not m or password != expected:
            return None, False
        return m.groupdict().get("session"), True

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if not proxy.alive:
                    self.close_connection = True
                    self.connection.close()
                    return
                with proxy._lock:
                    proxy.requests += 1
                session, ok = proxy._check_auth(self.headers.get("Proxy-Authorization", ""))
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
                exit_ip = _loopback(proxy._choose_exit(session))
                conn = http.client.HTTPConnection(target.hostname, target.port or 80,
                                                  timeout=proxy.upstream_timeout, source_address=(exit_ip, 0))
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    headers["Connection"] = "close"
                    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
                    conn.request("GET", path, headers=headers)
                    upstream = conn.getresponse()
                    length = upstream.getheader("Content-Length")
                    body = None if length is not None and length.isdigit() else upstream.read()
                except OSError:
                    conn.close()
                    with proxy._lock:
                        proxy.errors += 1
                    self.send_error(502, "upstream failed")
                    return
                try:
                    self.send_response(upstream.status)
                    for k, v in upstream.getheaders():
                        if k.lower() not in HOP_HEADERS and k.lower() != "content-length":
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body) if body is not None else length))
                    self.end_headers()
                    if body is not None:
                        self.wfile.write(body)
                    else:
                        self._relay(upstream)
                finally:
                    conn.close()

            def _relay(self, upstream: http.client.HTTPResponse) -> None:
                """Stream a body of known length as it arrives, as real proxies do; a client that
                went away ends the upstream download too (the connection is closed)."""
                while not client_gone(self.connection):
                    try:
                        chunk = upstream.read1(65536)
                        if not chunk:
                            return
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:
                        return

        return Handler


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` closed or shut down its side (an EOF waits to be read), without
    reading anything it sent."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class ProxyFarm:
    """``n`` forward proxies, proxy i leaving from 127.0.0.(first + i).

    ``auth=(user, password)`` is a literal user name (escaped into the proxies' user pattern); the farm's
    :attr:`urls` then carry the credentials. ``delay`` is passed to every proxy.
    """

    def __init__(self, n: int, first: int = 2, auth: tuple[str, str] | None = None,
                 delay: tuple[float, float] = (0.0, 0.0)) -> None:
        if n < 1 or first < 1 or first + n - 1 > 254:
            raise ValueError("the farm fits 127.0.0.1-127.0.0.254")
        self.auth = auth
        pattern = (re.escape(auth[0]), auth[1]) if auth else None
        self.proxies = [ForwardProxy(f"127.0.0.{first + i}", auth=pattern, delay=delay) for i in range(n)]

    def start(self) -> ProxyFarm:
        for p in self.proxies:
            p.start()
        return self

    def stop(self) -> None:
        for p in self.proxies:
            p.stop()

    @property
    def urls(self) -> list[str]:
        return [p.url(*(self.auth or ())) for p in self.proxies]

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.proxies)

    def by_id(self, proxy_id: str) -> ForwardProxy:
        """The proxy behind a pool id ("127.0.0.1:port", optionally "~session")."""
        port = int(proxy_id.split("~")[0].rsplit(":", 1)[1])
        return next(p for p in self.proxies if p.port == port)

    def ip_of(self, proxy_id: str) -> str:
        return self.by_id(proxy_id).exit_ip
