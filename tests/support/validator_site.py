"""A real HTTP server for conditional requests and refetches: pages by path with their ETag /
Last-Modified, 304s when the request's validator matches, and a log of every request (what it sent,
what it got, when)."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.http_site import QuietHandler, serve, stop


@dataclass
class Page:
    body: str | Callable[[], str]  # a callable makes each answer anew (a page that keeps changing)
    etag: str | None = None
    modified: int | None = None  # epoch seconds, sent as Last-Modified


@dataclass
class Request:
    path: str
    if_none_match: str | None
    if_modified_since: str | None
    status: int
    time: float = field(default_factory=time.time)


@dataclass
class ValidatorSite:
    """Pages by path; answers 304 when the request's validator matches, else 200 with the page and
    its validators; logs every request with what it sent and what it got."""

    pages: dict[str, Page] = field(default_factory=dict)
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ValidatorSite:
        site = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                page = site.pages.get(self.path)
                inm, ims = self.headers.get("If-None-Match"), self.headers.get("If-Modified-Since")
                status = 404 if page is None else 200
                if page is not None and page.etag is not None and inm == page.etag:
                    status = 304
                elif page is not None and page.etag is None and page.modified is not None and ims \
                        and email.utils.parsedate_to_datetime(ims).timestamp() >= page.modified:
                    status = 304
                with site.lock:
                    site.log.append(Request(self.path, inm, ims, status))
                text = "" if page is None or status != 200 else (
                    page.body() if callable(page.body) else page.body)
                body = text.encode()
                self.send_response(status)
                if page is not None and page.etag:
                    self.send_header("ETag", page.etag)
                if page is not None and page.modified is not None:
                    self.send_header("Last-Modified", email.utils.formatdate(page.modified, usegmt=True))
                self.send_header("Content-Type", "text/html")
                if status != 304:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = serve("127.0.0.5", Handler)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.5:{self._server.server_address[1]}"

    def stop(self) -> None:
        stop(self._server)

    def requests(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.log if r.path == path]
