"""A real HTTP server that serves generated sitemaps (no tests here).

Every document is generated while it is sent (chunked transfer, optionally gzipped on the fly), so the
server never holds a 50,000-URL sitemap either: a memory measurement of the test process (server
thread included) sees the reader's memory, not the fixture's. Requests are logged with their time.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from tests.support.http_site import QuietHandler, serve, stop

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"

Body = Callable[[], Iterable[bytes]]


@dataclass
class Route:
    body: Body
    status: int = 200
    gzip: bool = False  # the body itself is gzip (a .xml.gz file)
    content_encoding: bool = False  # sent with Content-Encoding: gzip
    chunk_delay: float = 0.0  # seconds between chunks (a slow site)
    content_type: str = "application/xml"


@dataclass
class Hit:
    path: str
    time: float


def urlset(entries: Iterable[tuple[str, str | None]], per_chunk: int = 500) -> Iterator[bytes]:
    """A <urlset> of (loc, lastmod) pairs, generated ``per_chunk`` entries at a time."""
    yield f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="{NS}" ' \
          'xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">\n'.encode()
    part: list[str] = []
    for loc, lastmod in entries:
        mod = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
        part.append(f"<url><loc>{escape(loc)}</loc>{mod}<changefreq>daily</changefreq></url>\n")
        if len(part) >= per_chunk:
            yield "".join(part).encode()
            part = []
    yield ("".join(part) + "</urlset>\n").encode()


def index(locs: Iterable[str]) -> Iterator[bytes]:
    yield f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="{NS}">\n'.encode()
    for loc in locs:
        yield f"<sitemap><loc>{escape(loc)}</loc><lastmod>2026-01-01</lastmod></sitemap>\n".encode()
    yield b"</sitemapindex>\n"


def _gzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    for chunk in chunks:
        # Each chunk flushed as it is made: a slow or paused site sends what it has so far.
        yield z.compress(chunk) + z.flush(zlib.Z_SYNC_FLUSH)
    yield z.flush()


@dataclass
class SitemapSite:
    """``routes`` maps a path to a :class:`Route`; anything else answers 404."""

    host: str = "127.0.0.3"
    routes: dict[str, Route] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)

    def start(self) -> SitemapSite:
        site = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                site.hits.append(Hit(self.path, time.time()))
                route = site.routes.get(self.path)
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(route.status)
                self.send_header("Content-Type", route.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                if route.content_encoding:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                chunks: Iterable[bytes] = route.body()
                if route.gzip:
                    chunks = _gzipped(chunks)
                if route.content_encoding:
                    chunks = _gzipped(chunks)
                try:
                    for chunk in chunks:
                        if not chunk:
                            continue
                        if route.chunk_delay:
                            time.sleep(route.chunk_delay)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._server = serve(self.host, Handler, quiet_errors=True)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        stop(self._server)

    def paths(self) -> list[str]:
        return [h.path for h in self.hits]
