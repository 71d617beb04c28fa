"""robots.txt, fetched once per site and kept for a while, so obeying it costs one request per site.

The file is fetched through the same rotation loop as pages (through the pool, so it counts against the
site's rate limits); the cache only decides when to fetch it and how to read the answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from urllib import robotparser
from urllib.parse import urlsplit, urlunsplit

import requests

from celery_ha.fetch.errors import PermanentFetchError

#: Fetches ``robots_url`` for ``domain``; a missing file may raise PermanentFetchError.
RobotsFetch = Callable[[str, str], requests.Response]


class RobotsCache:
    """Parsed robots.txt per ``scheme://domain``, refreshed after ``ttl`` seconds. Thread-safe.

    Two threads that miss at once may both fetch the file; the later answer wins. That is cheaper than
    holding a lock across a network request.
    """

    def __init__(self, fetch: RobotsFetch, agent: str = "*", ttl: float = 3600.0) -> None:
        self.agent = agent
        self.ttl = ttl
        self._fetch = fetch
        self._parsers: dict[str, tuple[float, robotparser.RobotFileParser]] = {}
        self._lock = threading.Lock()

    def allowed(self, url: str, domain: str) -> bool:
        """Whether robots.txt of ``url``'s site lets our agent fetch ``url``."""
        parts = urlsplit(url)
        base = f"{parts.scheme}://{domain}"
        now = time.monotonic()
        with self._lock:
            cached = self._parsers.get(base)
        if cached is None or cached[0] < now:
            host = parts.netloc.rsplit("@", 1)[-1]  # never send a URL's credentials to robots.txt
            parser = self._load(urlunsplit((parts.scheme, host, "/robots.txt", "", "")), domain)
            cached = (now + self.ttl, parser)
            with self._lock:
                self._parsers[base] = cached
        return cached[1].can_fetch(self.agent, url)

    def crawl_delay(self, url: str, domain: str) -> float | None:
        """robots.txt's ``Crawl-delay`` for our agent on ``url``'s site (None when it sets none); the
        file is loaded as :meth:`allowed` loads it."""
        self.allowed(url, domain)  # loads (or reuses) the cached file
        with self._lock:
            cached = self._parsers.get(f"{urlsplit(url).scheme}://{domain}")
        if cached is None:
            return None
        delay = cached[1].crawl_delay(self.agent)
        return float(delay) if delay is not None else None

    def _load(self, robots_url: str, domain: str) -> robotparser.RobotFileParser:
        """Fetch and parse robots.txt: missing (4xx) allows everything, 401/403 forbids everything."""
        parser = robotparser.RobotFileParser(robots_url)
        try:
            response = self._fetch(robots_url, domain)
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
