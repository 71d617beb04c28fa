"""Proxy-aware HTTP fetching: borrow a proxy, send, classify, return the proxy with the outcome, retry on
a *different* proxy.

Why a dedicated fetcher: a plain retry loop re-sends through the same dead proxy three times and burns the
page's task attempts on a proxy problem. Here one call of :meth:`Fetcher.fetch` is one task attempt; inside
it the fetcher may rotate through up to ``max_rotations`` proxies (each retry excludes every proxy it already
used), backing off exponentially with jitter and honouring ``Retry-After``. Only when the rotations or the
waiting budget run out does it raise :class:`FetchError` (retryable: the task layer schedules the next
attempt). A 404/410 raises :class:`PermanentFetchError` (do not retry), as does a robots.txt refusal.

Used by the durable task context as ``ctx.fetch(url, **kw)``; ``Fetcher(pool=None)`` fetches directly.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib import robotparser
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.fetch.errors import FetchError, PermanentFetchError, RobotsDisallowed
from celery_ha.proxy.pool import BLOCK_STATUSES, PERMANENT_STATUSES, ProxyLease, ProxyPool
from celery_ha.proxy.validation import normalize_domain
from celery_ha.redisio.urls import mask_url

log = logging.getLogger(__name__)

USER_AGENTS: tuple[str, ...] = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
    "Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
    "Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.7; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 "
    "Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
    "Safari/537.36 Edg/131.0.0.0",
)
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


@dataclass(frozen=True)
class FetchInfo:
    """Attached to a returned response as ``response.fetch_info``."""

    proxy_id: str | None  # None = direct
    rotations: int  # proxies borrowed for this call (1 = first try worked)
    outcomes: tuple[str, ...]  # outcome of every try, in order


def classify(
    response: requests.Response | None,
    error: BaseException | None = None,
    captcha_markers: Iterable[str] = CAPTCHA_MARKERS,
) -> str:
    """ok | blocked | server | transport | permanent, as the pool's release expects."""
    if response is None:
        return "transport"
    status = response.status_code
    if status in PERMANENT_STATUSES:
        return "permanent"
    if status in BLOCK_STATUSES:
        return "blocked"
    if status == 407:
        return "transport"  # the proxy refused our credentials: the proxy's fault, not the site's
    if status >= 500:
        return "server"
    ctype = response.headers.get("Content-Type", "")
    if status < 300 and ("html" in ctype or "text" in ctype or not ctype):
        head = response.text[:20000].lower()
        if any(marker in head for marker in captcha_markers):
            return "blocked"
    return "ok"


def retry_after_seconds(response: requests.Response | None, cap: float = 3600.0) -> float:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date); 0 when absent or unreadable."""
    if response is None:
        return 0.0
    value = response.headers.get("Retry-After")
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


def _domain_of(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"cannot fetch {mask_url(url)!r}: need an http(s) URL with a host")
    netloc = parts.hostname
    default = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port
    except ValueError:
        raise InvalidInput(f"cannot fetch {mask_url(url)!r}: bad port") from None
    if port and port != default:
        netloc = f"{netloc}:{port}"
    return normalize_domain(netloc)


class Fetcher:
    """Fetch pages through the proxy pool (or directly with ``pool=None``). Safe to share across threads.

    ``max_rotations``: proxies one call may borrow (default 10), counted apart from task attempts.
    ``max_wait``: seconds one call may spend waiting (no proxy free, backoff, Retry-After) before it gives
    up with a retryable FetchError carrying ``retry_after``. ``direct_when_empty``: fetch directly when the
    pool has no available proxy at all (explicit opt-in). ``politeness``: random delay (min, max) seconds
    before each request, or a mapping domain -> (min, max) with key ``"*"`` as the default.
    """

    def __init__(
        self,
        pool: ProxyPool | None = None,
        *,
        worker: str = "",
        max_rotations: int = 10,
        direct_tries: int = 3,
        backoff_base: float = 0.2,
        backoff_cap: float = 5.0,
        max_wait: float = 60.0,
        timeout: float | tuple[float, float] = (5.0, 25.0),
        obey_robots: bool = True,
        robots_agent: str = "*",
        robots_ttl: float = 3600.0,
        politeness: tuple[float, float] | Mapping[str, tuple[float, float]] = (0.0, 0.0),
        direct_when_empty: bool = False,
        user_agents: Sequence[str] = USER_AGENTS,
        captcha_markers: Iterable[str] = CAPTCHA_MARKERS,
        providers: Iterable[Any] = (),
        session: requests.Session | None = None,
        pool_size: int = 32,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_rotations < 1 or direct_tries < 1 or max_wait < 0 or backoff_base < 0:
            raise InvalidInput("max_rotations and direct_tries must be >= 1; max_wait, backoff_base >= 0")
        self.pool = pool
        self.worker = worker
        self.max_rotations = max_rotations
        self.direct_tries = direct_tries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_wait = max_wait
        self.timeout = timeout
        self.obey_robots = obey_robots
        self.robots_agent = robots_agent
        self.robots_ttl = robots_ttl
        self.politeness = politeness
        self.direct_when_empty = direct_when_empty
        self.user_agents = tuple(user_agents) or USER_AGENTS
        self.captcha_markers = tuple(m.lower() for m in captcha_markers)
        self.providers = list(providers)
        self._sleep = sleep
        self._robots: dict[str, tuple[float, robotparser.RobotFileParser]] = {}
        self._robots_lock = threading.Lock()
        if session is None:
            session = requests.Session()
            session.trust_env = False  # proxies come from the pool only, never from the environment
            adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        self.session = session

    def __repr__(self) -> str:
        return f"Fetcher(pool={self.pool!r}, worker={self.worker!r}, max_rotations={self.max_rotations})"

    def close(self) -> None:
        self.session.close()

    # ------------------------------------------------------------------ public
    def fetch(self, url: str, method: str = "GET", **kw: Any) -> requests.Response:
        """Fetch ``url``; returns a response classified ok (2xx/3xx, other 4xx are returned as they are).

        Raises PermanentFetchError (404/410, robots.txt), FetchError (retryable), InvalidInput (bad URL).
        ``kw`` goes to ``requests.Session.request`` (headers are merged over the browser-like defaults).
        """
        domain = _domain_of(url)
        if self.obey_robots and not self._robots_allowed(url, domain):
            raise RobotsDisallowed(f"robots.txt disallows {mask_url(url)}", url=url)
        return self._fetch(url, domain, method, kw, robots=False)

    # ------------------------------------------------------------------ the rotation loop
    def _fetch(
        self, url: str, domain: str, method: str, kw: Mapping[str, Any], robots: bool
    ) -> requests.Response:
        deadline = time.monotonic() + self.max_wait
        used: list[str] = []
        outcomes: list[str] = []
        last_status: int | None = None
        retry_after = 0.0
        tries = self.max_rotations if self.pool is not None else self.direct_tries
        for rotation in range(tries):
            if rotation:
                self._backoff(rotation, retry_after, deadline, url, outcomes, last_status, used)
            self._polite(domain)  # before borrowing: never sit on a lease while being polite
            lease = self._borrow(domain, used, deadline, url, outcomes)
            started = time.monotonic()
            response: requests.Response | None = None
            error: BaseException | None = None
            try:
                response = self._send(method, url, lease, kw)
            except (
                requests.exceptions.InvalidURL,
                requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema,
            ) as exc:
                self._give_back(lease, "unused", None, None, 0.0)
                raise InvalidInput(f"cannot fetch {mask_url(url)!r}: {type(exc).__name__}") from None
            except requests.exceptions.RequestException as exc:
                error = exc
            except BaseException:
                # Interrupted mid-request (e.g. Celery's soft time limit): the request may have reached
                # the site, so keep its rate-window hit, but do not judge the proxy.
                self._give_back(lease, "aborted", None, None, 0.0)
                raise
            latency = (time.monotonic() - started) * 1000.0
            outcome = classify(response, error, self.captcha_markers)
            status = response.status_code if response is not None else None
            retry_after = retry_after_seconds(response)
            self._give_back(lease, outcome, status, latency, retry_after)
            outcomes.append(outcome)
            last_status = status
            via = lease.proxy_id if lease else "direct"
            if outcome == "ok" or (robots and outcome in ("blocked", "permanent") and status != 429):
                response.fetch_info = FetchInfo(
                    lease.proxy_id if lease else None,
                    rotation + 1,  # type: ignore[union-attr]
                    tuple(outcomes),
                )
                return response  # type: ignore[return-value]
            if outcome == "permanent":
                raise PermanentFetchError(
                    f"{mask_url(url)} answered {status}: gone, not retrying", url=url, status=status
                )
            detail = f"HTTP {status}" if status is not None else type(error).__name__
            log.info("fetch %s via %s: %s (%s); trying another proxy", mask_url(url), via, outcome, detail)
            if lease:
                used.append(lease.proxy_id)
        raise FetchError(
            f"fetch of {mask_url(url)} failed after {len(outcomes)} tries ({', '.join(outcomes)})",
            url=url,
            outcome=outcomes[-1] if outcomes else "",
            status=last_status,
            retry_after=max(retry_after, self.backoff_base),
            proxies_tried=used,
        )

    def _send(
        self, method: str, url: str, lease: ProxyLease | None, kw: Mapping[str, Any]
    ) -> requests.Response:
        options = dict(kw)
        options.pop("stream", None)  # the body is read before the proxy goes back (latency, captcha check)
        headers = self._headers()
        headers.update(options.pop("headers", None) or {})
        timeout = options.pop("timeout", self.timeout)
        if lease is not None:
            # Never outlive the lease: once the lock expires another worker may use this proxy × domain.
            budget = max(0.5, (lease.expires_at_ms - lease.acquired_at_ms) / 1000.0 * 0.9)
            timeout = (
                (min(timeout[0], budget), min(timeout[1], budget))
                if isinstance(timeout, tuple)
                else min(float(timeout), budget)
            )
            options["proxies"] = lease.proxies
        else:
            options["proxies"] = {}
        return self.session.request(method, url, headers=headers, timeout=timeout, **options)

    def _headers(self) -> dict[str, str]:
        return {
            "User-Agent": random.choice(self.user_agents),
            "Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
            "Accept-Language": "en-US,en;q=0.9,zh-CN;q=0.8,zh;q=0.7",
            "Accept-Encoding": "gzip, deflate",
            "Connection": "keep-alive",
            "Upgrade-Insecure-Requests": "1",
        }

    def _borrow(
        self, domain: str, used: list[str], deadline: float, url: str, outcomes: list[str]
    ) -> ProxyLease | None:
        """A lease on a proxy not yet used by this call; None means fetch directly."""
        if self.pool is None:
            return None
        refreshed = False
        while True:
            try:
                return self.pool.acquire(domain, worker=self.worker, exclude=used)
            except NoProxyAvailable as exc:
                reason = getattr(exc, "reason", "")
                if reason == "empty" and not refreshed and self.providers:
                    refreshed = True
                    self._refresh_providers()
                    continue
                if reason == "empty" and self.direct_when_empty:
                    return None
                if reason == "excluded":
                    raise FetchError(
                        f"fetch of {mask_url(url)}: every available proxy was tried ({', '.join(outcomes)})",
                        url=url,
                        outcome=outcomes[-1] if outcomes else "",
                        retry_after=max(1.0, exc.retry_after),
                        proxies_tried=used,
                    ) from None
                left = deadline - time.monotonic()
                if exc.retry_after > left:
                    raise FetchError(
                        f"no proxy for {domain} within the wait budget; retry in {exc.retry_after:.1f}s",
                        url=url,
                        outcome=outcomes[-1] if outcomes else "no_proxy",
                        retry_after=exc.retry_after,
                        proxies_tried=used,
                    ) from None
                self._sleep(max(0.005, exc.retry_after) * random.uniform(1.0, 1.2))

    def _give_back(
        self,
        lease: ProxyLease | None,
        outcome: str,
        status: int | None,
        latency: float | None,
        retry_after: float,
    ) -> None:
        if lease is None or self.pool is None:
            return
        try:
            self.pool.release(
                lease, outcome=outcome, status=status, latency_ms=latency, retry_after=retry_after
            )
        except Exception as exc:  # the lock expires by itself; a failed return must not fail the page
            log.warning("could not return proxy %s: %s", lease.proxy_id, mask_url(str(exc)))

    def _backoff(
        self,
        rotation: int,
        retry_after: float,
        deadline: float,
        url: str,
        outcomes: list[str],
        status: int | None,
        used: list[str],
    ) -> None:
        delay = min(self.backoff_cap, self.backoff_base * 2 ** (rotation - 1)) * random.uniform(0.5, 1.5)
        delay = max(delay, retry_after)
        if delay > deadline - time.monotonic():
            raise FetchError(
                f"fetch of {mask_url(url)}: next try due in {delay:.1f}s, past the wait budget "
                f"({', '.join(outcomes)})",
                url=url,
                outcome=outcomes[-1] if outcomes else "",
                status=status,
                retry_after=delay,
                proxies_tried=used,
            )
        if delay > 0:
            self._sleep(delay)

    def _polite(self, domain: str) -> None:
        spec = self.politeness
        if isinstance(spec, Mapping):
            spec = spec.get(domain, spec.get("*", (0.0, 0.0)))
        low, high = spec
        if high > 0:
            self._sleep(random.uniform(low, high))

    def _refresh_providers(self) -> None:
        for provider in self.providers:
            try:
                provider.refresh()
            except Exception as exc:  # a provider outage must not fail the page: the pool may still serve
                log.warning("proxy provider %r refresh failed: %s", provider, mask_url(str(exc)))

    # ------------------------------------------------------------------ robots.txt
    def _robots_allowed(self, url: str, domain: str) -> bool:
        parts = urlsplit(url)
        base = f"{parts.scheme}://{domain}"
        now = time.monotonic()
        with self._robots_lock:
            cached = self._robots.get(base)
        if cached is None or cached[0] < now:
            parser = self._load_robots(
                urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], "/robots.txt", "", "")), domain
            )
            cached = (now + self.robots_ttl, parser)
            with self._robots_lock:
                self._robots[base] = cached
        return cached[1].can_fetch(self.robots_agent, url)

    def _load_robots(self, robots_url: str, domain: str) -> robotparser.RobotFileParser:
        """Fetch and parse robots.txt (through the pool, so it counts against the site's limits)."""
        parser = robotparser.RobotFileParser(robots_url)
        try:
            response = self._fetch(robots_url, domain, "GET", {}, robots=True)
        except PermanentFetchError:
            parser.allow_all = True  # no robots.txt: everything allowed
            return parser
        if response.status_code in (401, 403):
            parser.disallow_all = True
        elif response.status_code >= 400:
            parser.allow_all = True
        else:
            parser.parse(response.text.splitlines())
        parser.modified()
        return parser
