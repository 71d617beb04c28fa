"""The shipped ``sitemap`` task on a real worker: it queues a site's pages from robots.txt, resumes
from its checkpoint after its pool process is SIGKILLed mid-document, and a later run (the schedule)
queues only the pages whose lastmod moved."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_ha.state import task_id_for
from tests.support.celery_helpers import wait_for
from tests.support.sitemap_site import Route, SitemapSite, index, urlset

pytestmark = pytest.mark.slow


@pytest.fixture
def sitemap_site() -> Iterator[SitemapSite]:
    s = SitemapSite().start()
    yield s
    s.stop()


def test_sitemap_task_resumes_after_a_kill_and_rereads_only_changes(make_cluster, sitemap_site):
    site = sitemap_site
    u = site.url
    lastmod: dict[str, str] = {}
    site.routes["/robots.txt"] = Route(lambda: [f"User-agent: *\nSitemap: {u}/index.xml\n".encode()],
                                       content_type="text/plain")
    site.routes["/index.xml"] = Route(lambda: index([f"{u}/a.xml.gz", f"{u}/b.xml.gz"]))
    site.routes["/a.xml.gz"] = Route(lambda: urlset((f"{u}/a/{i}", lastmod.get(f"a{i}", "2021-01-01"))
                                                    for i in range(300)), gzip=True)
    # b stops after its first 150 entries until the test lets it go on, so the kill lands while the
    # task is reading it, however slow the machine.
    release = threading.Event()

    def b_body() -> Iterator[bytes]:
        for n, chunk in enumerate(urlset(((f"{u}/b/{i}", "2021-01-01") for i in range(300)), per_chunk=10)):
            if n == 16:  # the header, then 15 chunks of 10 entries
                release.wait(180)
            yield chunk

    site.routes["/b.xml.gz"] = Route(b_body, gzip=True)
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    cluster.worker("w1", concurrency=2)
    tid = cluster.q.enqueue(f"{u}/robots.txt", task="sitemap",
                            meta={"child_task": "test_noop", "batch_size": 50})
    cluster.pump()

    def position() -> list[int]:
        return (cluster.q.checkpoint(tid) or {}).get("position") or [0, 0, 0, 0]

    wait_for(lambda: position()[2] == 1 and position()[3] >= 100, timeout=120, message="a third of b read")
    pid = int(cluster.q.get(tid).worker.rsplit(":", 1)[1])
    os.kill(pid, signal.SIGSTOP)  # paused first: the kill must land while b is still being read
    info = cluster.q.get(tid)
    assert info.state == "running" and info.worker.endswith(f":{pid}") and position()[3] < 300, info
    os.kill(pid, signal.SIGKILL)
    release.set()
    wait_for(lambda: cluster.state(tid) == "completed", timeout=60, message="sitemap task completion")
    wait_for(lambda: cluster.q.stats()["completed"] == 601, timeout=120, message="every page task")
    paths = site.paths()
    # Resumed inside b: robots.txt and the index read again, a (before the checkpoint) never again.
    assert paths.count("/a.xml.gz") == 1 and paths.count("/b.xml.gz") == 2, paths
    assert paths.count("/robots.txt") == 2 and paths.count("/index.xml") == 2, paths
    stats = cluster.q.stats()
    assert stats["enqueued"] == 601 and stats["dead"] == 0  # every page queued once
    assert stats["duplicates"] <= 50  # at most the one batch queued after the last checkpoint
    assert cluster.q.get(tid).stalls == 1

    # The next scheduled run: nothing changed, nothing is queued; then two pages change.
    before = cluster.q.stats()
    assert cluster.q.recrawl([tid]) == {tid: "queued"}
    cluster.pump()
    wait_for(lambda: cluster.state(tid) == "completed" and cluster.q.stats()["recrawled"] == 1,
             timeout=60, message="second run")
    after = cluster.q.stats()
    assert (after["enqueued"], after["duplicates"]) == (before["enqueued"], before["duplicates"])
    later = datetime.fromtimestamp(time.time() + 60, tz=timezone.utc).isoformat()
    lastmod["a7"] = lastmod["a8"] = later
    assert cluster.q.recrawl([tid]) == {tid: "queued"}
    cluster.pump()
    # recrawled: the task's second and third runs, then the two changed pages queued again.
    wait_for(lambda: cluster.q.stats()["recrawled"] == 2 + 2, timeout=60, message="third run")
    changed = [task_id_for("test_noop", f"{u}/a/{i}") for i in (7, 8)]
    wait_for(lambda: cluster.all_completed([tid, *changed]), timeout=60, message="changed pages done")
    assert cluster.q.stats()["enqueued"] == before["enqueued"] + 2


def test_an_unreadable_lastmod_completes_and_bad_meta_fails_at_once(make_cluster, sitemap_site):
    """One lastmod with a zone of +24:00 is read as none (the run completes with every page queued),
    and a meta the task can never use ("max_depth": "x") fails it on its first attempt, not after
    every retry has met it again."""
    site = sitemap_site
    u = site.url
    site.routes["/s.xml"] = Route(lambda: urlset(
        (f"{u}/p/{i}", "2024-01-01T10:00:00+24:00" if i == 150 else "2024-01-01") for i in range(250)))
    site.routes["/t.xml"] = Route(lambda: urlset((f"{u}/t/{i}", None) for i in range(5)))
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    cluster.worker("w1", concurrency=2)
    good = cluster.q.enqueue(f"{u}/s.xml", task="sitemap", max_attempts=3,
                             meta={"child_task": "test_noop", "batch_size": 100})
    bad = cluster.q.enqueue(f"{u}/t.xml", task="sitemap", max_attempts=3,
                            meta={"child_task": "test_noop", "max_depth": "x"})
    cluster.pump()
    wait_for(lambda: cluster.state(bad) == "dead", timeout=60, message="the bad-meta task dead")
    info = cluster.q.get(bad)
    assert info.attempts == 1 and "bad meta" in (info.error or ""), info
    assert "/t.xml" not in site.paths()  # failed before fetching anything
    wait_for(lambda: cluster.state(good) == "completed", timeout=60, message="the sitemap task")
    assert cluster.q.get(good).attempts == 0
    assert site.paths().count("/s.xml") == 1
    wait_for(lambda: cluster.q.stats()["completed"] == 251, timeout=60, message="every page task")
