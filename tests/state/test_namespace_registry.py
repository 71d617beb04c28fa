"""The registry of namespaces (``state/namespaces.py``) that workers, beat and ``celery-ha web`` of a
pattern read: written at a namespace's first enqueue, emptied by ``purge``, rebuilt by a scan; and
``celery-ha namespaces`` that lists it."""

from __future__ import annotations

import json

import redis

from celery_ha import TaskQueue
from celery_ha.state.namespaces import REGISTRY_KEY, matching, registered, scan_for_namespaces
from celery_ha.state.purge import purge_namespace
from celery_ha.state.replay import enqueue_if_absent
from tests.support.cli import assert_one_line_error, run


def test_a_namespace_is_registered_at_its_first_enqueue_and_forgotten_by_purge(redis_url: str,
                                                                               r: redis.Redis) -> None:
    shop = TaskQueue.from_url(redis_url, "shop")
    shop.stats()  # reads register nothing: `celery-ha -n typo stats` must not create a crawl
    TaskQueue.from_url(redis_url, "typo").dead()
    assert registered(r) == []
    shop.enqueue("https://shop.test/a")
    TaskQueue.from_url(redis_url, "crawl-1", shards=4).enqueue_many(["https://c.test/1", "https://c.test/2"])
    enqueue_if_absent(TaskQueue.from_url(redis_url, "outbox"), [("abc", "https://o.test/")])
    assert registered(r) == ["crawl-1", "outbox", "shop"]
    calls = r.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0)
    shop.enqueue_many([f"https://shop.test/{i}" for i in range(5)])
    assert r.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0) == calls  # once per queue object
    purge_namespace(r, "shop")
    assert registered(r) == ["crawl-1", "outbox"]
    r.sadd(REGISTRY_KEY, "not a namespace")  # a stray member is skipped, never served
    assert registered(r) == ["crawl-1", "outbox"]


def test_matching_and_the_scan_for_namespaces_written_before_the_registry(redis_url: str,
                                                                         r: redis.Redis) -> None:
    assert matching(["crawl-a", "crawl-b", "shop", "crawl.x"], ("crawl-*",), known=["crawl-b"]) == ["crawl-a"]
    assert matching(["a", "bb", "ccc"], ("??", "a")) == ["a", "bb"]
    TaskQueue.from_url(redis_url, "old-1").enqueue("https://a.test/")
    TaskQueue.from_url(redis_url, "old-2", shards=3).enqueue_many([f"https://b.test/{i}" for i in range(9)])
    r.delete(REGISTRY_KEY)  # as a release before the registry left them
    r.set("cha:{not/a-namespace}:x", "1")
    assert scan_for_namespaces(r, count=5) == ["old-1", "old-2"]


def test_the_namespaces_command_lists_counts_and_registers_what_a_scan_finds(redis_url: str,
                                                                            r: redis.Redis) -> None:
    crawl = TaskQueue.from_url(redis_url, "crawl-a")
    crawl.enqueue_many(["https://a.test/1", "https://a.test/2"])
    crawl.complete(crawl.claim_next("w"))
    TaskQueue.from_url(redis_url, "shop").enqueue("https://shop.test/")
    result = run(["--redis-url", redis_url, "namespaces", "crawl-*", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"namespace": "crawl-a", "queued": 1, "running": 0, "delayed": 0,
                                          "dead": 0, "completed": 1}]
    table = run(["--redis-url", redis_url, "namespaces"]).stdout
    assert "crawl-a" in table and "shop" in table
    r.delete(REGISTRY_KEY)
    assert "try --scan" in run(["--redis-url", redis_url, "namespaces"]).stdout
    scanned = run(["--redis-url", redis_url, "namespaces", "--scan"])
    assert "2 newly registered (crawl-a, shop)" in scanned.stdout, scanned.output
    assert registered(r) == ["crawl-a", "shop"]
    assert_one_line_error(run(["--redis-url", redis_url, "namespaces", "a/b"]), code=2, contains="PATTERN")
