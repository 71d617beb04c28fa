"""A local simulated target site: paginated "legal documents" list and detail pages.

Used by the tests and the demo; it runs in-process on a loopback address (any 127.0.0.x).

Routes:
  ``GET /cases?page=N``  JSON ``{"page": N, "items": [{"id", "title", "url"}...], "next": N+1|null,
                         "total": T}`` — pages past the end return ``{"items": [], "next": null}``.
  ``GET /case/<n>``      HTML page with a ``<title>`` and a few paragraphs of text.
  ``GET /slow/<anything>`` a small HTML page (handy for tests that need a controllable step).

Knobs (constructor arguments, or attributes changed while running):
  ``total``, ``page_size``; ``delay`` (seconds before every answer) and ``delays`` (path prefix ->
  seconds); ``rate_limit=(n, seconds)`` per client IP, answered with 429 + ``Retry-After``;
  failures injected with :meth:`DemoSite.fail` (404, 410, 429, 503 or ``"captcha"``, always or for
  the first N hits). Every request is logged (:attr:`requests`, :meth:`hits`) with path, client IP,
  time and status.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_WORDS = ("court", "appeal", "contract", "plaintiff", "defendant", "statute", "liability", "evidence",
          "judgment", "damages", "tribunal", "counsel", "motion", "ruling", "precedent", "clause")


def case_title(n: int) -> str:
    return f"Case {n:06d}: {_WORDS[n % len(_WORDS)].title()} v. {_WORDS[(n * 7) % len(_WORDS)].title()}"


def case_text(n: int) -> str:
    words = [_WORDS[(n * 31 + i * 17) % len(_WORDS)] for i in range(60)]
    return f"Judgment in case {n}. " + " ".join(words) + "."


class _QuietServer(ThreadingHTTPServer):
    """Crawlers killed on purpose reset their connections: that is not worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@dataclass(frozen=True)
class SiteRequest:
    """One logged request."""

    path: str  # path with query string, e.g. "/cases?page=3"
    client_ip: str
    time: float  # time.time() when the request arrived
    status: int


@dataclass
class _Failure:
    kind: str  # "404", "410", "429", "503" or "captcha"
    remaining: int | None  # None = always


class DemoSite:
    """The simulated site. ``start()`` it, use :attr:`url`, ``stop()`` it (or use ``with``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, total: int = 200, page_size: int = 20,
                 delay: float = 0.0, delays: dict[str, float] | None = None,
                 rate_limit: tuple[int, float] | None = None) -> None:
        self.host = host
        self.port = port
        self.total = total
        self.page_size = page_size
        self.delay = delay
        self.delays: dict[str, float] = dict(delays or {})
        self.rate_limit = rate_limit
        self._failures: dict[str, _Failure] = {}
        self._log: list[SiteRequest] = []
        self._hits: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> DemoSite:
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                site._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = _QuietServer((self.host, self.port), Handler)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, name="demo-site", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def list_url(self) -> str:
        return f"{self.url}/cases"

    def case_url(self, n: int) -> str:
        return f"{self.url}/case/{n}"

    @property
    def pages(self) -> int:
        return -(-self.total // self.page_size)

    # ------------------------------------------------------------------ knobs
    def fail(self, path: str, kind: str | int, times: int | None = None) -> None:
        """Answer ``path`` (exact path with query, e.g. "/case/7") with a failure: 404, 410, 429,
        503 or "captcha" (a 200 captcha page); ``times`` = only the first N hits."""
        kind = str(kind)
        if kind not in ("404", "410", "429", "503", "captcha"):
            raise ValueError(f"unknown failure kind {kind!r}")
        with self._lock:
            self._failures[path] = _Failure(kind, times)

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    # ------------------------------------------------------------------ log
    @property
    def requests(self) -> list[SiteRequest]:
        """A snapshot of the request log, in arrival order."""
        with self._lock:
            return list(self._log)

    def hits(self, path: str | None = None, prefix: str | None = None) -> list[SiteRequest]:
        """Logged requests for an exact ``path`` or a path ``prefix``."""
        return [r for r in self.requests
                if (path is None or r.path == path) and (prefix is None or r.path.startswith(prefix))]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # ------------------------------------------------------------------ serving
    def _delay_for(self, path: str) -> float:
        extra = max((s for p, s in self.delays.items() if path.startswith(p)), default=0.0)
        return self.delay + extra

    def _rate_limited(self, ip: str, now: float) -> float | None:
        if not self.rate_limit:
            return None
        limit, window = self.rate_limit
        with self._lock:
            hits = self._hits[ip]
            while hits and hits[0] <= now - window:
                hits.popleft()
            if len(hits) >= limit:
                return max(0.0, hits[0] + window - now)
            hits.append(now)
        return None

    def _take_failure(self, path: str) -> str | None:
        with self._lock:
            failure = self._failures.get(path)
            if failure is None:
                return None
            if failure.remaining is not None:
                if failure.remaining <= 0:
                    return None
                failure.remaining -= 1
            return failure.kind

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        now = time.time()
        ip = req.client_address[0]
        path = req.path
        pause = self._delay_for(path)
        if pause > 0:
            time.sleep(pause)
        status, ctype, body, headers = self._route(path, ip, now)
        with self._lock:
            self._log.append(SiteRequest(path=path, client_ip=ip, time=now, status=status))
        data = body.encode("utf-8")
        req.send_response(status)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            req.send_header(name, value)
        req.end_headers()
        req.wfile.write(data)

    def _route(self, path: str, ip: str, now: float) -> tuple[int, str, str, dict[str, str]]:
        wait = self._rate_limited(ip, now)
        if wait is not None:
            return 429, "text/plain", "rate limited", {"Retry-After": str(max(1, round(wait)))}
        failure = self._take_failure(path)
        if failure == "captcha":
            return 200, "text/html; charset=utf-8", (
                '<html><head><title>Captcha</title></head><body><form id="captcha">'
                "Prove you are human</form></body></html>"), {}
        if failure is not None:
            headers = {"Retry-After": "1"} if failure in ("429", "503") else {}
            return int(failure), "text/plain", f"injected {failure}", headers
        parts = urlsplit(path)
        if parts.path == "/cases":
            return self._list_page(parts.query)
        if parts.path.startswith("/case/"):
            try:
                n = int(parts.path[len("/case/"):])
            except ValueError:
                return 404, "text/plain", "not found", {}
            if not 0 <= n < self.total:
                return 404, "text/plain", "not found", {}
            return 200, "text/html; charset=utf-8", self._case_page(n), {}
        if parts.path.startswith("/slow/"):
            return 200, "text/html; charset=utf-8", (
                f"<html><head><title>{parts.path}</title></head><body><p>ok</p></body></html>"), {}
        return 404, "text/plain", "not found", {}

    def _list_page(self, query: str) -> tuple[int, str, str, dict[str, str]]:
        try:
            page = int(parse_qs(query).get("page", ["1"])[0])
        except ValueError:
            return 400, "text/plain", "bad page", {}
        start = (page - 1) * self.page_size
        end = min(self.total, start + self.page_size)
        items = [{"id": f"case-{n:06d}", "title": case_title(n), "url": self.case_url(n)}
                 for n in range(max(0, start), end)] if page >= 1 else []
        nxt = page + 1 if items and end < self.total else None
        body = json.dumps({"page": page, "items": items, "next": nxt, "total": self.total})
        return 200, "application/json", body, {}

    def _case_page(self, n: int) -> str:
        return (f"<html><head><title>{case_title(n)}</title></head><body><h1>{case_title(n)}</h1>"
                f"<p>{case_text(n)}</p><p>Decided by the {_WORDS[n % 5]} division.</p></body></html>")
