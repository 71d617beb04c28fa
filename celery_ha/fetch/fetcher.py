"""Proxy-aware HTTP fetching: borrow a proxy, send, classify, return the proxy with the outcome, retry on
a *different* proxy.

Why a dedicated fetcher: a plain retry loop re-sends through the same dead proxy three times and burns the
page's task attempts on a proxy problem. Here one call of :meth:`Fetcher.fetch` is one task attempt; inside
it the fetcher may rotate through up to ``max_rotations`` proxies (each retry excludes every proxy it already
used), backing off exponentially with jitter and honouring ``Retry-After``. Only when the rotations or the
waiting budget run out does it raise :class:`FetchError` (retryable: the task layer schedules the next
attempt). A 404/410 raises :class:`PermanentFetchError` (do not retry), as does a robots.txt refusal.

Used by the durable task context as ``ctx.fetch(url, **kw)``; ``Fetcher(pool=None)`` fetches directly.
Headers come from ``headers.py``, the judgement of a response from ``classify.py`` and the robots.txt
cache from ``robots.py``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.base.hosts import host_of_url
from celery_ha.base.masking import mask_url
from celery_ha.fetch.body_deadline import within
from celery_ha.fetch.body_limit import read_at_most
from celery_ha.fetch.classify import CAPTCHA_MARKERS, classify, retry_after_seconds
from celery_ha.fetch.errors import FetchError, HostNotReady, PermanentFetchError, RobotsDisallowed
from celery_ha.fetch.headers import USER_AGENTS, browser_headers
from celery_ha.fetch.host_pacing import HostPacer, host_busy, wait_for_turn
from celery_ha.fetch.robots import RobotsCache, RobotsUnreachable, SharedRobots
from celery_ha.fetch.robots_file import ROBOTS_MAX_BYTES
from celery_ha.proxy import ProxyLease, ProxyPool

__all__ = [
    "CAPTCHA_MARKERS",
    "USER_AGENTS",
    "FetchError",
    "FetchInfo",
    "Fetcher",
    "PermanentFetchError",
    "RobotsDisallowed",
    "classify",
    "retry_after_seconds",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchInfo:
    """Attached to a returned response as ``response.fetch_info``."""

    proxy_id: str | None  # None = direct
    rotations: int  # proxies borrowed for this call (1 = first try worked)
    outcomes: tuple[str, ...]  # outcome of every try, in order


def _domain_of(url: str) -> str:
    """The pool's domain key of ``url`` (host, plus the port when it is not the scheme's default): the
    host key of the state layer's gate too (``base/hosts.py``)."""
    return host_of_url(url)


#: Statuses by which a site says "too fast" for the host as a whole: the host gate holds it back.
HOST_BUSY_STATUSES = (429, 503)
#: Refusals of the proxy pool that are the host's politeness (its budget, every proxy's window for it).
POLITENESS_REFUSALS = ("budget", "busy")


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
        robots_store: SharedRobots | None = None,
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
        self.robots = RobotsCache(self._fetch_robots, robots_agent, robots_ttl, robots_store)
        self._robots_gate = threading.local()  # the gate of the fetch that may load robots.txt now
        self.politeness = politeness
        self.direct_when_empty = direct_when_empty
        self.user_agents = tuple(user_agents) or USER_AGENTS
        self.captcha_markers = tuple(m.lower() for m in captcha_markers)
        self.providers = list(providers)
        self._sleep = sleep
        if session is None:
            session = requests.Session()
            session.trust_env = False  # proxies come from the pool only, never from the environment
            adapter = HTTPAdapter(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        self.session = session
        self._crawl_delays: dict[str, float | None] = {}  # domain -> Crawl-delay last handed to a gate

    def __repr__(self) -> str:
        return f"Fetcher(pool={self.pool!r}, worker={self.worker!r}, max_rotations={self.max_rotations})"

    @property
    def robots_agent(self) -> str:
        """The user agent robots.txt rules are matched against."""
        return self.robots.agent

    @property
    def robots_ttl(self) -> float:
        """Seconds a site's robots.txt is trusted before it is fetched again."""
        return self.robots.ttl

    def close(self) -> None:
        """Close the HTTP session's pooled connections."""
        self.session.close()

    # ------------------------------------------------------------------ public
    def fetch(self, url: str, method: str = "GET", *, gate: HostPacer | None = None,
              crawl_delay_cap: float = 30.0, **kw: Any) -> requests.Response:
        """Fetch ``url``; returns a response classified ok (2xx/3xx, other 4xx are returned as they are).

        Raises PermanentFetchError (404/410, robots.txt), FetchError (retryable), InvalidInput (bad URL).
        ``kw`` goes to ``requests.Session.request`` (headers are merged over the browser-like defaults).

        With ``gate`` (the host gate, when the calling task's host is this URL's), the host's pacing is
        the gate's, fleet-wide: every request (robots.txt's included) asks it first and waits out a
        short spacing, or hands the task back (``host_pacing.wait_for_turn``); robots.txt's
        Crawl-delay is stored with the host (capped at ``crawl_delay_cap`` s); a politeness refusal of
        the proxy pool (the host's budget or every proxy's window spent) defers the host to the
        refusal's retry time, and a 429/503 (robots.txt's too) blocks it (until its Retry-After, else
        with a doubling backoff); both then raise HostNotReady, and the task is handed back uncounted.
        An unreachable robots.txt (5xx, no answer: ``robots.py``) raises RobotsUnreachable (retryable);
        with ``gate`` the host is deferred for as long as that answer is held, and HostNotReady.
        """
        domain = _domain_of(url)
        # robots.txt, if it is fetched now, is a request to the host too
        self._robots_gate.gate, self._robots_gate.domain = gate, domain
        try:
            if self.obey_robots and not self.robots.allowed(url, domain):
                raise RobotsDisallowed(f"robots.txt disallows {mask_url(url)}", url=url)
            if gate is not None and self.obey_robots:
                self._store_crawl_delay(gate, url, domain, crawl_delay_cap)
        except RobotsUnreachable as exc:  # 5xx / no answer: with a gate the host waits, uncounted
            if gate is None:
                raise
            gate.defer(domain, exc.retry_after)
            raise HostNotReady(str(exc), host=domain, retry_after=exc.retry_after) from None
        finally:
            self._robots_gate.gate = None
        return self._fetch(url, domain, method, kw, robots=False, gate=gate)

    def _store_crawl_delay(self, gate: HostPacer, url: str, domain: str, cap: float) -> None:
        """Hand robots.txt's Crawl-delay to the gate once per loaded robots.txt (per process)."""
        delay = self.robots.crawl_delay(url, domain)
        if self._crawl_delays.get(domain) != delay:
            gate.set_crawl_delay(domain, delay, cap=cap)
            self._crawl_delays[domain] = delay

    # ------------------------------------------------------------------ the rotation loop
    def _fetch(
        self, url: str, domain: str, method: str, kw: Mapping[str, Any], robots: bool,
        gate: HostPacer | None = None,
    ) -> requests.Response:
        """Try up to ``max_rotations`` proxies (``direct_tries`` without a pool), never one twice.

        ``robots=True`` (fetching robots.txt) returns a block or a gone page as an answer instead of
        rotating or raising: for robots.txt they mean "forbidden" and "no rules", not a failure.
        """
        deadline = time.monotonic() + self.max_wait
        used: list[str] = []
        outcomes: list[str] = []
        last_status: int | None = None
        retry_after = 0.0
        tries = self.max_rotations if self.pool is not None else self.direct_tries
        for rotation in range(tries):
            if rotation:
                self._backoff(rotation, retry_after, deadline, url, outcomes, last_status, used)
            # Before borrowing: never sit on a lease while being polite.
            if gate is None:
                self._polite(domain)
            else:  # the host's spacing, fleet-wide, where the site sees it: at each request
                wait_for_turn(gate, domain, deadline, self._sleep)
            lease = self._borrow(domain, used, deadline, url, outcomes, gate)
            started = time.monotonic()
            response: requests.Response | None = None
            error: BaseException | None = None
            try:
                response = self._send(method, url, lease, kw, ROBOTS_MAX_BYTES if robots else None)
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
            if gate is not None:
                # The request reached the site somewhere between the two stamps: timed from the
                # answer, the next request of the host arrives at least the spacing after this one.
                gate.finished(domain)
            outcomes.append(outcome)
            last_status = status
            via = lease.proxy_id if lease else "direct"
            answered = outcome == "ok" or (robots and outcome in ("blocked", "permanent") and status != 429)
            if response is not None and answered:
                response.fetch_info = FetchInfo(  # type: ignore[attr-defined]
                    lease.proxy_id if lease else None, rotation + 1, tuple(outcomes)
                )
                return response
            if gate is not None and status in HOST_BUSY_STATUSES:
                host_busy(gate, domain, status, retry_after)
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
        self, method: str, url: str, lease: ProxyLease | None, kw: Mapping[str, Any], limit: int | None = None
    ) -> requests.Response:
        """One request, through ``lease`` (or direct), with browser headers and a timeout inside the lease;
        ``limit``: read at most that many bytes of the body (robots.txt), the rest is never read."""
        options = dict(kw)
        options.pop("stream", None)  # the body is read before the proxy goes back (latency, captcha check)
        headers = browser_headers(self.user_agents)
        headers.update(options.pop("headers", None) or {})
        timeout = options.pop("timeout", self.timeout)
        if lease is None:
            response = self.session.request(method, url, headers=headers, timeout=timeout, proxies={},
                                            stream=limit is not None, **options)
            if limit is not None:
                read_at_most(response, limit)
            return response
        # Never outlive the lease: once the lock expires another worker may use this proxy × domain.
        # The connect and the answer's head fit the budget together; the body is read by its end
        # (a per-read timeout alone lets a trickling body run on for ever).
        budget = max(0.5, lease.seconds * 0.9)
        deadline = time.monotonic() + budget
        response = self.session.request(method, url, headers=headers, timeout=within(timeout, budget),
                                        proxies=lease.proxies, stream=True, **options)
        read_at_most(response, limit, deadline)  # the whole body when limit is None
        return response

    def _borrow(
        self, domain: str, used: list[str], deadline: float, url: str, outcomes: list[str],
        gate: HostPacer | None = None,
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
                if gate is not None and reason in POLITENESS_REFUSALS:
                    gate.defer(domain, exc.retry_after)
                    raise HostNotReady(f"no proxy for {domain} now ({reason}); host deferred "
                                       f"{exc.retry_after:.2f}s", host=domain,
                                       retry_after=exc.retry_after) from None
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
        """Return the lease with its outcome; a failed return is logged, never raised."""
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
        """Sleep before the next rotation (exponential, jittered, at least Retry-After), or raise a
        retryable FetchError when that would pass the wait budget."""
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
        """The configured random pause before a request to ``domain``."""
        spec = self.politeness
        if isinstance(spec, Mapping):
            spec = spec.get(domain, spec.get("*", (0.0, 0.0)))
        low, high = spec
        if high > 0:
            self._sleep(random.uniform(low, high))

    def _refresh_providers(self) -> None:
        """Ask every provider for fresh proxies (the pool ran empty)."""
        for provider in self.providers:
            try:
                provider.refresh()
            except Exception as exc:  # a provider outage must not fail the page: the pool may still serve
                log.warning("proxy provider %r refresh failed: %s", provider, mask_url(str(exc)))

    def _fetch_robots(self, robots_url: str, domain: str) -> requests.Response:
        """robots.txt goes through the rotation loop (and the pool), so it counts against the site's
        limits, and through the gate of the fetch that needs it when it is on that fetch's host
        (spaced like a page, a 429/503 blocks the host); a block, a missing file or a redirect (the
        cache follows it) is returned as an answer for the cache to read."""
        local = self._robots_gate
        gate = getattr(local, "gate", None) if getattr(local, "domain", None) == domain else None
        return self._fetch(robots_url, domain, "GET", {"allow_redirects": False}, robots=True, gate=gate)
