"""Judge a response the way the proxy pool's release expects: ok, blocked, server, transport, permanent.

The status rules come from :func:`celery_ha.proxy.outcomes.status_outcome` (shared with the pool's
``ok``/``status`` release form); on top of them a successful HTML answer that is really a captcha page
counts as blocked, since the site refused this exit IP just as a 403 would.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from email.utils import parsedate_to_datetime

import requests

from celery_ha.proxy.outcomes import status_outcome

CAPTCHA_MARKERS: tuple[str, ...] = (
    "g-recaptcha",
    "h-captcha",
    "cf-challenge",
    "captcha-container",
    'id="captcha"',
    "<title>captcha",
    "are you a robot",
    "验证码",
)
#: How much of a body is searched for captcha markers (they sit near the top of a challenge page).
CAPTCHA_SCAN_CHARS = 20000


def classify(
    response: requests.Response | None,
    error: BaseException | None = None,
    captcha_markers: Iterable[str] = CAPTCHA_MARKERS,
) -> str:
    """ok | blocked | server | transport | permanent, as the pool's release expects.

    ``response`` None means the request failed before any answer (``error`` says how): a transport
    failure. ``captcha_markers`` are matched lower-case against the start of an HTML or text body.
    """
    if response is None:
        return "transport"
    status = response.status_code
    decided = status_outcome(status)
    if decided is not None:
        return decided
    ctype = response.headers.get("Content-Type", "")
    if status < 300 and ("html" in ctype or "text" in ctype or not ctype):
        head = response.text[:CAPTCHA_SCAN_CHARS].lower()
        if any(marker in head for marker in captcha_markers):
            return "blocked"
    return "ok"


def parse_retry_after(value: str | None, cap: float = 3600.0) -> float:
    """Seconds from a ``Retry-After`` value (delta-seconds or HTTP date), capped; 0 when absent or
    unreadable. Shared by the fetcher and the Scrapy middleware."""
    if not value:
        return 0.0
    value = value.strip()
    try:
        return min(cap, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        return min(cap, max(0.0, parsedate_to_datetime(value).timestamp() - time.time()))
    except (TypeError, ValueError, OverflowError):
        return 0.0


def retry_after_seconds(response: requests.Response | None, cap: float = 3600.0) -> float:
    """Seconds from a response's ``Retry-After`` header (see :func:`parse_retry_after`)."""
    return 0.0 if response is None else parse_retry_after(response.headers.get("Retry-After"), cap)
