"""Real workers on the shipped tasks: a paginated crawl killed half-way, graceful shutdown, and the
bounded broker window under a 100,000-task backlog."""

from __future__ import annotations

import json
import os
import signal
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from celery_ha.base.errors import TaskNotFound
from celery_ha.base.settings import Settings
from celery_ha.integration.dispatch.broker import broker_backlog, broker_lists
from celery_ha.state import task_id_for
from celery_ha.state.sink import count_items, iter_items
from tests.support.celery_helpers import wait_for
from tests.support.sitemap_site import Route, SitemapSite

pytestmark = pytest.mark.slow


def _list_pages(site, since: float = 0.0) -> list[int]:
    out = []
    for req in site.hits(prefix="/cases?"):
        if req.time > since:
            out.append(int(parse_qs(urlsplit(req.path).query)["page"][0]))
    return out


def test_crawl_killed_at_page_30_resumes_and_sink_is_exact(make_cluster, site):
    """(f) crawl_list over 60 pages, its pool child SIGKILLed at page 30: it resumes at the last
    checkpoint (every 50 items), every list item is stored once, every detail page fetched once."""
    site.total, site.page_size = 300, 5  # 60 pages; a checkpoint every 10 pages
    site.delays["/cases"] = 0.03
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    cluster.worker("w1", concurrency=3)
    tid = cluster.q.enqueue(site.list_url(), task="crawl_list", priority=5)
    cluster.pump()
    wait_for(lambda: 30 in _list_pages(site), timeout=30, message="page 30")
    info = cluster.q.get(tid)
    assert info.state == "running"
    killed_at = time.time()
    os.kill(int(info.worker.rsplit(":", 1)[1]), signal.SIGKILL)
    # Read the checkpoint only now: before the kill the crawler may still commit the one after page 30.
    # The resumed run commits its next one 10 pages later, so this is what it resumes from.
    checkpoint = cluster.q.checkpoint(tid) or {}
    wait_for(lambda: cluster.state(tid) == "completed", timeout=30, message="crawl completion")
    wait_for(lambda: cluster.q.stats()["completed"] == 301, timeout=60, message="detail pages")

    resumed = _list_pages(site, since=killed_at)
    # It resumed exactly at its checkpoint (a request the dying child had in flight may also be logged
    # after the kill, but that page is past the checkpoint), and never before it.
    cp = checkpoint.get("page", 1)
    assert 21 <= cp <= 31 and min(resumed) == cp and set(range(cp, 61)) <= set(resumed), (cp, resumed)
    assert sorted(set(_list_pages(site))) == list(range(1, 61))  # page 60 says "next": null
    keys = [k for k, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
    list_keys = [k for k in keys if k.startswith("id:case-")]
    assert sorted(list_keys) == [f"id:case-{n:06d}" for n in range(300)]
    assert len(keys) == len(set(keys)) == count_items(cluster.r, cluster.namespace) == 600
    details = [r.path for r in site.hits(prefix="/case/")]
    assert sorted(details) == sorted(f"/case/{n}" for n in range(300))  # each fetched exactly once
    stats = cluster.q.stats()
    assert stats["dead"] == 0
    assert cluster.q.get(tid).stalls == 1


def test_a_relative_or_unusable_item_url_is_resolved_or_skipped_not_fatal(make_cluster):
    """A list item's relative ``url`` ("/case/23") is followed on the list page's site; one that is
    no http(s) URL even then (``mailto:``) is skipped and counted, and the crawl reads on to its last
    page instead of failing at that item on every retry until dead."""
    site = SitemapSite(host="127.0.0.13").start()
    try:
        u = site.url
        odd = {(2, 3): "/case/23", (3, 1): "mailto:office@example.com", (3, 2): " "}
        for p in range(1, 5):
            items = [{"id": f"c{p}-{i}", "url": odd.get((p, i), f"{u}/case/{p}{i}")} for i in range(5)]
            body = json.dumps({"items": items, "next": p + 1 if p < 4 else None}).encode()
            site.routes[f"/cases?page={p}"] = Route(lambda body=body: [body], content_type="application/json")
        cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1",
                               CELERY_HA_OBEY_ROBOTS="0")
        w1 = cluster.worker("w1", concurrency=2)
        tid = cluster.q.enqueue(f"{u}/cases", task="crawl_list", meta={"child_task": "test_noop"},
                                max_attempts=2)
        cluster.pump()
        wait_for(lambda: cluster.state(tid) in ("completed", "dead"), timeout=60, message="the list crawl")
        info = cluster.q.get(tid)
        assert (info.state, info.attempts) == ("completed", 0), info
        lists = [p for p in site.paths() if p.startswith("/cases")]
        assert lists == [f"/cases?page={p}" for p in range(1, 5)]
        assert cluster.q.get(task_id_for("test_noop", f"{u}/case/23")) is not None  # resolved on the site
        log = cluster.log_text(w1)
        assert "page 3 item 1: not followed" in log and "page 3 item 2: not followed" in log  # and logged
        with pytest.raises(TaskNotFound):  # a blank url is skipped, not resolved to the list page itself
            cluster.q.get(task_id_for("test_noop", f"{u}/cases?page=3"))
        wait_for(lambda: cluster.q.stats()["completed"] == 1 + 18, timeout=60, message="every followed item")
        assert count_items(cluster.r, cluster.namespace) == 20  # every list item stored, the odd ones too
    finally:
        site.stop()


def test_sigterm_hands_running_task_back_with_checkpoint(make_cluster, site):
    """Graceful shutdown: SIGTERM lets the worker stop the long task after the soft-shutdown grace,
    save what it has and release the lease (no stall counted); another worker resumes it."""
    site.delays["/slow/"] = 0.1
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    w1 = cluster.worker("w1", concurrency=2)
    tid = cluster.q.enqueue(f"{site.url}/slow/G", task="test_steps", meta={"n": 60})
    cluster.pump()
    wait_for(lambda: (cluster.q.checkpoint(tid) or {}).get("i", 0) >= 5, message="progress")
    w1.send_signal(signal.SIGTERM)
    assert w1.wait(timeout=30) == 0
    info = cluster.q.get(tid)
    assert info.state in ("queued", "dispatched"), info
    assert info.stalls == 0 and info.attempts == 0
    done = cluster.q.checkpoint(tid)["i"]
    assert 5 <= done < 60
    assert cluster.q.stats()["released"] == 1
    assert count_items(cluster.r, cluster.namespace) >= done

    cluster.worker("w2", concurrency=2)
    cluster.pump()
    wait_for(lambda: cluster.state(tid) == "completed", timeout=30, message="resumed elsewhere")
    steps = [int(r.path.rsplit("/", 1)[1]) for r in site.hits(prefix="/slow/G/")]
    assert sorted(set(steps)) == list(range(60)) and len(steps) <= 61
    assert count_items(cluster.r, cluster.namespace) == 60


def test_a_sigterm_to_one_pool_process_stops_its_task_not_the_next_ones(make_cluster, site):
    """A SIGTERM sent to one pool process outside a shutdown (what ``revoke(terminate=True)`` does):
    its running task is handed back (nothing counted) and the process goes on running its next
    messages in full: the request is cleared once the message it stopped is done."""
    site.delays["/case/"] = 0.5
    cluster = make_cluster(CELERY_HA_WINDOW="2")
    w1 = cluster.worker("w1", concurrency=1)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(4)])
    cluster.pump()
    running = wait_for(lambda: next((t for t in cluster.q.get_many(ids) if t and t.state == "running"), None),
                       timeout=30, message="a running task")
    child = int(running.worker.rsplit(":", 1)[1])
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="every page")
    infos = cluster.q.get_many(ids)
    assert [(i.attempts, i.stalls) for i in infos] == [(0, 0)] * 4
    log = cluster.log_text(w1)
    assert log.count("handed back (worker shutting down)") == 1, log[-3000:]  # that task only
    assert w1.poll() is None and os.path.exists(f"/proc/{child}")  # the pool process lives on
    assert count_items(cluster.r, cluster.namespace) == 4


def test_100k_backlog_keeps_broker_within_window(make_cluster):
    """(g) 100,000 queued tasks: the pump keeps the broker at <= window messages, also when
    dispatched tasks go stale (a message still waiting is not sent twice) or are lost."""
    cluster = make_cluster(CELERY_HA_WINDOW="8", CELERY_HA_REDISPATCH_AFTER="1")
    specs = [f"http://example.test/doc/{i}" for i in range(100_000)]
    cluster.q.enqueue_many(specs, batch_size=5000)
    assert cluster.q.stats()["queued"] == 100_000
    settings = Settings.from_env(cluster.env)
    assert settings.window == 8

    assert cluster.pump() == 8
    assert broker_backlog(cluster.broker, cluster.crawl_queue) == 8
    for _ in range(3):
        cluster.pump()
        assert broker_backlog(cluster.broker, cluster.crawl_queue) == 8

    # stale dispatches whose message still waits are re-stamped, not re-sent
    def stale_round() -> bool:
        cluster.pump()
        assert broker_backlog(cluster.broker, cluster.crawl_queue) <= 8
        return cluster.q.stats()["redispatched"] >= 8

    wait_for(stale_round, timeout=10, interval=0.2, message="stale re-dispatch")
    assert broker_backlog(cluster.broker, cluster.crawl_queue) == 8

    # lost messages (broker flushed) are sent again, still within the window
    cluster.broker.delete(*broker_lists(cluster.crawl_queue))
    wait_for(lambda: cluster.pump() == 8, timeout=10, interval=0.2, message="lost messages re-sent")
    assert broker_backlog(cluster.broker, cluster.crawl_queue) == 8
    stats = cluster.q.stats()
    assert stats["dispatched"] == 8 and stats["queued"] == 100_000 - 8
