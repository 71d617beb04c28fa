"""A real ``celery-ha web`` scraped after a real crawl (Celery workers, a proxy farm, a site with dead
pages): every gauge equals the Redis state, the histograms count every claim and completion, the
proxy counters every release the site saw."""

from __future__ import annotations

from collections import Counter

from celery_ha.demo.proxy_farm import ProxyFarm
from celery_ha.integration.dispatch.broker import broker_backlog
from celery_ha.proxy import ProxyPool
from celery_ha.state.worker_registry import list_workers
from tests.monitoring.webproc import samples, value, web_process
from tests.support.celery_helpers import wait_for

STATES = ("queued", "dispatched", "running", "delayed", "completed", "dead")
EVENTS = {"enqueued": "enqueued", "duplicate": "duplicates", "claimed": "claimed", "completed": "completed",
          "failed": "failed", "retried": "retried", "reclaimed": "reclaimed", "released": "released",
          "redriven": "redriven", "redispatched": "redispatched"}


def _by(page: dict, name: str, label: str, **fixed: str) -> dict[str, float]:
    """{label value: sample} of one metric, for the samples whose other labels are ``fixed``."""
    out = {}
    for (sample, labels), v in page.items():
        d = dict(labels)
        if sample == name and all(d.get(k) == want for k, want in fixed.items()):
            out[d[label]] = v
    return out


def test_scrape_after_a_crawl_equals_the_redis_state(make_cluster, site) -> None:
    site.total, site.page_size = 60, 10
    site.fail("/case/7", "404")
    site.fail("/case/23", "404")
    farm = ProxyFarm(3, first=201).start()
    cluster = make_cluster(CELERY_HA_PROXY_RATE="500/1", CELERY_HA_OBEY_ROBOTS="0")
    try:
        ns = cluster.namespace
        pool = ProxyPool(cluster.r, ns)
        pool.add_many(farm.urls)
        cluster.worker("w1", concurrency=2)
        cluster.worker("w2", concurrency=2)
        cluster.q.enqueue(site.list_url(), task="crawl_list")
        cluster.pump()

        def finished() -> bool:
            s = cluster.q.stats()
            return s["completed"] + s["dead"] == 61 and not any(s[k] for k in STATES[:4])

        wait_for(finished, timeout=90, message="the crawl to finish")
        env = {"CELERY_BROKER_URL": cluster.broker_url,
               "CELERY_HA_LEASE_TTL": cluster.env["CELERY_HA_LEASE_TTL"],
               "CELERY_HA_HEARTBEAT_INTERVAL": cluster.env["CELERY_HA_HEARTBEAT_INTERVAL"]}
        with web_process(cluster.state_url, ns, env=env) as web:
            page = samples(web.get("/metrics").text)
            stats = cluster.q.stats()
            alive = list_workers(cluster.r, ns, max_age=float(cluster.env["CELERY_HA_LEASE_TTL"]))
            pool_stats = pool.stats()
    finally:
        farm.stop()

    assert value(page, "celery_ha_up", namespace=ns) == 1
    assert _by(page, "celery_ha_tasks", "state", namespace=ns) == {s: stats[s] for s in STATES}
    assert stats["completed"] == 59 and stats["dead"] == 2
    events = _by(page, "celery_ha_task_events_total", "event", namespace=ns)
    assert {e: events[e] for e in EVENTS} == {e: stats[f] for e, f in EVENTS.items()}
    assert events["dead"] == 2
    # histograms: one wait per claim, one runtime per completion, by task name
    waits = _by(page, "celery_ha_task_wait_seconds_count", "task", namespace=ns)
    runtimes = _by(page, "celery_ha_task_runtime_seconds_count", "task", namespace=ns)
    assert sum(waits.values()) == stats["claimed"]
    assert runtimes == {"crawl_list": 1, "fetch_page": 58}
    for task, n in runtimes.items():
        assert value(page, "celery_ha_task_runtime_seconds_bucket", namespace=ns, task=task, le="+Inf") == n
        assert value(page, "celery_ha_task_runtime_seconds_sum", namespace=ns, task=task) > 0
    assert value(page, "celery_ha_items", namespace=ns) == 60 + 58  # list entries + detail pages
    assert value(page, "celery_ha_workers_alive", namespace=ns) == len(alive) == 4
    crawl_queue = cluster.crawl_queue
    assert value(page, "celery_ha_broker_messages", queue=crawl_queue) == broker_backlog(cluster.broker,
                                                                                          crawl_queue)
    # proxies: zones as the pool reports them, one release per request the site saw
    zones = _by(page, "celery_ha_proxies", "zone", namespace=ns)
    assert zones == {"avail": 3, "new": 0, "tban": 0, "pban": 0, "in_use": pool_stats["in_use"]}
    releases = _by(page, "celery_ha_proxy_releases_total", "outcome", namespace=ns)
    statuses = Counter(r.status for r in site.requests)
    assert sum(releases.values()) == pool_stats["released"] == len(site.requests) == farm.requests
    assert releases["ok"] == statuses[200] and releases["permanent"] == statuses[404] == 2
    domain = site.url.split("//", 1)[1]
    acquires = value(page, "celery_ha_proxy_domain_acquires_total", namespace=ns, domain=domain)
    assert acquires == len(site.requests)
