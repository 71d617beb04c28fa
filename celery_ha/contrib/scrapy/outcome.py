"""Judge a Scrapy download the way the pool's release expects: ok, blocked, server, transport, permanent.

The status rules are the pool's (:func:`celery_ha.proxy.outcomes.status_outcome`) and the captcha
markers the fetcher's, so a page counts the same whether ``ctx.fetch`` or a Scrapy spider loaded it.
What is Scrapy-specific is reading a Scrapy ``Response`` and telling a network failure (the proxy's
fault) from a request that never left or was cancelled (nobody's fault).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from scrapy.exceptions import IgnoreRequest, NotSupported
from scrapy.http import Response, TextResponse
from twisted.internet.defer import CancelledError

from celery_ha.fetch.classify import CAPTCHA_MARKERS, CAPTCHA_SCAN_CHARS, parse_retry_after
from celery_ha.proxy.outcomes import status_outcome

#: Outcomes that are the proxy's doing: the page is retried on another proxy (a rotation).
PROXY_OUTCOMES = frozenset({"blocked", "transport"})


def response_outcome(response: Response, captcha_markers: Iterable[str] = CAPTCHA_MARKERS) -> str:
    """ok | blocked | server | transport | permanent for a downloaded response.

    A 2xx text answer carrying a captcha marker in its first characters is a block, as a 403 is.
    """
    decided = status_outcome(response.status)
    if decided is not None:
        return decided
    if response.status < 300 and isinstance(response, TextResponse):
        ctype = response.headers.get(b"Content-Type", b"").decode("latin-1").lower()
        if "html" in ctype or "text" in ctype or not ctype:
            head = response.text[:CAPTCHA_SCAN_CHARS].lower()
            if any(marker in head for marker in captcha_markers):
                return "blocked"
    return "ok"


def exception_outcome(exception: BaseException, reached: bool) -> str:
    """The outcome of a download that raised ``exception``.

    ``reached`` says whether the request got to Scrapy's downloader. If it did not, a middleware after
    ours refused it and nothing was sent (``unused``: the rate-window hit is given back). A cancelled
    download may have reached the site, so it keeps its hit without judging the proxy (``aborted``);
    every other failure of a sent request is the network's or the proxy's (``transport``).
    """
    if not reached or isinstance(exception, (NotSupported, IgnoreRequest)):
        return "unused"
    if isinstance(exception, (CancelledError, asyncio.CancelledError)):
        return "aborted"
    return "transport"


def retry_after(response: Response, cap: float = 3600.0) -> float:
    """Seconds from the response's ``Retry-After`` header (seconds or HTTP date); 0 when absent."""
    raw = response.headers.get(b"Retry-After")
    return parse_retry_after(raw.decode("latin-1") if raw else None, cap)
