"""The downloader middleware that borrows a proxy from celery-ha's pool per request and returns it.

Why here and not in a spider: a Scrapy project on many machines otherwise keeps one proxy list per
process, so the machines hit a site through one IP at once and a proxy one of them found dead stays
in the others' lists. Through the pool every process sees the same locks, rate windows, bans and
scores (see ``celery_ha.proxy.pool``).

The return path is the hard part, so it does not depend on any middleware calling us back:

* the lease is returned with the *raw* outcome from Scrapy's ``response_downloaded`` signal (before any
  middleware can turn the response into a retry or a redirect), or from ``process_exception`` when
  the download raised;
* a request another middleware dropped, replaced or answered itself is found by :class:`LeaseBook`
  (by lease token and request object) and its lease returned as ``unused`` (nothing was sent) — at
  once when a copy comes back through ``process_request``, else by a sweep every few seconds, on
  ``spider_idle`` and on ``spider_closed``.

So each acquire is released exactly once. Keep this middleware the highest-numbered downloader
middleware (950 in the README snippet): it then sees every request last and every answer first.

A request borrows before it enters its download slot, where ``DOWNLOAD_DELAY`` or a full slot may keep
it waiting while the lease runs; when its download really starts (``download_start``) its timeout is
fitted to what is left of the lease, or a lease with too little left is given back and borrowed again.

Redis calls (acquire, release) are synchronous: one short round trip each on the reactor thread,
bounded by the client's socket timeout. Waiting for a free proxy never blocks: it is an ``await``.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import redis
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request, Response
from scrapy.utils.httpobj import urlparse_cached

from celery_ha.base.errors import ConfigurationError, InvalidInput, NoProxyAvailable
from celery_ha.base.masking import mask_url
from celery_ha.contrib.scrapy import keys
from celery_ha.contrib.scrapy.book import Entry, LeaseBook
from celery_ha.contrib.scrapy.clock import Looping, looping_call, pause
from celery_ha.contrib.scrapy.config import (
    ScrapyKnobs,
    build_pool,
    celery_ha_settings,
    scrapy_knobs,
    worker_label,
)
from celery_ha.contrib.scrapy.download_start import (
    enough_left,
    seconds_left,
    timeout_within,
    watch_download_starts,
)
from celery_ha.contrib.scrapy.outcome import exception_outcome, response_outcome, retry_after
from celery_ha.contrib.scrapy.proxy_auth import route_through, scrapy_can_use, shown
from celery_ha.contrib.scrapy.refusal import refuse_to_start
from celery_ha.contrib.scrapy.wiring import check_delays, check_wiring
from celery_ha.proxy import ProxyLease, ProxyPool, normalize_domain

log = logging.getLogger("celery_ha.contrib.scrapy")

#: Seconds between sweeps for leases no middleware call will return.
SWEEP_INTERVAL = 5.0
#: A lease whose request has not reached the downloader this long after borrowing was dropped.
STRAY_AFTER = 10.0
#: A download that raised this long ago without our process_exception seeing it was handled elsewhere.
LEFT_GRACE = 1.0
#: Redis errors that mean "the pool is unreachable right now": wait and try again, like a busy pool.
REDIS_OUTAGE = (redis.ConnectionError, redis.TimeoutError)


def request_domain(request: Request) -> str | None:
    """The pool's domain key of a request (host, plus the port when not the scheme's default);
    None for what the pool does not serve (``data:``, ``file:``, ``s3:`` …)."""
    parts = urlparse_cached(request)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    default = 443 if parts.scheme == "https" else 80
    host = parts.hostname if not port or port == default else f"{parts.hostname}:{port}"
    try:
        return normalize_domain(host)
    except InvalidInput:
        return None


class CeleryHAProxyMiddleware:
    """Per request: borrow a proxy for its domain, send through it, return it with the outcome."""

    def __init__(
        self, crawler: Crawler, pool: ProxyPool, knobs: ScrapyKnobs, *, direct_when_empty: bool = False,
        worker: str = "",
    ) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.pool = pool
        self.knobs = knobs
        self.direct_when_empty = direct_when_empty
        self.worker = worker
        self.auth_encoding = crawler.settings.get("HTTPPROXY_AUTH_ENCODING") or "latin-1"
        self.book = LeaseBook()
        self.unusable: set[str] = set()  # pool ids Scrapy cannot send through (SOCKS)
        self._pool_down = False  # inside a streak of Redis errors: warned once, until it answers again
        self._closed_already = False  # spider_closed ran: a request still waiting must not borrow
        self._sweeper: Looping | None = None
        crawler.signals.connect(self._reached, signal=signals.request_reached_downloader)
        crawler.signals.connect(self._left, signal=signals.request_left_downloader)
        crawler.signals.connect(self._downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._idle, signal=signals.spider_idle)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CeleryHAProxyMiddleware:
        """A bad setting stops the crawl here with one line (``refusal``): never NotConfigured, which
        would let the spider crawl without the pool."""
        try:
            knobs = scrapy_knobs(crawler.settings)
            if not knobs.enabled:
                raise NotConfigured("CELERY_HA_SCRAPY_ENABLED is off")
            cfg = celery_ha_settings(crawler.settings)
            pool = build_pool(cfg, knobs)
        except ConfigurationError as exc:
            refuse_to_start(exc)
        settings = crawler.settings
        for warning in [*check_wiring(settings), *check_delays(settings, pool.config.lock_ttl)]:
            log.warning("celery-ha: %s", warning)
        return cls(crawler, pool, knobs, direct_when_empty=cfg.direct_when_empty,
                   worker=worker_label(knobs, getattr(crawler.spidercls, "name", None)))

    # ------------------------------------------------------------------ borrowing
    async def process_request(self, request: Request, spider: Any = None) -> None:
        """Wait out the retry backoff, borrow a proxy (waiting while none is free) and route the
        request through it. Returns None: the request goes on down the chain."""
        meta = request.meta
        meta.pop(keys.OUTCOME, None)
        meta.pop(keys.RETRY_AFTER, None)
        superseded = self.book.superseded(request)
        if superseded is not None:
            self._return_forgotten(superseded)
        if meta.get(keys.SKIP):
            return None
        domain = request_domain(request)
        if domain is None:
            return None
        due = meta.get(keys.NOT_BEFORE)
        if isinstance(due, (int, float)):
            await pause(min(due - time.time(), self.knobs.backoff_cap))
        # The timeout the request has without us (DOWNLOAD_TIMEOUT or the spider's), kept apart from
        # the lease-sized one written below, which retries and redirects copy.
        meta.setdefault(keys.OWN_TIMEOUT, meta.get(keys.DOWNLOAD_TIMEOUT))
        borrowed = await self._borrow(request, domain)
        if borrowed is None:
            self._go_direct(request)
            if str(meta.get(keys.DOWNLOAD_SLOT, "")).startswith(keys.SLOT_PREFIX):
                del meta[keys.DOWNLOAD_SLOT]
            return None
        lease, asked_at = borrowed
        self._route(request, lease, asked_at)
        self._fit_to_lease(request, lease)
        return None

    def _route(self, request: Request, lease: ProxyLease, asked_at: float) -> Entry:
        """Record the lease in the book and send ``request`` through its proxy."""
        entry = self.book.add(request, lease, borrowed_at=asked_at)
        request.meta[keys.PROXY] = lease.proxy_id
        route_through(request, lease.url, self.auth_encoding)
        return entry

    def _go_direct(self, request: Request) -> None:
        """Send ``request`` without a proxy (``CELERY_HA_DIRECT_WHEN_EMPTY`` and an empty pool)."""
        self.stats.inc_value(keys.DIRECT)
        request.meta.pop(keys.PROXY, None)
        route_through(request, None)

    async def _borrow(self, request: Request, domain: str) -> tuple[ProxyLease, float] | None:
        """A lease on a proxy this page has not failed through, with the monotonic time just before
        the acquire that granted it; None = send directly (``CELERY_HA_DIRECT_WHEN_EMPTY`` and the
        pool has no proxy in rotation)."""
        tried = [p for p in request.meta.get(keys.TRIED) or () if isinstance(p, str) and p]
        started = time.monotonic()
        outages = 0
        waited_before = False
        while True:
            asked_at = time.monotonic()
            try:
                lease = self.pool.acquire(domain, worker=self.worker, exclude=[*self.unusable, *tried])
            except NoProxyAvailable as exc:
                reason = str(getattr(exc, "reason", ""))
                if reason == "excluded" and tried:
                    # Every proxy in rotation already failed this page: allow them again, the one
                    # that failed last excepted (then none, for a pool of one).
                    tried = tried[-1:] if len(tried) > 1 else []
                    continue
                if reason in ("empty", "excluded") and self.direct_when_empty:
                    return None
                delay, why = max(0.005, exc.retry_after) * random.uniform(1.0, 1.2), reason or "busy"
            except REDIS_OUTAGE as exc:
                outages += 1
                self.stats.inc_value(keys.REDIS_ERRORS)
                if not self._pool_down:
                    self._pool_down = True
                    log.warning("celery-ha: proxy pool unreachable (%s); requests wait for it",
                                mask_url(str(exc)))
                delay, why = min(5.0, 0.25 * 2**outages), "pool unreachable"
            else:
                if self._pool_down:
                    self._pool_down = False
                    log.warning("celery-ha: proxy pool reachable again")
                self.stats.inc_value(keys.ACQUIRED)
                if self._closed_already:  # nobody would return it: the close sweep has run
                    self._give_back(lease, "unused")
                    raise IgnoreRequest("celery-ha: the spider closed while this request waited")
                if scrapy_can_use(lease.url):
                    return lease, asked_at
                self._give_back(lease, "unused")
                if lease.proxy_id not in self.unusable:
                    self.unusable.add(lease.proxy_id)
                    log.warning("celery-ha: proxy %s is %s, which Scrapy cannot send through; skipped",
                                lease.proxy_id, lease.url.split(":", 1)[0])
                continue
            waited = time.monotonic() - started
            if self.knobs.max_wait and waited + delay > self.knobs.max_wait:
                self.stats.inc_value(keys.GAVE_UP_WAITING)
                log.error("celery-ha: gave up on %s: no proxy for %s within %gs (%s)",
                          shown(request), domain, self.knobs.max_wait, why)
                raise IgnoreRequest(f"celery-ha: no proxy for {domain} within {self.knobs.max_wait:g}s")
            if not waited_before:
                waited_before = True
                self.stats.inc_value(keys.WAITS)
            self.stats.inc_value(keys.WAIT_SECONDS, delay)
            await pause(delay)

    def _fit_to_lease(self, request: Request, lease: ProxyLease) -> None:
        """Keep the download inside the lease (once the lock expires another process may use this
        proxy × domain) and give it a download slot of its own proxy × domain. The timeout set here
        assumes the download starts at once; :meth:`_starting` shortens it by the time the request
        then spent waiting in its slot."""
        meta = request.meta
        meta[keys.DOWNLOAD_TIMEOUT] = timeout_within(lease.seconds, meta.get(keys.OWN_TIMEOUT))
        if self.knobs.proxy_slots:
            slot = meta.get(keys.DOWNLOAD_SLOT)
            # Scrapy writes its default slot (the host) into meta: that one, or ours, is replaced;
            # a slot a spider chose itself is kept.
            default = urlparse_cached(request).hostname
            if slot is None or slot == default or str(slot).startswith(keys.SLOT_PREFIX):
                meta[keys.DOWNLOAD_SLOT] = f"{keys.SLOT_PREFIX}{lease.proxy_id}|{lease.domain}"

    async def _starting(self, request: Request) -> None:
        """The request leaves its download slot for the download handler (``download_start``): size
        ``download_timeout`` from what is left of its lease, or, when too little is left (it waited
        out ``DOWNLOAD_DELAY`` or a full slot), give the lease back unused and borrow again, so no
        request goes through a proxy whose lock has expired or is about to."""
        entry = self.book.find(request)
        if entry is None:
            return
        meta = request.meta
        left = seconds_left(entry.lease, entry.borrowed_at)
        if left >= enough_left(entry.lease):
            meta[keys.DOWNLOAD_TIMEOUT] = timeout_within(left, meta.get(keys.OWN_TIMEOUT))
            return
        self.book.take(request)
        self.stats.inc_value(keys.EXPIRED_IN_SLOT)
        log.debug("celery-ha: %s left its download slot with %.2fs of its lease on %s; borrowing again",
                  shown(request), max(0.0, left), entry.lease.proxy_id)
        self._give_back(entry.lease, "unused")
        borrowed = await self._borrow(request, entry.lease.domain)
        if borrowed is None:
            self._go_direct(request)
            return
        lease, asked_at = borrowed
        self._route(request, lease, asked_at).reached_at = time.monotonic()
        left = seconds_left(lease, asked_at)
        meta[keys.DOWNLOAD_TIMEOUT] = timeout_within(left, meta.get(keys.OWN_TIMEOUT))

    # ------------------------------------------------------------------ returning
    def _downloaded(self, response: Response, request: Request) -> None:
        """``response_downloaded``: the raw answer, before any middleware touched it."""
        entry = self.book.take(request)
        if entry is None:
            return
        outcome = response_outcome(response, self.knobs.captcha_markers)
        wait = retry_after(response)
        latency = request.meta.get(keys.DOWNLOAD_LATENCY)
        if isinstance(latency, (int, float)):
            latency_ms: float | None = latency * 1000.0
        elif entry.reached_at is not None:
            latency_ms = (time.monotonic() - entry.reached_at) * 1000.0
        else:
            latency_ms = None
        request.meta[keys.OUTCOME] = outcome
        request.meta[keys.RETRY_AFTER] = wait
        self._give_back(entry.lease, outcome, status=response.status, latency_ms=latency_ms,
                        retry_after=wait)

    def process_response(self, request: Request, response: Response, spider: Any = None) -> Response:
        """A lease still open here belongs to a response no download produced (a middleware after
        ours answered the request itself, or turned a failed download into a response)."""
        entry = self.book.take(request)
        if entry is not None:
            self._return_forgotten(entry)
        return response

    def process_exception(self, request: Request, exception: Exception, spider: Any = None) -> None:
        """The download raised (or a middleware after ours refused the request)."""
        entry = self.book.take(request)
        if entry is not None:
            outcome = exception_outcome(exception, reached=entry.reached_at is not None)
            if outcome != "unused":
                request.meta[keys.OUTCOME] = outcome
            self._give_back(entry.lease, outcome)
        return None

    def _give_back(self, lease: ProxyLease, outcome: str, *, status: int | None = None,
                   latency_ms: float | None = None, retry_after: float = 0.0) -> None:
        """Release one lease; a failure is logged and counted, never raised (the lock expires by
        itself and the pool's reaper clears it)."""
        try:
            reply = self.pool.release(lease, outcome=outcome, status=status, latency_ms=latency_ms,
                                      retry_after=retry_after)
        except Exception as exc:
            self.stats.inc_value(keys.RELEASE_FAILED)
            log.warning("celery-ha: could not return proxy %s: %s", lease.proxy_id, mask_url(str(exc)))
            return
        self.stats.inc_value(keys.RELEASED + outcome)
        if reply != "ok":
            self.stats.inc_value(keys.RELEASE_REPLY + reply)
            log.debug("celery-ha: proxy %s came back %s (its lock had expired)", lease.proxy_id, reply)

    def _return_forgotten(self, entry: Entry, closing: bool = False) -> None:
        """Return a lease no regular path returned: unused when nothing was sent, a transport
        failure when the download raised, aborted when it was cut off in flight."""
        if entry.reached_at is None:
            outcome = "unused"
        elif entry.left_at is not None and not closing:
            outcome = "transport"
        else:
            outcome = "aborted"
        self.stats.inc_value(keys.SWEPT)
        log.debug("celery-ha: returning forgotten lease on %s for %s (%s)", entry.lease.proxy_id,
                  shown(entry.request), outcome)
        self._give_back(entry.lease, outcome)

    # ------------------------------------------------------------------ signals
    def _reached(self, request: Request) -> None:
        entry = self.book.find(request)
        if entry is not None:
            entry.reached_at = time.monotonic()

    def _left(self, request: Request) -> None:
        entry = self.book.find(request)  # still here: the download raised (a response was taken)
        if entry is not None:
            entry.left_at = time.monotonic()

    def _sweep(self) -> None:
        for entry in self.book.forgotten(stray_after=STRAY_AFTER, left_grace=LEFT_GRACE):
            self._return_forgotten(entry)

    def _opened(self) -> None:
        log.info("celery-ha: proxies from %r for %s", self.pool, self.worker)
        if not watch_download_starts(self.crawler, self._starting):
            log.warning("celery-ha: this Scrapy's downloader has no download_request_async to watch: "
                        "a request that waits in its download slot may outlive its proxy lease")
        self._sweeper = looping_call(self._sweep)
        self._sweeper.start(SWEEP_INTERVAL, now=False)

    def _idle(self) -> None:
        """Nothing is in flight when the engine is idle: every lease left is forgotten."""
        for entry in self.book.forgotten(stray_after=0.0, left_grace=0.0):
            self._return_forgotten(entry)

    def _closed(self) -> None:
        self._closed_already = True
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        left = self.book.take_all()
        for entry in left:
            self._return_forgotten(entry, closing=True)
        if left:
            log.info("celery-ha: returned %d proxy lease(s) still open at close", len(left))

