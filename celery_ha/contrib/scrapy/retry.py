"""Retries that switch proxy first: the replacement for Scrapy's ``RetryMiddleware``.

Scrapy's own retry re-sends a failed request through whatever proxy comes next and counts every
failure against ``RETRY_TIMES``, so three bad proxies burn a page. Here (Crawlee's
``max_session_rotations`` idea) the outcome the proxy middleware recorded decides:

* ``blocked`` (401/403/429/captcha) and ``transport`` (connection failures, timeouts, 407) are the
  *proxy's* trouble: the page is re-scheduled on a different proxy and counts a **rotation**
  (``CELERY_HA_SCRAPY_MAX_ROTATIONS``, default 10), not a page retry;
* ``server`` (5xx) and the other ``RETRY_HTTP_CODES`` are the *site's* trouble: a **page retry**
  (``RETRY_TIMES``), also on a different proxy;
* ``ok`` and ``permanent`` (404/410) are answers: never retried;
* ``aborted`` (a download Scrapy cancelled, e.g. a body over ``DOWNLOAD_MAXSIZE``) is nobody's trouble
  and would end the same way on any proxy: not retried unless ``RETRY_EXCEPTIONS`` lists the error,
  and then as a page retry, never a rotation.

Every retry waits ``backoff_base × 2^(n-1)`` seconds, jittered ×0.5–1.5, at least the answer's
``Retry-After``, at most ``CELERY_HA_SCRAPY_BACKOFF_CAP`` (the pool keeps the refusing proxy off that
site for the whole Retry-After anyway). The wait is a time in ``meta`` that the proxy middleware
awaits before borrowing, so nothing is held while waiting. Giving up logs one line naming the page,
both counts, the last outcome and the proxy, at ``RETRY_GIVE_UP_LOG_LEVEL``.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.http import Request, Response
from scrapy.utils.misc import load_object

from celery_ha.base.errors import ConfigurationError
from celery_ha.contrib.scrapy import keys
from celery_ha.contrib.scrapy.config import scrapy_knobs
from celery_ha.contrib.scrapy.outcome import PROXY_OUTCOMES, response_outcome, retry_after
from celery_ha.contrib.scrapy.proxy_auth import shown
from celery_ha.contrib.scrapy.refusal import refuse_to_start

log = logging.getLogger("celery_ha.contrib.scrapy")


class CeleryHARetryMiddleware:
    """Re-schedule failed pages on another proxy; proxy rotations counted apart from page retries."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not settings.getbool("RETRY_ENABLED"):
            raise NotConfigured("RETRY_ENABLED is off")
        try:
            knobs = scrapy_knobs(settings)
        except ConfigurationError as exc:  # built before the proxy middleware: the first to read them
            refuse_to_start(exc)
        self.crawler = crawler
        self.stats = crawler.stats
        self.max_rotations = knobs.max_rotations
        self.backoff_base = knobs.backoff_base
        self.backoff_cap = knobs.backoff_cap
        self.captcha_markers = knobs.captcha_markers
        self.max_retry_times = settings.getint("RETRY_TIMES")
        self.retry_http_codes = {int(code) for code in settings.getlist("RETRY_HTTP_CODES")}
        self.priority_adjust = settings.getint("RETRY_PRIORITY_ADJUST")
        level = settings.get("RETRY_GIVE_UP_LOG_LEVEL", "ERROR")
        self.give_up_level = logging.getLevelName(level) if isinstance(level, str) else int(level)
        if not isinstance(self.give_up_level, int):
            raise NotConfigured(f"RETRY_GIVE_UP_LOG_LEVEL={level!r} is not a logging level")
        self.exceptions = tuple(
            load_object(e) if isinstance(e, str) else e for e in settings.getlist("RETRY_EXCEPTIONS")
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CeleryHARetryMiddleware:
        return cls(crawler)

    def process_response(
        self, request: Request, response: Response, spider: Any = None
    ) -> Request | Response:
        if request.meta.get("dont_retry", False):
            return response
        outcome = request.meta.get(keys.OUTCOME) or response_outcome(response, self.captcha_markers)
        if outcome == "permanent" or (outcome == "ok" and response.status not in self.retry_http_codes):
            return response
        detail = f"HTTP {response.status}"
        wait = request.meta.get(keys.RETRY_AFTER)
        wait = float(wait) if isinstance(wait, (int, float)) else retry_after(response)
        return self._retry(request, outcome, detail, wait) or response

    def process_exception(self, request: Request, exception: Exception, spider: Any = None) -> Request | None:
        if request.meta.get("dont_retry", False):
            return None
        outcome = request.meta.get(keys.OUTCOME)
        listed = isinstance(exception, self.exceptions)
        if outcome == "aborted":
            # Cancelled on our side (a body over DOWNLOAD_MAXSIZE): another proxy would fetch the same
            # body, so never a rotation; a page retry only when RETRY_EXCEPTIONS asks for one.
            return self._retry(request, outcome, type(exception).__name__, 0.0) if listed else None
        if outcome != "transport" and not listed:
            return None
        return self._retry(request, "transport", type(exception).__name__, 0.0)

    def _retry(self, request: Request, outcome: str, detail: str, wait: float) -> Request | None:
        """The retry of ``request`` on another proxy, or None (after the give-up line) when spent."""
        meta = request.meta
        proxy = meta.get(keys.PROXY)
        rotations = int(meta.get(keys.ROTATIONS, 0))
        retries = int(meta.get(keys.RETRY_TIMES, 0))
        rotation = bool(proxy) and outcome in PROXY_OUTCOMES
        if rotation:
            rotations += 1
            spent = rotations > int(meta.get(keys.MAX_ROTATIONS, self.max_rotations))
        else:
            retries += 1
            spent = retries > int(meta.get("max_retry_times", self.max_retry_times))
        if spent:
            self._give_up(request, outcome, detail, proxy, rotations - rotation, retries - (not rotation))
            return None
        retry = request.copy()
        retry.meta[keys.ROTATIONS] = rotations
        retry.meta[keys.RETRY_TIMES] = retries
        tried = [p for p in meta.get(keys.TRIED) or () if isinstance(p, str)]
        if proxy and proxy not in tried:
            tried.append(proxy)
        retry.meta[keys.TRIED] = tried  # a new list: Scrapy's copy shares the old one
        delay = self._delay(rotations + retries, wait)
        retry.meta[keys.NOT_BEFORE] = time.time() + delay
        for key in (keys.OUTCOME, keys.RETRY_AFTER, keys.PROXY):
            retry.meta.pop(key, None)
        retry.dont_filter = True
        retry.priority = request.priority + int(meta.get("priority_adjust", self.priority_adjust))
        if rotation:
            self.stats.inc_value(keys.ROTATED)
        else:
            self.stats.inc_value(keys.RETRIES)
        self.stats.inc_value(keys.RETRY_REASON + outcome)
        log.debug("celery-ha: %s %s (%s, %s via %s) in %.2fs", "rotating" if rotation else "retrying",
                  shown(request), outcome, detail, proxy or "direct", delay)
        return retry

    def _delay(self, attempt: int, wait: float) -> float:
        """Exponential backoff with jitter, at least Retry-After, at most the cap."""
        backoff = self.backoff_base * 2 ** max(0, attempt - 1) * random.uniform(0.5, 1.5)
        return min(self.backoff_cap, max(backoff, wait))

    def _give_up(self, request: Request, outcome: str, detail: str, proxy: Any, rotations: int,
                 retries: int) -> None:
        """One line saying which page was dropped, why, through which proxy, and both counts."""
        self.stats.inc_value(keys.GAVE_UP)
        self.stats.inc_value(f"{keys.GAVE_UP}/{outcome}")
        limit_rotations = int(request.meta.get(keys.MAX_ROTATIONS, self.max_rotations))
        limit_retries = int(request.meta.get("max_retry_times", self.max_retry_times))
        log.log(
            self.give_up_level,
            "celery-ha: gave up on %s: last %s (%s) via %s; proxy rotations %d/%d, page retries %d/%d",
            shown(request), outcome, detail, proxy or "direct", rotations, limit_rotations, retries,
            limit_retries,
        )
