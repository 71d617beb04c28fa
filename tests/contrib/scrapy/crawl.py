"""One real Scrapy crawl in its own process: ``python -m tests.contrib.scrapy.crawl CONFIG.json``.

The tests start one or more of these (real Twisted reactor, real downloads through the proxy farm)
and read what they leave behind: the JSON written at ``spider_closed`` (pages with the proxies each
one went through, failures, the stats collector, the longest stall of the reactor) and the log file.

CONFIG holds ``urls``, ``out`` (the JSON to write), ``settings`` (Scrapy settings, merged over the
README snippet below) and optionally ``skip`` (URLs sent with ``meta['celery_ha_skip']``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import CrawlerProcess
from twisted.python.failure import Failure

from celery_ha.contrib.scrapy import keys
from celery_ha.contrib.scrapy.clock import looping_call

#: The README's settings snippet, as a project would paste it.
SNIPPET: dict[str, Any] = {
    "DOWNLOADER_MIDDLEWARES": {
        "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        "celery_ha.contrib.scrapy.CeleryHARetryMiddleware": 550,
        "celery_ha.contrib.scrapy.CeleryHAProxyMiddleware": 950,
    },
}
#: What every test crawl shares: a quiet, fast, deterministic Scrapy.
BASE: dict[str, Any] = {
    "ROBOTSTXT_OBEY": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "DEBUG",
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    "DOWNLOAD_DELAY": 0,
    "DOWNLOAD_TIMEOUT": 10,
    "CELERY_HA_SCRAPY_BACKOFF_BASE": 0.05,
    "CELERY_HA_SCRAPY_BACKOFF_CAP": 2.0,
}


class CasesSpider(Spider):
    """Fetches the given URLs and records, per page, how it got there."""

    name = "cases"

    def __init__(self, urls: list[str], skip: list[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.urls = urls
        self.skip = set(skip)
        self.pages: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []

    async def start(self) -> AsyncIterator[Request]:
        for url in self.urls:
            meta = {keys.SKIP: True} if url in self.skip else {}
            yield Request(url, callback=self.parse, errback=self.failed, meta=meta)

    def parse(self, response: Any) -> None:
        meta = response.meta
        self.pages.append({
            "url": response.url,
            "status": response.status,
            "proxy": meta.get(keys.PROXY),
            "tried": list(meta.get(keys.TRIED) or []),
            "rotations": meta.get(keys.ROTATIONS, 0),
            "retry_times": meta.get(keys.RETRY_TIMES, 0),
            "meta_proxy": meta.get("proxy"),
            "auth_header": bool(response.request.headers.get("Proxy-Authorization")),
        })

    def failed(self, failure: Failure) -> None:
        request = getattr(failure, "request", None)
        self.failures.append({"url": request.url if request is not None else None,
                              "error": failure.type.__name__ if failure.type else "?",
                              "message": str(failure.value),
                              "tried": list((request.meta.get(keys.TRIED) if request is not None else None)
                                            or [])})


class Probe:
    """The longest gap between ticks of a 20 ms looping call: how long the reactor was blocked."""

    def __init__(self) -> None:
        self.last = 0.0
        self.max_gap = 0.0
        self.loop: Any = None

    def start(self) -> None:
        """Called once the reactor runs (a looping call needs the crawl's event loop)."""
        self.loop = looping_call(self.tick)
        self.loop.start(0.02)

    def stop(self) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()

    def tick(self) -> None:
        now = time.monotonic()
        if self.last:
            self.max_gap = max(self.max_gap, now - self.last)
        self.last = now


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        config = json.load(fh)
    settings = {**BASE, **SNIPPET, **config.get("settings", {})}
    process = CrawlerProcess(settings=settings)
    crawler = process.create_crawler(CasesSpider)
    probe = Probe()

    def opened(spider: Spider) -> None:
        probe.start()

    def closed(spider: Spider) -> None:
        probe.stop()

    crawler.signals.connect(opened, signal=signals.spider_opened)
    crawler.signals.connect(closed, signal=signals.spider_closed)
    process.crawl(crawler, urls=config["urls"], skip=config.get("skip", []))
    process.start()
    # Written after the reactor stopped, so every spider_closed receiver (the middleware's close
    # sweep included) has run and its stats are in.
    spider = crawler.spider
    stats = dict(crawler.stats.get_stats()) if crawler.stats else {}
    with open(config["out"], "w", encoding="utf-8") as fh:
        json.dump({"pages": spider.pages, "failures": spider.failures, "max_gap": probe.max_gap,
                   "stats": stats}, fh, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
