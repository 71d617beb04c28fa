"""robots.txt, fetched once per site and TTL for the whole fleet, read as RFC 9309 says.

The file is fetched through the same rotation loop as pages (through the pool and the host gate, so
it counts against the site's limits); this module decides when to fetch it and how to read the
answer:

* 2xx: the rules, parsed from at most ``ROBOTS_MAX_BYTES`` (512 KiB; RFC 9309 §2.5 asks for at
  least 500 KiB); a file cut there loses its unfinished last line, never a rule's tail. They are
  matched as §2.2 says (``robots_file.RobotsRules``, through Protego: the agent's group, the longest
  matching rule, ``*``/``$`` wildcards);
* 3xx: followed, up to five hops (§2.3.1.2), then read as "no file";
* 401/403: everything forbidden (this crawler's choice, kept from earlier releases);
* any other 4xx, or no file: no rules, everything allowed (§2.3.1.3);
* 5xx, or every try failed in transport: *unreachable* (§2.3.1.4: complete disallow, for now). The
  page is not fetched: :class:`RobotsUnreachable` is a retryable FetchError (an ungated task's
  attempt fails and is retried with the queue's backoff; for a gated one the fetcher defers the host
  and hands the task back uncounted, ``fetcher.py``), and the answer is held only
  ``min(UNREACHABLE_HOLD, ttl)`` so the site is asked again soon. A 429/503 of a gated fetch blocks
  the host through the gate (HostNotReady) before it gets here.

With a :class:`celery_ha.state.robots_store.RobotsStore` (every worker process has one) the answer
lives in Redis for ``ttl`` seconds, shared by the fleet: a miss takes a short fetch lock, so one
process fetches while the others poll the key for as long as that lock is held: the holder keeps it
alive while its request runs (a slow site or a loaded machine makes no second request), and the lock
of a holder that died or froze lapses within ``LOCK_SECONDS``; the first waiter then takes it and
fetches. Each process keeps its parsed
copy for at most ``LOCAL_HOLD`` seconds (or what the Redis copy has left), so a page costs no Redis
read. Without a store (plain library use) the
cache is per process, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import host_of_url
from celery_ha.fetch.errors import FetchError, PermanentFetchError
from celery_ha.fetch.robots_file import ALLOW, DENY, RULES, UNREACHABLE, RobotsFile, RobotsRules

log = logging.getLogger(__name__)

#: Fetches ``robots_url`` for ``domain`` (without following redirects); may raise FetchError.
RobotsFetch = Callable[[str, str], requests.Response]

#: Redirects followed before the file is read as absent (RFC 9309 §2.3.1.2: at least five).
MAX_REDIRECTS = 5
#: Seconds an unreachable answer (5xx, transport) is held before the site is asked again.
UNREACHABLE_HOLD = 60.0
#: Seconds a process trusts its parsed copy of a shared answer before it reads Redis again.
LOCAL_HOLD = 60.0
#: Seconds between two looks at the key while another process fetches.
POLL_INTERVAL = 0.1
#: Seconds the fetch lock lives unless its holder renews it (every third of it, while its request
#: runs; freed at once after): what the others wait at most for a holder that died or froze.
LOCK_SECONDS = 6.0
#: Origins a process keeps parsed at most (expired ones are dropped first, then the oldest).
LOCAL_MAX = 10_000
#: FetchError outcomes that mean the site was tried and did not answer usably.
_TRIED = ("server", "transport", "blocked")


class RobotsUnreachable(FetchError):
    """robots.txt of the page's site answered 5xx or not at all: the page is not fetched now
    (RFC 9309 §2.3.1.4); retryable, after ``retry_after`` seconds (what the answer is still held)."""


class SharedRobots(Protocol):
    """Where the fleet's answers live (``celery_ha.state.robots_store.RobotsStore`` is one)."""

    def read(self, origin: str) -> tuple[str, float] | None: ...

    def write(self, origin: str, value: str, seconds: float) -> None: ...

    def lock(self, origin: str, seconds: float) -> str | None: ...

    def extend(self, origin: str, token: str, seconds: float) -> bool: ...

    def unlock(self, origin: str, token: str) -> None: ...


@dataclass(frozen=True)
class _Parsed:
    until: float  # time.monotonic() after which the copy is read again
    robots: RobotsFile
    rules: RobotsRules  # the file read for this cache's agent


class RobotsCache:
    """Parsed robots.txt per ``scheme://host[:port]``, trusted ``ttl`` seconds. Thread-safe.

    Without ``store``, two threads of a process that miss at once may both fetch the file (the later
    answer wins: cheaper than holding a lock across a network request). With ``store`` the fleet
    shares one fetch per origin and TTL (see the module's docstring).
    """

    def __init__(self, fetch: RobotsFetch, agent: str = "*", ttl: float = 3600.0,
                 store: SharedRobots | None = None, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.agent = agent
        self.ttl = ttl
        self.store = store
        self._fetch = fetch
        self._sleep = sleep
        self._parsed: dict[str, _Parsed] = {}
        self._lock = threading.Lock()

    def allowed(self, url: str, domain: str) -> bool:
        """Whether robots.txt of ``url``'s site lets our agent fetch ``url``; RobotsUnreachable when
        the file could not be read (5xx, transport) and the page must wait."""
        return self._get(url, domain).rules.allowed(url)

    def crawl_delay(self, url: str, domain: str) -> float | None:
        """robots.txt's ``Crawl-delay`` for our agent on ``url``'s site (None when it sets none); the
        file is loaded as :meth:`allowed` loads it."""
        return self._get(url, domain).rules.crawl_delay()

    def hold(self, robots: RobotsFile) -> float:
        """Seconds an answer is trusted: the TTL, or the short hold of an unreachable one."""
        return min(UNREACHABLE_HOLD, self.ttl) if robots.verdict == UNREACHABLE else self.ttl

    # ------------------------------------------------------------------ the copies
    def _get(self, url: str, domain: str) -> _Parsed:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{domain}"
        now = time.monotonic()
        with self._lock:
            parsed = self._parsed.get(origin)
        if parsed is None or parsed.until <= now:
            host = parts.netloc.rsplit("@", 1)[-1]  # never send a URL's credentials to robots.txt
            robots_url = urlunsplit((parts.scheme, host, "/robots.txt", "", ""))
            if self.store is None:
                robots = self._read(robots_url, domain)
                left = self.hold(robots)
            else:
                robots, left = self._shared(origin, robots_url, domain)
                left = min(LOCAL_HOLD, left)
            keep = parsed if parsed is not None and parsed.robots.same(robots) else None
            parsed = _Parsed(time.monotonic() + left, robots,
                             keep.rules if keep is not None else robots.rules(self.agent))
            self._keep(origin, parsed)
        if parsed.robots.verdict == UNREACHABLE:
            wait = max(0.0, parsed.until - time.monotonic())
            raise RobotsUnreachable(
                f"robots.txt of {origin} is unreachable ({parsed.robots.reason}); its pages wait "
                f"{wait:.0f}s", url=url, outcome="robots", status=parsed.robots.status,
                retry_after=wait)
        return parsed

    def _keep(self, origin: str, parsed: _Parsed) -> None:
        with self._lock:
            if len(self._parsed) >= LOCAL_MAX and origin not in self._parsed:
                now = time.monotonic()
                for stale in [o for o, p in self._parsed.items() if p.until <= now]:
                    del self._parsed[stale]
                while len(self._parsed) >= LOCAL_MAX:
                    del self._parsed[next(iter(self._parsed))]  # the oldest stored
            self._parsed[origin] = parsed

    def _shared(self, origin: str, robots_url: str, domain: str) -> tuple[RobotsFile, float]:
        """The fleet's answer for ``origin`` and the seconds it has left: read from the store, or
        fetched by this process under the fetch lock. While another process holds the lock this one
        polls the key: the lock (renewed while its holder fetches, freed after, lapsing within
        ``LOCK_SECONDS`` when its holder died or froze) is what ends the wait, not a clock of its
        own, so a slow holder is waited for."""
        assert self.store is not None
        started = time.monotonic()
        while True:
            found = self._stored(origin)
            if found is not None:
                return found
            token = self.store.lock(origin, LOCK_SECONDS)
            if token is not None:
                try:
                    found = self._stored(origin)  # written meanwhile
                    if found is not None:
                        return found
                    waited = time.monotonic() - started
                    if waited >= LOCK_SECONDS:
                        log.warning("robots.txt of %s: the process fetching it stopped renewing its lock "
                                    "(waited %.0fs); fetching it here", origin, waited)
                    with self._renewing(origin, token):
                        robots = self._read(robots_url, domain)
                    left = self.hold(robots)
                    self.store.write(origin, robots.encode(), left)
                    log.info("robots.txt of %s fetched for the fleet: %s (%s), kept %.0fs", origin,
                             robots.verdict, robots.reason, left)
                    return robots, left
                finally:
                    self.store.unlock(origin, token)
            self._sleep(POLL_INTERVAL)

    @contextlib.contextmanager
    def _renewing(self, origin: str, token: str) -> Iterator[None]:
        """Keep the fetch lock alive while the body runs (a thread renews it every third of
        ``LOCK_SECONDS``): a frozen or killed process renews nothing, so its lock lapses."""
        assert self.store is not None
        store, stop = self.store, threading.Event()

        def renew() -> None:
            while not stop.wait(LOCK_SECONDS / 3) and store.extend(origin, token, LOCK_SECONDS):
                pass

        keeper = threading.Thread(target=renew, name=f"robots-lock {origin}", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()

    def _stored(self, origin: str) -> tuple[RobotsFile, float] | None:
        assert self.store is not None
        found = self.store.read(origin)
        if found is None:
            return None
        robots = RobotsFile.decode(found[0])
        return None if robots is None or found[1] <= 0 else (robots, found[1])

    # ------------------------------------------------------------------ the fetch
    def _read(self, robots_url: str, domain: str) -> RobotsFile:
        """Fetch robots.txt (following up to MAX_REDIRECTS redirects) and read the answer."""
        url, hop_domain = robots_url, domain
        status: int | None = None
        for hop in range(MAX_REDIRECTS + 1):
            try:
                response = self._fetch(url, hop_domain)
            except PermanentFetchError as exc:
                return RobotsFile.of(ALLOW, exc.status)  # no robots.txt
            except InvalidInput:
                if not hop:
                    raise
                return RobotsFile.of(ALLOW, status)  # redirected to an unusable URL: no file
            except FetchError as exc:
                if exc.outcome not in _TRIED:
                    raise  # nothing reached the site (no proxy in time): nothing learned
                return RobotsFile.of(UNREACHABLE, exc.status)
            status = response.status_code
            location = response.headers.get("Location")
            if not (300 <= status < 400 and location):
                return RobotsFile.from_answer(status, response.content)
            response.close()
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("http", "https"):
                return RobotsFile.of(ALLOW, status)  # redirected off http(s): no file
            hop_domain = host_of_url(url)
        return RobotsFile.of(ALLOW, status)  # more than MAX_REDIRECTS redirects: no file


__all__ = ["ALLOW", "DENY", "MAX_REDIRECTS", "RULES", "UNREACHABLE", "RobotsCache", "RobotsFetch",
           "RobotsFile", "RobotsUnreachable", "SharedRobots"]
