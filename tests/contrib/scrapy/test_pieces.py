"""The parts of the middleware that need no crawl: outcomes of Scrapy responses and failures, the
proxy credentials on a request, and the lease book's exactly-once bookkeeping (real Scrapy objects)."""

from __future__ import annotations

import base64
import tracemalloc
import zlib
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

pytest.importorskip("scrapy")

from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware
from scrapy.exceptions import DownloadCancelledError, IgnoreRequest
from scrapy.http import HtmlResponse, Request, Response, TextResponse
from twisted.internet.defer import CancelledError
from twisted.internet.error import ConnectionRefusedError, TimeoutError

from celery_ha.contrib.scrapy import keys
from celery_ha.contrib.scrapy.book import LeaseBook
from celery_ha.contrib.scrapy.download_start import enough_left, timeout_within
from celery_ha.contrib.scrapy.middleware import request_domain
from celery_ha.contrib.scrapy.outcome import exception_outcome, response_outcome, retry_after
from celery_ha.contrib.scrapy.proxy_auth import route_through, scrapy_can_use, shown
from celery_ha.fetch.classify import CAPTCHA_SCAN_CHARS
from celery_ha.proxy import ProxyLease
from tests.contrib.scrapy.sites import CAPTCHA, ENCODERS, PAGE

URL = "http://shop.example/item/1"


def html(status: int = 200, body: str = "<html><title>Item</title></html>", **headers: str) -> HtmlResponse:
    return HtmlResponse(URL, status=status, body=body.encode(), encoding="utf-8", headers=headers)


@pytest.mark.parametrize(("response", "outcome"), [
    (html(), "ok"),
    (html(301, Location="/x"), "ok"),
    (html(body='<div class="g-recaptcha"></div>'), "blocked"),
    (html(403), "blocked"),
    (html(429), "blocked"),
    (html(401), "blocked"),
    (html(407), "transport"),
    (html(503), "server"),
    (html(404), "permanent"),
    (html(410), "permanent"),
    (TextResponse(URL, body=b'{"captcha": "g-recaptcha"}', headers={"Content-Type": "application/json"}),
     "ok"),
    (Response(URL, body=b"\x00binary g-recaptcha"), "ok"),
])
def test_response_outcomes_match_the_fetchers(response: Response, outcome: str) -> None:
    assert response_outcome(response) == outcome


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_a_compressed_captcha_page_is_blocked_as_it_comes_off_the_wire(coding: str) -> None:
    """``response_downloaded`` hands over the body before HttpCompressionMiddleware decodes it."""
    def raw(body: bytes, **headers: str) -> HtmlResponse:
        return HtmlResponse(URL, body=ENCODERS[coding](body), headers={"Content-Encoding": coding, **headers})

    assert response_outcome(raw(CAPTCHA, **{"Content-Type": "text/html; charset=utf-8"})) == "blocked"
    assert response_outcome(raw(CAPTCHA)) == "blocked"  # no Content-Type: sniffed as compressed bytes
    assert response_outcome(raw(PAGE, **{"Content-Type": "text/html"})) == "ok"
    assert response_outcome(raw(CAPTCHA, **{"Content-Type": "application/pdf"})) == "ok"


def test_compressed_bodies_are_read_only_as_far_as_the_scan_goes() -> None:
    """A 64 MiB page gzipped to ~64 KiB (a decompression bomb) is scanned within a few hundred KiB of
    memory; a marker past the scanned start is not seen, one within it is."""
    def bomb(head: bytes, tail: bytes) -> HtmlResponse:
        packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        chunks = [packer.compress(head)]
        chunks += [packer.compress(b" " * (1 << 20)) for _ in range(64)]
        chunks += [packer.compress(tail), packer.flush()]
        return HtmlResponse(URL, body=b"".join(chunks),
                            headers={"Content-Encoding": "gzip", "Content-Type": "text/html"})

    late = bomb(b"<html><body>", CAPTCHA)
    tracemalloc.start()
    try:
        assert response_outcome(late) == "ok"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * CAPTCHA_SCAN_CHARS * 4, peak  # bounded by the scan, not by the 64 MiB
    assert response_outcome(bomb(CAPTCHA, b"</html>")) == "blocked"
    captcha = '<div class="g-recaptcha"></div>'
    # A header naming a coding the body does not carry (already decoded): read as it is.
    assert response_outcome(html(body=captcha, **{"Content-Encoding": "gzip"})) == "blocked"
    # A coding nobody here can decode with a bound: not judged from its bytes.
    assert response_outcome(html(body=captcha, **{"Content-Encoding": "lzw"})) == "ok"


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after(html(429, **{"Retry-After": "7"})) == 7.0
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 < retry_after(html(429, **{"Retry-After": later})) <= 30
    assert retry_after(html(429)) == 0.0 and retry_after(html(429, **{"Retry-After": "soon"})) == 0.0


def test_exception_outcomes_tell_the_proxy_fault_from_nothing_sent() -> None:
    assert exception_outcome(ConnectionRefusedError(), reached=True) == "transport"
    assert exception_outcome(TimeoutError(), reached=True) == "transport"
    assert exception_outcome(ConnectionRefusedError(), reached=False) == "unused"
    assert exception_outcome(IgnoreRequest(), reached=True) == "unused"
    assert exception_outcome(CancelledError(), reached=True) == "aborted"
    # Scrapy cancels a body over DOWNLOAD_MAXSIZE (declared or streamed): not the proxy's fault.
    assert exception_outcome(DownloadCancelledError("over DOWNLOAD_MAXSIZE"), reached=True) == "aborted"


def test_a_download_starts_only_with_enough_lease_left_and_ends_inside_it() -> None:
    def lease_of(seconds: float) -> ProxyLease:
        return ProxyLease("127.0.0.2:8000", "shop.example", "t", "http://127.0.0.2:8000",
                          acquired_at_ms=1_000, expires_at_ms=1_000 + int(seconds * 1000))

    assert enough_left(lease_of(30)) == 3.0 and enough_left(lease_of(5)) == 1.0
    assert enough_left(lease_of(1)) == 0.5  # never more than half: a fresh lease always passes
    assert timeout_within(2.0, 180) == 1.8 and timeout_within(2.0, 1.0) == 1.0
    assert timeout_within(2.0, None) == 1.8 and timeout_within(2.0, 0) == 1.8


def test_credentials_go_in_the_header_the_way_scrapy_would_put_them() -> None:
    request = Request(URL)
    route_through(request, "http://bob:p%40ss@127.0.0.5:8080")
    assert request.meta["proxy"] == "http://127.0.0.5:8080"
    assert request.headers[b"Proxy-Authorization"] == b"Basic " + base64.b64encode(b"bob:p@ss")
    # Scrapy's own HttpProxyMiddleware (run on the retry copy, before ours) leaves it as it is.
    copy = request.copy()
    HttpProxyMiddleware().process_request(copy)
    assert copy.meta["proxy"] == "http://127.0.0.5:8080" and b"Proxy-Authorization" in copy.headers
    # A retry through a proxy without credentials drops the old header; direct drops the proxy.
    route_through(copy, "http://127.0.0.6:3128")
    assert copy.meta["proxy"] == "http://127.0.0.6:3128" and b"Proxy-Authorization" not in copy.headers
    route_through(copy, None)
    assert copy.meta["proxy"] is None and "_auth_proxy" not in copy.meta
    assert scrapy_can_use("https://h:1") and not scrapy_can_use("socks5://h:1")
    assert shown(Request("http://u:secret@shop.example/a")) == "<GET http://u:***@shop.example/a>"


def test_request_domain_is_the_pools_domain_key() -> None:
    assert request_domain(Request("http://Shop.Example/a")) == "shop.example"
    assert request_domain(Request("https://shop.example:443/a")) == "shop.example"
    assert request_domain(Request("http://127.0.0.1:8080/a")) == "127.0.0.1:8080"
    assert request_domain(Request("data:,hello")) is None


def lease(token: str) -> ProxyLease:
    return ProxyLease("127.0.0.2:8000", "shop.example", token, "http://u:p@127.0.0.2:8000")


def test_the_book_hands_each_lease_out_once_and_never_to_a_copy() -> None:
    book = LeaseBook()
    request = Request(URL)
    book.add(request, lease("t1"))
    copy = request.replace(url=URL + "?again")  # carries the token in its meta
    assert copy.meta[keys.LEASE] == "t1"
    assert book.take(copy) is None
    assert book.take(request).lease.token == "t1"
    assert book.take(request) is None and len(book) == 0


def test_the_book_finds_superseded_and_forgotten_leases() -> None:
    book = LeaseBook()
    replaced, failed, flying, dropped = (Request(f"{URL}?{i}") for i in range(4))
    book.add(replaced, lease("a"))
    book.add(failed, lease("b"))
    book.add(flying, lease("c"))
    book.add(dropped, lease("d"))
    for r in (failed, flying):
        book.find(r).reached_at = 1.0
    book.find(failed).left_at = 2.0
    # A copy of a request that never reached the downloader, or whose download raised: superseded.
    assert book.superseded(replaced.replace(url=URL)).lease.token == "a"
    assert book.superseded(failed.copy()).lease.token == "b"
    # A copy of a request still downloading is not.
    assert book.superseded(flying.copy()) is None
    # The sweep: "d" never reached the downloader; "c" is in flight and stays.
    assert [e.lease.token for e in book.forgotten(stray_after=10.0, left_grace=1.0)] == []
    gone = book.forgotten(stray_after=0.0, left_grace=0.0)
    assert [e.lease.token for e in gone] == ["d"]
    assert [e.lease.token for e in book.take_all()] == ["c"] and len(book) == 0
