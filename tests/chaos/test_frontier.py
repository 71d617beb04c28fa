"""The host gate end to end: real Celery workers run ``fetch_page`` against real HTTP sites, one per
loopback address (127.0.0.x), and politeness is judged from each site's own request log.

* fairness: a small host B queued behind a rate-limited host A finishes long before A, and A's rate is
  never exceeded at the site;
* a 429 with Retry-After holds the host for every pool process, not only the one that got it;
* a robots.txt Crawl-delay spaces a host's pages for the whole fleet.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from celery_ha.state import TaskQueue
from tests.support.celery_helpers import Cluster, wait_for

pytestmark = pytest.mark.timeout(240)


class LogSite:
    """A site on its own loopback address that logs (time, path, status) of every request."""

    def __init__(self, address: str, robots: str | None = None, too_many_at: int | None = None,
                 retry_after: str | None = None) -> None:
        self.robots = robots
        self.too_many_at = too_many_at  # the n-th page request (1-based) answers 429
        self.retry_after = retry_after
        self.log: list[tuple[float, str, int]] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                now = time.time()
                headers: dict[str, str] = {}
                with site.lock:
                    pages = sum(1 for _, p, _ in site.log if p != "/robots.txt")
                    if self.path == "/robots.txt":
                        status, body = (200, site.robots) if site.robots else (404, "none")
                    elif site.too_many_at is not None and pages + 1 == site.too_many_at:
                        status, body = 429, "slow down"
                        if site.retry_after:
                            headers["Retry-After"] = site.retry_after
                    else:
                        status, body = 200, f"<html><title>{self.path}</title>page</html>"
                    site.log.append((now, self.path, status))
                data = body.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.host = f"{address}:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def urls(self, n: int) -> list[str]:
        return [f"http://{self.host}/p/{i}" for i in range(n)]

    def pages(self) -> list[tuple[float, str, int]]:
        with self.lock:
            return [e for e in self.log if e[1] != "/robots.txt"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sites() -> Iterator[list[LogSite]]:
    made: list[LogSite] = []
    yield made
    for s in made:
        s.close()


def gated(cluster: Cluster) -> TaskQueue:
    return TaskQueue(cluster.q.client, cluster.namespace, host_gate=True)


def most_in_window(times: list[float], window: float) -> int:
    ts = sorted(times)
    return max((sum(1 for u in ts[i:] if u - t < window) for i, t in enumerate(ts)), default=0)


def test_a_small_host_is_not_starved_behind_a_rate_limited_one(make_cluster: Any, sites: list[LogSite]
                                                                ) -> None:
    a, b = LogSite("127.0.0.2"), LogSite("127.0.0.3")
    sites += [a, b]
    cluster = make_cluster(CELERY_HA_HOSTS="1", CELERY_HA_OBEY_ROBOTS="0")
    q = gated(cluster)
    q.hosts.set(a.host, rate="4/1")
    ids = q.enqueue_many(a.urls(16)) + q.enqueue_many(b.urls(8))
    cluster.worker("w1", concurrency=4)
    start = time.time()
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page")
    a_times = [t for t, _, _ in a.pages()]
    b_times = [t for t, _, _ in b.pages()]
    assert len(a_times) == 16 and len(b_times) == 8
    # B is served beside A, not after it: done within a few seconds while A takes its 4 s.
    b_done, a_done = max(b_times) - start, max(a_times) - start
    assert b_done < 3.0 and a_done > 3.5, (b_done, a_done)
    # A's limit, as its own log saw it: never more than 4 requests in any 1 s window (the gate spaces
    # them by 250 ms from each request's start, on the Redis clock).
    assert most_in_window(a_times, 1.0) <= 4
    gaps = [t2 - t1 for t1, t2 in itertools.pairwise(a_times)]
    assert min(gaps) >= 0.245, gaps
    # ... and A reached close to its rate (16 pages at 4/s: 3.75 s between the first and the last).
    assert max(a_times) - min(a_times) < 3.75 * 1.4


def test_a_429_with_retry_after_holds_the_host_for_every_process(make_cluster: Any, sites: list[LogSite]
                                                                 ) -> None:
    c = LogSite("127.0.0.4", too_many_at=3, retry_after="3")
    sites.append(c)
    cluster = make_cluster(CELERY_HA_HOSTS="1", CELERY_HA_OBEY_ROBOTS="0")
    q = gated(cluster)
    q.hosts.set(c.host, rate="20/1")  # fast enough that four processes would pile on without the gate
    ids = q.enqueue_many(c.urls(12))
    cluster.worker("w1", concurrency=4)
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page")
    log = c.pages()
    refused = next(t for t, _, status in log if status == 429)
    after = [t for t, _, _ in log if t > refused + 0.1]
    assert after and min(after) >= refused + 3.0 - 0.05, [round(t - refused, 2) for t in after]
    stats = q.stats()
    assert stats["failed"] == 0 and stats["reclaimed"] == 0  # handed back, not counted
    assert q.get(ids[0]).attempts == 0


def test_crawl_delay_spaces_a_host_for_the_whole_fleet(make_cluster: Any, sites: list[LogSite]) -> None:
    d = LogSite("127.0.0.5", robots="User-agent: *\nCrawl-delay: 1\n")
    sites.append(d)
    cluster = make_cluster(CELERY_HA_HOSTS="1", CELERY_HA_HOST_CONCURRENCY="1")
    q = gated(cluster)
    ids = q.enqueue_many(d.urls(5))
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page")
    times = sorted(t for t, _, _ in d.pages())
    assert len(times) == 5
    gaps = [t2 - t1 for t1, t2 in itertools.pairwise(times)]
    assert min(gaps) >= 0.98, gaps
    assert q.hosts.get(d.host).crawl_delay == 1.0
