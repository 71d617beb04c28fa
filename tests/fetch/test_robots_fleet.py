"""robots.txt with real prefork workers: one request per site and TTL for the whole fleet, and a site
whose robots.txt answers 5xx gets no page request until it answers again, its tasks kept.

Each pool process has its own fetcher; what they share is the namespace's Redis
(``state/robots_store.py``). Sites on 127.0.0.2-5, each judged by its own log of arrivals.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_ha.state import TaskQueue
from tests.support.celery_fixtures import make_cluster  # noqa: F401  (fixture)
from tests.support.celery_helpers import Cluster, wait_for
from tests.support.robots_site import Arrival, RobotsSite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RULES = "User-agent: *\nDisallow: /private\n"


@pytest.fixture
def sites() -> Iterator[list[RobotsSite]]:
    made: list[RobotsSite] = []
    yield made
    for s in made:
        s.close()


def test_each_site_sees_robots_txt_once_for_the_whole_fleet(make_cluster: Any,  # noqa: F811
                                                            sites: list[RobotsSite]) -> None:
    """Two workers of three pool processes each crawl three sites whose robots.txt is slow: many
    processes miss at once, one fetches, the others wait for its answer in Redis and obey it."""
    sites += [RobotsSite(f"127.0.0.{n}", robots=RULES, robots_secs=0.5).start() for n in (2, 3, 4)]
    cluster: Cluster = make_cluster()  # robots.txt obeyed (the default), TTL 3600 s
    pages = {s: s.urls(12) for s in sites}
    private = {s: [s.url("/private/x")] for s in sites}
    # Round robin over the sites, so the first hand-outs put two processes on each site at once.
    ids = cluster.q.enqueue_many([u for trio in zip(*pages.values(), strict=True) for u in trio])
    refused = cluster.q.enqueue_many([u for s in sites for u in private[s]])
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=120, interval=0.2, message="every page crawled")
    wait_for(lambda: all(i is not None and i.state == "dead" for i in cluster.q.get_many(refused)),
             timeout=30, interval=0.2, message="the disallowed pages refused")

    for s in sites:
        assert {s.url(a.path) for a in s.pages()} == set(pages[s]), s.host  # every page, nothing private
    counts = {s.host: [(round(a.at - a0, 3), a.port) for a in s.hits("/robots.txt")]
              for s in sites for a0 in [s.log[0].at]}
    # Once per site, however long the fetching process took (the others wait while it holds the fetch
    # lock). Per process it was 3-6; with a fixed 5 s wait, a second one on a loaded machine.
    assert all(len(n) == 1 for n in counts.values()), counts
    # Several pool processes crawled each site (one keep-alive connection each): the one robots.txt
    # request served them all.
    connections = {s.host: len({a.port for a in s.pages()}) for s in sites}
    assert all(n >= 2 for n in connections.values()), connections
    for info in cluster.q.get_many(refused):
        assert info is not None and "robots.txt disallows" in (info.error or "")


def _bursts(arrivals: list[Arrival], apart: float) -> list[list[Arrival]]:
    """Arrivals grouped into bursts: a gap longer than ``apart`` starts the next."""
    out: list[list[Arrival]] = []
    for a in sorted(arrivals, key=lambda a: a.at):
        if out and a.at - out[-1][-1].at <= apart:
            out[-1].append(a)
        else:
            out.append([a])
    return out


def test_a_5xx_robots_txt_holds_the_pages_until_it_answers_and_loses_no_task(
        make_cluster: Any, sites: list[RobotsSite]) -> None:  # noqa: F811
    """RFC 9309 §2.3.1.4: while robots.txt answers 5xx the site is fully disallowed, for now. Gated
    tasks go back to their host uncounted (no attempt, no stall: none dies however long it lasts),
    the fleet asks robots.txt again once per hold (min(60 s, CELERY_HA_ROBOTS_TTL): 3 s here), and
    the pages are crawled once it answers 200."""
    site = RobotsSite("127.0.0.5", robots=RULES, robots_status=500).start()
    sites.append(site)
    hold = 3.0
    cluster: Cluster = make_cluster(CELERY_HA_HOSTS="1", CELERY_HA_ROBOTS_TTL=str(hold))
    q = TaskQueue(cluster.q.client, cluster.namespace, host_gate=True)
    ids = q.enqueue_many(site.urls(4))
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2)
    cluster.pump()
    # Three rounds of robots.txt requests: the hold ran out twice and the fleet asked again.
    wait_for(lambda: len(_bursts(site.hits("/robots.txt"), 1.5)) >= 3, timeout=60, interval=0.1,
             message="robots.txt asked again after two holds")
    infos = q.get_many(ids)
    assert all(i is not None and i.state not in ("dead", "completed") and i.attempts == 0
               for i in infos), infos
    stats = q.stats()
    assert stats["dead"] == 0 and stats["failed"] == 0, stats
    site.robots_status = 200
    answered = time.time()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, interval=0.2, message="every page crawled")

    assert {site.url(a.path) for a in site.pages()} == set(site.urls(4))
    assert all(a.at > answered for a in site.pages()), "a page was requested while robots.txt was 5xx"
    stats = q.stats()
    assert stats["dead"] == 0 and stats["failed"] == 0, stats
    # Each round of the outage is one process's tries (3 direct tries, a fraction of a second), and
    # the rounds are a hold apart: the fleet did not hammer the site.
    outage = _bursts([a for a in site.hits("/robots.txt") if a.status == 500], 1.5)
    assert all(len(burst) <= 3 for burst in outage), [len(b) for b in outage]
    gaps = [b[0].at - a[-1].at for a, b in itertools.pairwise(outage)]
    assert all(gap >= hold - 0.5 for gap in gaps), gaps
