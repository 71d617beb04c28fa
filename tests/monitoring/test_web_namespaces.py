"""One ``celery-ha web`` serving several namespaces (``--namespaces`` / CELERY_HA_WEB_NAMESPACES): one
scrape holds every namespace's metrics, the API and dashboard show one each with ``?namespace=``."""

from __future__ import annotations

import pytest

from celery_ha.state import TaskQueue
from tests.monitoring.webproc import samples, value, web_process
from tests.support.cli import assert_one_line_error, run
from tests.support.polling import wait_until


@pytest.fixture
def two_crawls(redis_url: str) -> dict[str, TaskQueue]:
    """Namespace shop: 2 completed, 3 queued; news: 1 dead, 1 queued."""
    shop, news = TaskQueue.from_url(redis_url, "shop"), TaskQueue.from_url(redis_url, "news")
    shop.enqueue_many([f"https://shop.test/p/{i}" for i in range(5)])
    for _ in range(2):
        shop.complete(shop.claim_next("w1"))
    news.enqueue_many(["https://news.test/a", "https://news.test/b"])
    news.fail(news.claim_next("w1"), "HTTP 404", retry=False)
    return {"shop": shop, "news": news}


def test_one_server_serves_every_namespace_named(redis_url: str, two_crawls: dict[str, TaskQueue]) -> None:
    with web_process(redis_url, "ignored", "--namespaces", "shop, news") as web:
        assert "namespaces shop, news" in "".join(web.output)
        page = samples(web.get("/metrics").text)
        for ns, want in (("shop", {"queued": 3, "completed": 2, "dead": 0}),
                         ("news", {"queued": 1, "completed": 0, "dead": 1})):
            assert value(page, "celery_ha_up", namespace=ns) == 1
            for state, n in want.items():
                assert value(page, "celery_ha_tasks", namespace=ns, state=state) == n, (ns, state)
        assert not [key for key in page if ("namespace", "ignored") in key[1]]  # -n is not served
        # One family per metric: the exposition format refuses a name twice.
        assert web.get("/metrics").text.count("# TYPE celery_ha_tasks gauge") == 1

        default = web.get("/api/stats").json()
        assert (default["namespace"], default["queued"], default["completed"]) == ("shop", 3, 2)
        news = web.get("/api/stats?namespace=news").json()
        assert (news["namespace"], news["queued"], news["dead"]) == ("news", 1, 1)
        assert web.get("/api/dashboard?namespace=news").json()["namespace"] == "news"
        assert web.get("/healthz").json()["namespaces"] == ["shop", "news"]
        assert web.get("/api/session").json()["namespaces"] == ["shop", "news"]
        missing = web.get("/api/stats?namespace=other")
        assert missing.status == 404 and "does not serve that namespace" in missing.json()["error"]


def test_the_setting_names_them_and_without_it_the_one_namespace_is_served(
        redis_url: str, two_crawls: dict[str, TaskQueue]) -> None:
    with web_process(redis_url, "news", env={"CELERY_HA_WEB_NAMESPACES": "news,shop"}) as web:
        assert web.get("/api/stats").json()["namespace"] == "news"
        assert value(samples(web.get("/metrics").text), "celery_ha_up", namespace="shop") == 1
    with web_process(redis_url, "news") as web:
        page = samples(web.get("/metrics").text)
        assert value(page, "celery_ha_up", namespace="news") == 1
        assert not [key for key in page if ("namespace", "shop") in key[1]]
        assert "namespaces" not in web.get("/healthz").json()  # the document of one namespace


def test_a_pattern_serves_the_matching_namespaces_also_those_that_appear_later(redis_url: str) -> None:
    """``--namespaces 'crawl-*'``: the registered namespaces that match at start, then a crawl whose
    first enqueue comes while the server runs; never a namespace the pattern does not match."""
    TaskQueue.from_url(redis_url, "crawl-a").enqueue_many(["https://a.test/1", "https://a.test/2"])
    TaskQueue.from_url(redis_url, "blog").enqueue("https://blog.test/")
    TaskQueue.from_url(redis_url, "crawl-s", shards=4).enqueue("https://s.test/")  # another shard count
    with web_process(redis_url, "ignored", "--namespaces", "crawl-*",
                     env={"CELERY_HA_DISCOVERY_INTERVAL": "0.2"}) as web:
        assert "namespace crawl-a, and those matching crawl-* as they appear" in "".join(web.output)
        page = samples(web.get("/metrics").text)
        assert value(page, "celery_ha_tasks", namespace="crawl-a", state="queued") == 2
        assert not [key for key in page if {("namespace", "blog"), ("namespace", "ignored")} & set(key[1])]
        TaskQueue.from_url(redis_url, "crawl-b").enqueue_many([f"https://b.test/{i}" for i in range(3)])

        def crawl_b_queued() -> float | None:
            return samples(web.get("/metrics").text).get(
                ("celery_ha_tasks", (("namespace", "crawl-b"), ("state", "queued"))))

        wait_until(lambda: crawl_b_queued() == 3, 10, what="crawl-b in /metrics")
        assert web.get("/api/stats?namespace=crawl-b").json()["queued"] == 3
        assert web.get("/api/stats").json()["namespace"] == "crawl-a"  # the first served stays the default
        assert web.get("/healthz").json()["namespaces"] == ["crawl-a", "crawl-b"]
        assert web.get("/api/stats?namespace=blog").status == 404
        assert web.get("/api/stats?namespace=crawl-s").status == 404
        said = "not serving namespace crawl-s: namespace 'crawl-s' holds tasks in 4 shard(s)"
        assert said in "".join(web.output)


@pytest.mark.parametrize("names, says", [
    ("shop,bad ns", "--namespaces"),
    (",".join(f"n{i}" for i in range(65)), "at most 64"),
    ("crawl/*", "pattern"),
])
def test_bad_namespaces_are_one_line_errors(redis_url: str, names: str, says: str) -> None:
    result = run(["--redis-url", redis_url, "web", "--namespaces", names])
    assert_one_line_error(result, code=2, contains=says)
