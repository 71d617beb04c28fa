"""When a download really starts, and how much of its proxy lease is left at that moment.

The middleware borrows a proxy in ``process_request``; the request then enters its download slot and
may wait there: ``DOWNLOAD_DELAY`` and AutoThrottle space the requests of one slot, and a full slot
queues them. The lease's lock runs all that time. Once it expires, another process may borrow the
same proxy × domain, so a request sent after that would hit the site through one IP together with
someone else's, the very thing the lock exists to prevent.

Scrapy has no signal for the end of that wait: ``request_reached_downloader`` fires when the request
*enters* the slot's queue. The moment it leaves is Scrapy's call of the download handlers
(``Downloader._download`` → ``downloader.handlers.download_request_async``), so
:func:`watch_download_starts` wraps that one call of this crawler's downloader and awaits the
middleware's hook first. There the middleware sizes ``download_timeout`` from what is left of the
lease, or gives back a lease with too little left and borrows again (see
``CeleryHAProxyMiddleware._starting``). That call is Scrapy's internal, verified on Scrapy 2.19 (the
extra's ceiling sits below 2.20); a Scrapy without it is crawled without the check, warned once
(the timeout is then sized from the whole lease at borrow time, as before).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from scrapy.crawler import Crawler
from scrapy.http import Request, Response

from celery_ha.proxy import ProxyLease

#: A lease with less than this left when its download starts is given back and borrowed again (s)...
MIN_LEFT = 1.0
#: ... or with less than this share of its length left.
MIN_LEFT_SHARE = 0.1
#: The download may use this share of what is left of the lease; the rest covers returning it.
TIMEOUT_SHARE = 0.9
#: Marks a handlers object already wrapped (one wrap per crawler, however often it is asked).
_WRAPPED = "_celery_ha_download_start"


def seconds_left(lease: ProxyLease, borrowed_at: float, now: float | None = None) -> float:
    """What is left of the lease, counted on this process's monotonic clock from ``borrowed_at``
    (taken just before the acquire call, so the estimate errs on the short side)."""
    now = time.monotonic() if now is None else now
    return lease.seconds - (now - borrowed_at)


def enough_left(lease: ProxyLease) -> float:
    """The least a download may start with: a second, or a tenth of the lease when that is longer,
    but never more than half the lease (a fresh lease always passes, so borrowing again ends)."""
    length = lease.seconds
    return min(max(MIN_LEFT, MIN_LEFT_SHARE * length), 0.5 * length)


def timeout_within(left: float, own: Any) -> float:
    """``download_timeout`` for a download with ``left`` seconds of lease: the request's own timeout
    (``DOWNLOAD_TIMEOUT`` or the spider's meta value; 0/None = none) when shorter."""
    budget = max(0.1, left * TIMEOUT_SHARE)
    if isinstance(own, (int, float)) and not isinstance(own, bool) and 0 < own < budget:
        return float(own)
    return budget


def watch_download_starts(crawler: Crawler, hook: Callable[[Request], Awaitable[None]]) -> bool:
    """Await ``hook(request)`` each time this crawler's downloader hands a request to its download
    handler. False when the downloader has no such call (another Scrapy, a custom ``DOWNLOADER``)."""
    downloader = getattr(getattr(crawler, "engine", None), "downloader", None)
    handlers = getattr(downloader, "handlers", None)
    download = getattr(handlers, "download_request_async", None)
    if handlers is None or download is None or not inspect.iscoroutinefunction(download):
        return False
    if getattr(handlers, _WRAPPED, False):
        return True

    async def download_request_async(request: Request) -> Response:
        await hook(request)
        return await download(request)

    handlers.download_request_async = download_request_async
    setattr(handlers, _WRAPPED, True)
    return True
