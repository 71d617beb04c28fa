"""Judge a Scrapy download the way the pool's release expects: ok, blocked, server, transport, permanent.

The status rules are the pool's (:func:`celery_ha.proxy.outcomes.status_outcome`) and the captcha
markers the fetcher's, so a page counts the same whether ``ctx.fetch`` or a Scrapy spider loaded it.
What is Scrapy-specific is reading a Scrapy ``Response`` and telling a network failure (the proxy's
fault) from a request that never left or was cancelled (nobody's fault).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from scrapy.exceptions import DownloadCancelledError, IgnoreRequest, NotSupported
from scrapy.http import Response
from twisted.internet.defer import CancelledError

from celery_ha.contrib.scrapy.body import body_head, looks_textual
from celery_ha.fetch.classify import CAPTCHA_MARKERS, CAPTCHA_SCAN_CHARS, parse_retry_after
from celery_ha.proxy.outcomes import status_outcome

#: Outcomes that are the proxy's doing: the page is retried on another proxy (a rotation).
PROXY_OUTCOMES = frozenset({"blocked", "transport"})
#: Downloads stopped on our side, not by the proxy or the network: Scrapy's DownloadCancelledError
#: (a body over DOWNLOAD_MAXSIZE, declared or while streaming) and a cancelled Deferred or task.
CANCELLED = (DownloadCancelledError, CancelledError, asyncio.CancelledError)


def response_outcome(response: Response, captcha_markers: Iterable[str] = CAPTCHA_MARKERS) -> str:
    """ok | blocked | server | transport | permanent for a downloaded response.

    A 2xx text answer carrying a captcha marker in its first characters is a block, as a 403 is. The
    response may still be compressed (``response_downloaded`` comes before Scrapy decodes it): the
    start of the body is decompressed, with a bound, before it is scanned.
    """
    decided = status_outcome(response.status)
    if decided is not None:
        return decided
    if response.status < 300 and looks_textual(response):
        head = body_head(response, CAPTCHA_SCAN_CHARS)
        if head is not None:
            head = head.lower()
            if any(marker in head for marker in captcha_markers):
                return "blocked"
    return "ok"


def exception_outcome(exception: BaseException, reached: bool) -> str:
    """The outcome of a download that raised ``exception``.

    ``reached`` says whether the request got to Scrapy's downloader. If it did not, a middleware after
    ours refused it and nothing was sent (``unused``: the rate-window hit is given back). A download
    cancelled on our side (a body larger than ``DOWNLOAD_MAXSIZE``, the crawl closing) may have
    reached the site, so it keeps its hit without judging the proxy (``aborted``), and is not retried:
    another proxy would fetch the same body. Every other failure of a sent request is the network's
    or the proxy's (``transport``); Scrapy reports a download timeout as DownloadTimeoutError, not as a
    cancellation.
    """
    if not reached or isinstance(exception, (NotSupported, IgnoreRequest)):
        return "unused"
    if isinstance(exception, CANCELLED):
        return "aborted"
    return "transport"


def retry_after(response: Response, cap: float = 3600.0) -> float:
    """Seconds from the response's ``Retry-After`` header (seconds or HTTP date); 0 when absent."""
    raw = response.headers.get(b"Retry-After")
    return parse_retry_after(raw.decode("latin-1") if raw else None, cap)
