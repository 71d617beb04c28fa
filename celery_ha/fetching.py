"""The one place a durable task's HTTP request goes through (``ctx.fetch``).

For now a pooled ``requests.Session`` per process fetches directly. The proxy-aware
``celery_ha.fetcher.Fetcher`` (built separately) replaces :func:`fetch` when it lands: keep every
call site on this function so the swap is one edit. The error classes mirror the fetcher's
classification (permanent 404/410, retryable blocks, 5xx and transport errors); the task runner
only looks at ``exc.permanent``, so the fetcher's own exception types unify by setting that flag.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from .errors import CeleryHAError

DEFAULT_TIMEOUT = 15.0
PERMANENT_STATUSES = frozenset({404, 410})
BLOCK_STATUSES = frozenset({401, 403, 429})
CAPTCHA_MARKERS = ('id="captcha"', "g-recaptcha", "cf-challenge")


class FetchError(CeleryHAError):
    """A fetch failed in a way worth retrying later (5xx, block, captcha, transport error)."""

    permanent = False

    def __init__(self, message: str, *, url: str = "", status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.retry_after = retry_after


class BlockedError(FetchError):
    """The site refused us (401/403/429 or a captcha page): retry, ideally from another IP."""


class PermanentFetchError(FetchError):
    """The page is gone for good (404/410): the task fails without retry."""

    permanent = True


def is_permanent(exc: BaseException) -> bool:
    """True when ``exc`` says retrying cannot help (any exception with ``permanent = True``)."""
    return bool(getattr(exc, "permanent", False))


_local = threading.local()


def session() -> requests.Session:
    """A pooled session per process and thread (a Session must not cross a fork)."""
    sess: requests.Session | None = getattr(_local, "session", None)
    if sess is None or getattr(_local, "pid", None) != os.getpid():
        sess = requests.Session()
        adapter = HTTPAdapter(pool_connections=16, pool_maxsize=16, max_retries=0)
        sess.mount("http://", adapter)
        sess.mount("https://", adapter)
        sess.headers["User-Agent"] = "celery-ha/0.1 (+https://github.com/)"
        _local.session = sess
        _local.pid = os.getpid()
    return sess


def classify(response: requests.Response) -> None:
    """Raise the matching FetchError for a response that is not a usable page."""
    status = response.status_code
    url = response.url
    if status in PERMANENT_STATUSES:
        raise PermanentFetchError(f"HTTP {status} for {url}", url=url, status=status)
    if status in BLOCK_STATUSES or status >= 500:
        retry_after = response.headers.get("Retry-After")
        try:
            delay = float(retry_after) if retry_after else None
        except ValueError:
            delay = None
        kind = BlockedError if status in BLOCK_STATUSES else FetchError
        raise kind(f"HTTP {status} for {url}", url=url, status=status, retry_after=delay)
    if status >= 400:
        raise PermanentFetchError(f"HTTP {status} for {url}", url=url, status=status)
    ctype = response.headers.get("Content-Type", "")
    if "html" in ctype and any(m in response.text for m in CAPTCHA_MARKERS):
        raise BlockedError(f"captcha page at {url}", url=url, status=status)


def fetch(url: str, method: str = "GET", **kwargs: Any) -> requests.Response:
    """Fetch ``url`` and return the response, or raise a classified :class:`FetchError`."""
    kwargs.setdefault("timeout", DEFAULT_TIMEOUT)
    try:
        response = session().request(method, url, **kwargs)
    except requests.RequestException as exc:
        raise FetchError(f"{type(exc).__name__} fetching {url}: {exc}", url=url) from exc
    classify(response)
    return response
