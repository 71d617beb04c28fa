"""A loopback site for what the demo site does not serve: compressed pages (captcha or not), bodies
over ``DOWNLOAD_MAXSIZE``, slow pages, and a count of the requests each client IP has in flight.

Routes (``<n>`` is any number, so each page is its own URL):

* ``/captcha/<coding>/<n>`` and ``/page/<coding>/<n>``: a captcha page or a plain one, compressed
  with ``coding`` (gzip, deflate, br, zstd) when the request's Accept-Encoding names it;
* ``/big/<n>?bytes=N``: N bytes of HTML, Content-Length declared;
* ``/slow/<n>?s=S``: a small page after S seconds;
* anything else: a small page at once.

Every request is logged (:attr:`CaseSite.visits`) with its client IP, arrival and end times, and the
content coding it was answered with; :attr:`CaseSite.max_in_flight` is the most requests one IP had
open at once.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from celery_ha.contrib.scrapy.body import _brotli as brotli
from celery_ha.contrib.scrapy.body import _zstd as zstd
from celery_ha.demo.proxy_farm import LoopbackServer

CAPTCHA = b'<html><head><title>Just a moment</title></head><body><div class="g-recaptcha"></div></html>'
PAGE = b"<html><head><title>Item</title></head><body><p>an ordinary page</p></body></html>"
ENCODERS = {"gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress, "zstd": zstd.compress}


@dataclass
class Visit:
    path: str
    ip: str
    at: float  # time.time() on arrival
    ended: float = 0.0  # time.time() once the answer was written (0 = never)
    coding: str = ""  # the Content-Encoding it was answered with


class CaseSite(LoopbackServer):
    def __init__(self) -> None:
        self.visits: list[Visit] = []
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self._in_flight: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._serve(self._handler())

    @property
    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hits(self, path: str) -> list[Visit]:
        with self._lock:
            return [v for v in self.visits if v.path == path]

    def _enter(self, visit: Visit) -> None:
        with self._lock:
            self.visits.append(visit)
            self._in_flight[visit.ip] += 1
            self.max_in_flight[visit.ip] = max(self.max_in_flight[visit.ip], self._in_flight[visit.ip])

    def _leave(self, visit: Visit) -> None:
        with self._lock:
            self._in_flight[visit.ip] -= 1
            visit.ended = time.time()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                visit = Visit(parts.path, self.client_address[0], time.time())
                site._enter(visit)
                try:
                    self._answer(visit, parts.path.split("/"), parse_qs(parts.query))
                except OSError:  # the client gave up (a cancelled download)
                    pass
                finally:
                    site._leave(visit)

            def _answer(self, visit: Visit, path: list[str], query: dict[str, list[str]]) -> None:
                headers = {"Content-Type": "text/html; charset=utf-8"}
                kind = path[1] if len(path) > 1 else ""
                body = PAGE
                if kind in ("captcha", "page"):
                    body = CAPTCHA if kind == "captcha" else PAGE
                    coding = path[2]
                    if coding in (self.headers.get("Accept-Encoding") or ""):
                        body = ENCODERS[coding](body)
                        headers["Content-Encoding"] = visit.coding = coding
                elif kind == "big":
                    body = b"<html>" + b"x" * (int(query["bytes"][0]) - 6)
                elif kind == "slow":
                    time.sleep(float(query["s"][0]))  # the site being slow, on purpose
                self.send_response(200)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        return Handler
