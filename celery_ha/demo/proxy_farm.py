"""A farm of small forward proxies on loopback, each leaving from its own 127.0.0.x address.

The demo needs many "IPs" without a network: on Linux the whole 127.0.0.0/8 block is local, so a
proxy that binds its *upstream* socket to 127.0.0.N makes the target site see client IP 127.0.0.N.
The site's per-IP rate limit then behaves as it would against real proxies. (Product copy of the
proxy engineer's ``tests/proxy_farm.py`` farm: the package must not import from tests.)
"""

from __future__ import annotations

import base64
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_HEADERS = frozenset({"connection", "proxy-connection", "proxy-authorization", "keep-alive",
                         "transfer-encoding", "te", "trailer", "upgrade"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        """Stay quiet: the demo SIGKILLs clients mid-request on purpose (connection resets)."""


class ForwardProxy:
    """A plain-HTTP forward proxy on 127.0.0.1 whose upstream connections leave from ``exit_ip``.

    With ``auth=(user, password)`` it requires Basic Proxy-Authorization (so the demo shows that
    credentials are masked everywhere). ``alive=False`` makes it drop connections (a dead proxy).
    """

    def __init__(self, exit_ip: str, auth: tuple[str, str] | None = None, host: str = "127.0.0.1") -> None:
        if not exit_ip.startswith("127."):
            raise ValueError("the demo farm only uses loopback exits")
        self.exit_ip = exit_ip
        self.auth = auth
        self.alive = True
        self.requests = 0
        self.errors = 0
        self._lock = threading.Lock()
        self.server = _Server((host, 0), self._handler())
        self.host = host
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"proxy-{exit_ip}", daemon=True)

    def url(self) -> str:
        creds = f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""
        return f"http://{creds}{self.host}:{self.port}"

    @property
    def id(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> ForwardProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _authorized(self, header: str) -> bool:
        if self.auth is None:
            return True
        if not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        return (user, password) == self.auth

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
                if not proxy._authorized(self.headers.get("Proxy-Authorization", "")):
                    self.send_response(407)
                    self.send_header("Proxy-Authenticate", 'Basic realm="demo"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with proxy._lock:
                    proxy.requests += 1
                target = urlsplit(self.path)
                if target.scheme != "http" or not target.hostname:
                    self.send_error(400, "absolute http URI required")
                    return
                conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=15,
                                                  source_address=(proxy.exit_ip, 0))
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                    headers["Connection"] = "close"
                    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
                    conn.request("GET", path, headers=headers)
                    upstream = conn.getresponse()
                    body = upstream.read()
                except OSError:
                    with proxy._lock:
                        proxy.errors += 1
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

        return Handler


class ProxyFarm:
    """``n`` forward proxies; proxy i leaves from 127.0.0.(first + i)."""

    def __init__(self, n: int, first: int = 2, auth: tuple[str, str] | None = None) -> None:
        if not 1 <= n or first + n > 254:
            raise ValueError("the farm fits 127.0.0.2-127.0.0.254")
        self.proxies = [ForwardProxy(f"127.0.0.{first + i}", auth=auth) for i in range(n)]

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

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.proxies)
