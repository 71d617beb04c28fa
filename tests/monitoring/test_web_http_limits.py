"""``celery-ha web`` at the HTTP level, with raw sockets: a body the server does not read ends the
connection (it is never run as a second request), hostile bodies are 4xx, the standard library's own
errors are JSON with the security headers, and idle, excess or trickling connections cannot pile up."""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from celery_ha.monitoring.auth import BasicAuth, basic_header
from celery_ha.monitoring.collector import Source
from celery_ha.monitoring.dashboard import Reader
from celery_ha.monitoring.server import REQUEST_DEADLINE, SOCKET_TIMEOUT, WebApp, WebServer
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue
from tests.monitoring.webproc import Web, web_process
from tests.support.cli import SECRET
from tests.support.polling import wait_until

NS = "webhttp"
AUTH = ("admin", SECRET)
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


def exchange(address: tuple[str, int], data: bytes, timeout: float = 10.0) -> tuple[list[int], bytes, bool]:
    """Send ``data`` on one connection and read until the server closes it: the statuses of every
    response seen, the raw bytes, and whether the server closed (False: it kept the connection)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks, closed = [], False
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            closed = True
        except TimeoutError:
            pass
    raw = b"".join(chunks)
    return [int(s) for s in STATUS.findall(raw)], raw, closed


def request(method: str, path: str, port: int, headers: dict[str, str] | None = None,
            body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if body and not any(k.lower() in ("content-length", "transfer-encoding") for k in headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _address(web: Web) -> tuple[str, int]:
    parts = urlsplit(web.url)
    return parts.hostname or "", parts.port or 0


@pytest.fixture
def web(redis_url: str) -> Iterator[Web]:
    with web_process(redis_url, NS, auth=AUTH) as served:
        yield served


def test_a_body_left_unread_ends_the_connection_instead_of_running_as_a_request(web: Web) -> None:
    address = _address(web)
    port = address[1]
    login = {"Authorization": basic_header(*AUTH)}
    csrf = web.get("/api/session").json()["csrf"]
    smuggled = request("GET", "/smuggled", port, {"Connection": "close"})
    plain = {"Content-Type": "application/json"}
    json_type = {**login, **plain, "X-CSRF-Token": csrf}
    redrive = "/api/dead/redrive"
    cases = {
        401: request("POST", redrive, port, plain, smuggled),
        403: request("POST", redrive, port, {**login, **plain}, smuggled),
        415: request("POST", redrive, port, {**json_type, "Content-Type": "text/plain"}, smuggled),
        404: request("POST", "/api/nope", port, json_type, smuggled),
        413: request("POST", redrive, port, json_type, b"x" * 70_000 + smuggled),
        501: request("POST", redrive, port, {**json_type, "Transfer-Encoding": "chunked"},
                     f"{len(smuggled):x}\r\n".encode() + smuggled + b"\r\n0\r\n\r\n"),
        400: request("POST", redrive, port, {**json_type, "Content-Length": "5, 5"}, smuggled),
        200: request("GET", "/healthz", port, login, smuggled),  # a GET's body is never read either
    }
    for status, data in cases.items():
        statuses, raw, closed = exchange(address, data)
        assert statuses == [status] and closed, (status, raw[:300])
        assert b"smuggled" not in raw
    # Without a body, keep-alive still serves several requests on one connection.
    two = (request("GET", "/healthz", port, login)
           + request("GET", "/healthz", port, {**login, "Connection": "close"}))
    assert exchange(address, two)[0] == [200, 200]


def test_a_deeply_nested_body_is_a_bad_request_not_a_crash(web: Web) -> None:
    csrf = web.get("/api/session").json()["csrf"]
    headers = {"Content-Type": "application/json", "X-CSRF-Token": csrf}
    for body in (b"[" * 4000, b'{"a":' * 800):
        res = web.request("/api/dead/redrive", method="POST", body=body, headers=headers)
        assert res.status == 400 and res.json() == {"error": "body must be a JSON object"}
    assert web.get("/healthz").status == 200
    assert "Traceback" not in "".join(web.output) and "RecursionError" not in "".join(web.output)


def test_every_error_is_json_with_the_security_headers(web: Web) -> None:
    address = _address(web)
    port = address[1]
    login = {"Authorization": basic_header(*AUTH), "Connection": "close"}
    unsupported = [request(method, "/api/dead/redrive", port, login)
                   for method in ("PUT", "DELETE", "OPTIONS", "PATCH")]
    malformed = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",  # request line too long
                 b"GET / HTTP/1.1\r\n" + b"X-Many: y\r\n" * 101 + b"\r\n"]  # too many headers
    for data in unsupported + malformed:
        statuses, raw, closed = exchange(address, data)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert closed and statuses and 400 <= statuses[0] < 600, raw[:200]
        assert b"Content-Type: application/json" in head and b"Content-Security-Policy:" in head, raw[:400]
        assert b"X-Content-Type-Options: nosniff" in head
        assert set(json.loads(body)) == {"error"} and b"<html" not in raw.lower()


# ---------------------------------------------------------------- the server object: connection limits


@pytest.fixture
def app(redis_url: str) -> WebApp:
    q, pool = TaskQueue.from_url(redis_url, NS), ProxyPool.from_url(redis_url, NS)
    return WebApp(Reader(q.client, q, pool, 30), Source(q.client, NS, 30, None), None)


@pytest.fixture
def serve() -> Iterator:
    servers: list[WebServer] = []

    def start(app: WebApp, **kw: float) -> tuple[str, int]:
        server = WebServer(app, "127.0.0.1", 0, **kw)  # type: ignore[arg-type]
        servers.append(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server.server_address[:2]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _healthz(address: tuple[str, int]) -> list[int]:
    return exchange(address, request("GET", "/healthz", address[1], {"Connection": "close"}), timeout=5)[0]


def test_a_silent_connection_is_closed_after_the_socket_timeout(app: WebApp, serve) -> None:
    assert 15 <= SOCKET_TIMEOUT <= 30  # the default: slow clients get time, idle ones do not stay
    address = serve(app, socket_timeout=0.5)
    with socket.create_connection(address, timeout=10) as idle, \
            socket.create_connection(address, timeout=10) as half:
        half.sendall(b"GET /heal")  # half a request line, then nothing
        assert idle.recv(100) == b"" and half.recv(100) == b""  # closed by the server, not our timeout
    assert _healthz(address) == [200]


def test_connections_past_the_cap_are_refused_and_served_again_once_one_leaves(app: WebApp, serve) -> None:
    address = serve(app, max_connections=2, socket_timeout=60)
    first = socket.create_connection(address, timeout=10)
    second = socket.create_connection(address, timeout=10)
    try:
        statuses, raw, closed = exchange(address, b"", timeout=10)  # a third: answered and closed at once
        assert statuses == [503] and closed and b"Content-Security-Policy" in raw, raw
        first.close()  # a slot frees up: the server serves again
        assert wait_until(lambda: _healthz(address) == [200], timeout=10, interval=0.05, what="a free slot")
    finally:
        first.close()
        second.close()


# ---------------------------------------------------------------- the request deadline: slowloris clients

DEADLINE = 1.5  # the request deadline of these servers
PER_READ = 10.0  # their per-read timeout: far above the trickle's pace and the tests' waits
SLACK = 2.5  # how late after the deadline the close may be noticed
TRICKLE = 0.3  # seconds between two trickled bytes (the pace of wait_until's polling)


class Trickler:
    """A slowloris client: sends ``head`` at once, then ``data`` one byte per ``step()``, and notes
    when the server closes the connection (each byte arrives well inside the per-read timeout)."""

    def __init__(self, address: tuple[str, int], head: bytes, data: bytes = b"a" * 4000) -> None:
        self.opened = time.monotonic()
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.sendall(head)
        self.data, self.sent, self.received = data, 0, b""
        self.closed_after: float | None = None  # seconds from connecting to the server's close

    def step(self) -> bool:
        """Send the next byte, unless the server has closed (then True)."""
        if self.closed_after is None:
            try:
                if select.select([self.sock], [], [], 0)[0]:
                    chunk = self.sock.recv(65536)
                    self.received += chunk
                    if not chunk:
                        raise ConnectionResetError("closed by the server")
                else:
                    self.sock.send(self.data[self.sent:self.sent + 1])
                    self.sent += 1
            except (BrokenPipeError, ConnectionResetError):
                self.closed_after = time.monotonic() - self.opened
        return self.closed_after is not None

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def auth_app(redis_url: str) -> WebApp:
    q, pool = TaskQueue.from_url(redis_url, NS), ProxyPool.from_url(redis_url, NS)
    return WebApp(Reader(q.client, q, pool, 30), Source(q.client, NS, 30, None), BasicAuth(*AUTH))


def _heads(port: int, csrf: str) -> dict[str, bytes]:
    """What a trickler sends at once, by the part of the request it then trickles."""
    post = {"Authorization": basic_header(*AUTH), "X-CSRF-Token": csrf, "Content-Type": "application/json",
            "Content-Length": "4000"}
    return {"request line": b"GET /healthz?",
            "headers": request("GET", "/healthz", port)[:-2] + b"X-Slow: ",
            "body": request("POST", "/api/dead/redrive", port, post)}


@pytest.mark.parametrize("part", ["request line", "headers", "body"])
def test_a_client_trickling_its_request_is_closed_at_the_request_deadline(auth_app: WebApp, serve,
                                                                           part: str) -> None:
    assert SOCKET_TIMEOUT <= REQUEST_DEADLINE <= 60  # the default: at least one whole per-read timeout
    address = serve(auth_app, socket_timeout=PER_READ, request_deadline=DEADLINE)
    slow = Trickler(address, _heads(address[1], auth_app.auth.csrf_token())[part])  # type: ignore[union-attr]
    try:
        # Closed by the deadline (wait_until's timeout bounds how late), not before it.
        wait_until(slow.step, timeout=DEADLINE + SLACK, interval=TRICKLE, what=f"the server to close: {part}")
        assert slow.closed_after is not None and slow.closed_after >= DEADLINE
        assert slow.sent >= DEADLINE / TRICKLE / 2 and slow.received == b""  # it kept sending; nothing served
    finally:
        slow.close()


def test_tricklers_holding_every_slot_leave_at_the_deadline_and_others_are_served(app: WebApp,
                                                                                  serve) -> None:
    address = serve(app, max_connections=3, socket_timeout=PER_READ, request_deadline=DEADLINE)
    head = request("GET", "/healthz", address[1])[:-2] + b"X-Slow: "
    slow = [Trickler(address, head) for _ in range(3)]
    try:
        assert _healthz(address) == [503]  # every slot taken
        assert wait_until(lambda: all([t.step() for t in slow]) and _healthz(address) == [200],
                          timeout=DEADLINE + SLACK, interval=TRICKLE, what="the tricklers to be dropped")
        assert all(DEADLINE <= (t.closed_after or 0) for t in slow)
    finally:
        for t in slow:
            t.close()


def _response(sock: socket.socket) -> int:
    """Read one whole response from a kept-alive connection; its status."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536) or pytest.fail(f"closed mid-response: {raw!r}")
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail("closed mid-body")
    return int(STATUS.match(head).group(1))  # type: ignore[union-attr]


def test_a_kept_alive_connection_gets_a_deadline_per_request_and_an_idle_one_leaves_by_it(app: WebApp,
                                                                                         serve) -> None:
    address = serve(app, socket_timeout=PER_READ, request_deadline=DEADLINE)
    with socket.create_connection(address, timeout=10) as sock:
        started = time.monotonic()

        def ask() -> bool:  # prompt requests on one connection, for longer than one deadline
            sock.sendall(request("GET", "/healthz", address[1]))
            assert _response(sock) == 200
            return time.monotonic() - started > 2 * DEADLINE

        wait_until(ask, timeout=10, interval=0.2, what="two deadlines of requests")
        idle = time.monotonic()
        wait_until(lambda: select.select([sock], [], [], 0)[0] and sock.recv(100) == b"",
                   timeout=DEADLINE + SLACK, interval=0.05, what="the idle connection to be closed")
        assert time.monotonic() - idle >= DEADLINE - 0.5  # closed by the deadline, not at once
