"""The HTTP side of ``celery-ha web``: the standard library's threading server, no framework.

Routes: ``/metrics`` (Prometheus text, or OpenMetrics when asked), ``/`` and ``/static/*`` (the
dashboard; every asset ships in the package, nothing is fetched from the internet), ``/api/stats``,
``/api/dashboard``, ``/api/session``, ``/healthz``; POST ``/api/dead/redrive`` and
``/api/proxies/unban`` only when the server has credentials. A server of several namespaces puts all
of them in one ``/metrics`` (the namespace label tells them apart); every other route takes
``?namespace=NAME`` (default: the first served).

Every request reads Redis afresh, so the process keeps no state and any number can run side by side.
With credentials every route needs them. Every request's ``Host`` must name this server (a loopback
name, the bound address, an IP literal when bound beyond loopback, or a name given with
``allowed_hosts``), so a web page cannot reach it through DNS rebinding. The HTTP layer is bounded:
an idle socket times out, and so does a request not received whole within a deadline, the
connections served at once are capped (extra ones are closed), a request body is read whole or the
connection is closed (so it is never taken for a second request), and every error, the standard
library's own included, is a small JSON document with the security headers.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from celery_ha.base.masking import mask_url
from celery_ha.monitoring.actions import ACTIONS, MAX_BODY, ActionError, parse_body
from celery_ha.monitoring.auth import BasicAuth
from celery_ha.monitoring.collector import Source, StateCollector
from celery_ha.monitoring.dashboard import Reader, dashboard, stats_snapshot

log = logging.getLogger(__name__)

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}


#: Seconds a connection may stay silent (between requests, or within one) before it is closed.
SOCKET_TIMEOUT = 20.0
#: Connections served at once; one more is answered 503 and closed (each holds a thread).
MAX_CONNECTIONS = 64
#: Seconds for one whole request (line, headers, body; kept alive: from the previous response's end).
REQUEST_DEADLINE = 30.0


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``text`` spells as a literal (IPv4-mapped IPv6 as its IPv4), else None."""
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def is_loopback(host: str) -> bool:
    """Whether a host name or address literal is loopback ("localhost", 127.x, ::1, ::ffff:127.x)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def bind_address(host: str, port: int = 0) -> tuple[int, tuple[Any, ...]]:
    """The address family and socket address ``host`` binds to, resolved as bind() would resolve it.

    Decisions (is this loopback?) are made on this resolved address, never on the text: ``127.1``,
    ``0x7f000001`` and ``::ffff:127.0.0.1`` are loopback, ``""``, ``0.0.0.0`` and ``::`` are not.
    An unresolvable host raises OSError (socket.gaierror)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    infos = socket.getaddrinfo(host.strip("[]") or None, port, family, socket.SOCK_STREAM, 0,
                               socket.AI_PASSIVE | socket.AI_NUMERICSERV)
    return family, infos[0][4]


def host_name(header: str | None) -> str:
    """The host of a ``Host`` header, lowercased, without port or trailing dot ("" if unreadable)."""
    header = (header or "").strip()
    if not header or any(c in header for c in "@/\\?# \t"):  # never in a browser's Host: refused
        return ""
    try:
        return (urlsplit("//" + header).hostname or "").rstrip(".")
    except ValueError:
        return ""


class WebApp:
    """What every request needs: the readers (one per namespace served, the first the default), the
    metrics registry (every namespace in one scrape), the credentials.

    ``grow`` (a server of namespace patterns) is asked, at most every ``grow_every`` seconds and at a
    request, for the readers and sources of namespaces it did not serve yet (given the served ones):
    a crawl that starts while the server runs appears in /metrics and the dashboard."""

    def __init__(self, readers: Reader | Sequence[Reader], sources: Source | Sequence[Source],
                 auth: BasicAuth | None, allowed_hosts: Sequence[str] = (),
                 grow: Callable[[set[str]], list[tuple[Reader, Source]]] | None = None,
                 grow_every: float = 10.0) -> None:
        listed = [readers] if isinstance(readers, Reader) else list(readers)
        self.readers = {reader.namespace: reader for reader in listed}
        self.auth = auth
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = StateCollector(sources)
        self.registry.register(self.collector)
        # Host names (besides loopback ones and address literals) a request may name: a deployment's
        # DNS name or a compose service name.
        self.allowed_hosts = frozenset(h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip())
        self._grow = grow
        self._grow_every = grow_every
        self._grown_at = float("-inf")
        self._grow_lock = threading.Lock()

    def refresh(self) -> None:
        """Serve the namespaces ``grow`` finds (rate-limited; a failed look is logged and retried)."""
        if self._grow is None or time.monotonic() - self._grown_at < self._grow_every:
            return
        with self._grow_lock:
            if time.monotonic() - self._grown_at < self._grow_every:
                return
            self._grown_at = time.monotonic()
            try:
                added = self._grow(set(self.readers))
            except redis.RedisError as exc:
                log.warning("could not look for new namespaces: %s", mask_url(str(exc)))
                return
            if added:  # copies, swapped in whole: other request threads iterate them meanwhile
                self.readers = {**self.readers, **{reader.namespace: reader for reader, _ in added}}
                self.collector.sources = [*self.collector.sources, *(source for _, source in added)]

    @property
    def reader(self) -> Reader:
        """The default namespace's reader (the first served)."""
        return next(iter(self.readers.values()))

    def served(self) -> dict[str, list[str]]:
        """``{"namespaces": [...]}`` for a server of several namespaces (documents of one stay as
        they were)."""
        return {"namespaces": list(self.readers)} if len(self.readers) > 1 else {}

    def reader_for(self, query: str) -> Reader | None:
        """The reader a request's ``?namespace=`` names (the default without one); None: not served."""
        self.refresh()
        names = parse_qs(query).get("namespace")
        return self.reader if not names else self.readers.get(names[-1])

    def static(self, name: str) -> bytes:
        return (resources.files("celery_ha.monitoring") / "static" / name).read_bytes()


class _DeadlineReader(socket.SocketIO):
    """Reads that raise TimeoutError (ending the connection) past ``deadline``, however fast each one is."""
    deadline = float("inf")  # a time.monotonic() value, set at each request

    def readinto(self, buffer: Any) -> int | None:
        if (left := self.deadline - time.monotonic()) <= 0:
            raise TimeoutError("the request was not received within its deadline")
        self._sock.settimeout(min(per_read := self._sock.gettimeout(), left))  # per_read: socket_timeout
        try:
            return super().readinto(buffer)
        finally:
            self._sock.settimeout(per_read)  # the response is written with the per-read timeout


class Handler(BaseHTTPRequestHandler):
    server_version = "celery-ha-web"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # A silent socket is closed after this long: a client that opens connections and sends nothing
    # (or half a request) cannot hold threads and descriptors for ever.
    timeout = SOCKET_TIMEOUT
    _body_pending = False

    @property
    def app(self) -> WebApp:
        return self.server.app  # type: ignore[attr-defined]

    def setup(self) -> None:
        self.timeout = self.server.socket_timeout  # type: ignore[attr-defined]
        super().setup()
        self.rfile.close()  # the plain reader (the socket stays open), replaced by one with a deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, "rb"))

    def handle_one_request(self) -> None:
        """Each request, and on a kept-alive connection the wait for it, is due within the deadline."""
        self.rfile.raw.deadline = time.monotonic() + self.server.request_deadline  # type: ignore[attr-defined]
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), mask_url(format % args))

    # ------------------------------------------------------------------ responses
    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        if self._body_pending:
            # The request's body was not read (a refused request, one too large): what follows on
            # this connection is not a request, so the connection ends with this response.
            self.close_connection = True
        self.send_response(status)
        for name, value in {**SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc, separators=(",", ":")).encode(), "application/json",
                   {"Cache-Control": "no-store"})

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": mask_url(message)})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (unsupported method, malformed request line or headers) as
        JSON with the security headers, instead of its HTML page; the connection ends with it."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unreadable request line: still a status and headers
            self.request_version = "HTTP/1.1"
        text = message or self.responses.get(code, ("error",))[0]
        with contextlib.suppress(OSError):
            self._error(code, text[:200])

    # ------------------------------------------------------------------ checks
    def _host_ok(self) -> bool:
        """The ``Host`` names this server: a loopback name, the bound address, an allowed name, or
        (bound beyond loopback) any address literal. A DNS-rebinding page sends its own name."""
        host = host_name(self.headers.get("Host"))
        if not host:
            return False
        if is_loopback(host) or host in self.app.allowed_hosts:
            return True
        ip = _ip(host)
        server: WebServer = self.server  # type: ignore[assignment]
        return ip is not None and not server.loopback and not ip.is_unspecified and not ip.is_multicast

    def _authorized(self) -> bool:
        auth = self.app.auth
        if auth is None or auth.check(self.headers.get("Authorization")):
            return True
        self._send(401, b'{"error":"authentication required"}', "application/json",
                   {"WWW-Authenticate": 'Basic realm="celery-ha", charset="UTF-8"'})
        return False

    def _same_origin(self) -> bool:
        origin = self.headers.get("Origin")
        return origin is None or urlsplit(origin).netloc == (self.headers.get("Host") or "")

    def _body_length(self) -> int | None:
        """The announced body length; None (after answering 400/501) for a framing this server does
        not read: chunked or any Transfer-Encoding, several or malformed Content-Lengths."""
        lengths = [v.strip() for v in self.headers.get_all("Content-Length") or []]
        if self.headers.get("Transfer-Encoding") is not None:
            self._body_pending = True
            self._error(501, "Transfer-Encoding is not supported: send a Content-Length")
            return None
        if len(lengths) > 1 or (lengths and not (lengths[0].isascii() and lengths[0].isdigit())):
            self._body_pending = True
            self._error(400, "bad Content-Length")
            return None
        length = int(lengths[0]) if lengths else 0
        self._body_pending = length > 0
        return length

    # ------------------------------------------------------------------ routing
    def _handle(self, route: Callable[[], None]) -> None:
        """Every request: framing, Host and auth checks, then ``route``; no exception escapes (a
        failure is one JSON 500 and one log line, never a traceback for the client)."""
        self._body_pending = False
        if self._body_length() is None:
            return
        if not self._host_ok():
            return self._error(421, "this server does not answer that Host name (see --allowed-hosts)")
        if not self._authorized():
            return None
        try:
            route()
        except redis.RedisError as exc:
            self._error(503, f"Redis unavailable: {exc}")
        except TimeoutError:
            self.close_connection = True  # the body stopped coming or missed the deadline: nobody to answer
        except Exception:
            log.exception("%s %s failed", self.command, mask_url(urlsplit(self.path).path))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._error(500, "internal error (see the server's log)")

    def do_GET(self) -> None:
        self._handle(self._get)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self._handle(self._post)

    def _get(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        reader = self.app.reader_for(url.query)
        if reader is None:
            return self._error(404, "this server does not serve that namespace (see /healthz)")
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            return self._send(200, encoder(self.app.registry), content_type, {"Cache-Control": "no-store"})
        if path == "/healthz":
            reader.client.ping()
            return self._json(200, {"ok": True, "namespace": reader.namespace, **self.app.served()})
        if path == "/api/stats":
            return self._json(200, stats_snapshot(reader))
        if path == "/api/dashboard":
            return self._json(200, dashboard(reader))
        if path == "/api/session":
            auth = self.app.auth
            return self._json(200, {"actions": auth is not None, "user": auth.user if auth else None,
                                    "csrf": auth.csrf_token() if auth else None, **self.app.served()})
        name = "index.html" if path == "/" else path.removeprefix("/static/")
        if name in STATIC and (path == "/" or path.startswith("/static/")):
            return self._send(200, self.app.static(name), STATIC[name], {"Cache-Control": "no-cache"})
        return self._error(404, "not found")

    def _post(self) -> None:
        url = urlsplit(self.path)
        action = ACTIONS.get(url.path)
        reader = self.app.reader_for(url.query)
        if action is None or reader is None:
            return self._error(404, "not found" if action is None else
                               "this server does not serve that namespace (see /healthz)")
        auth = self.app.auth
        if auth is None:
            return self._error(403, "actions need credentials: start celery-ha web with --auth USER:PASSWORD")
        if not self._same_origin() or not auth.check_csrf(self.headers.get("X-CSRF-Token")):
            return self._error(403, "missing or wrong X-CSRF-Token (send the token of /api/session)")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._error(415, "Content-Type must be application/json")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            if length > MAX_BODY:  # refused unread: the connection closes after the answer
                raise ActionError(413, f"body larger than {MAX_BODY} bytes")
            raw = self.rfile.read(length)
            self._body_pending = len(raw) < length  # cut short: the connection is closed
            return self._json(200, action(reader, parse_body(raw)))
        except ActionError as exc:
            return self._error(exc.status, str(exc))


class WebServer(ThreadingHTTPServer):
    """The threading server, with a cap on the connections it serves at once (each holds a thread
    until its client leaves or times out): past ``max_connections`` a new one gets a 503 and is
    closed, so idle or slow clients cannot make the process start threads without end."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, app: WebApp, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                 socket_timeout: float = SOCKET_TIMEOUT, request_deadline: float = REQUEST_DEADLINE) -> None:
        self.address_family, address = bind_address(host, port)
        self.app = app
        self.socket_timeout = socket_timeout
        self.request_deadline = request_deadline
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, Handler)
        #: Whether the address actually bound is loopback (decides the Host rule and the CLI's check).
        self.loopback = is_loopback(str(self.server_address[0]))

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}"


_BUSY_BODY = b'{"error":"too many connections, try again"}'
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Retry-After: 1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS.items()).encode()
        + b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)
