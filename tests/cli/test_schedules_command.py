"""``celery-ha schedules list|set|unset`` and ``recrawl --due`` on a real Redis."""

from __future__ import annotations

import json

import redis

from celery_ha import TaskQueue
from tests.support.celery_helpers import wait_for
from tests.support.cli import assert_one_line_error, run


def cli(url: str, namespace: str, *args: str):
    return run(["--redis-url", url, "--namespace", namespace, *args])


def test_set_list_and_unset(redis_url: str) -> None:
    TaskQueue.from_url(redis_url, namespace="sh").enqueue("https://shop.example/")  # a namespace in use
    out = cli(redis_url, "sh", "schedules", "set", "--task", "crawl_list", "--every", "1d")
    assert out.exit_code == 0 and out.stdout.strip() == \
        "task crawl_list: refetch every 1d (from each task's next completion)", out.output
    out = cli(redis_url, "sh", "schedules", "set", "--task", "fetch_page", "--host", "News.Example",
              "--every", "1w", "--adaptive")
    assert out.stdout.strip() == ("task fetch_page on host news.example: refetch every 1w, adaptive "
                                  "within 42h..8w (from each task's next completion)"), out.output
    out = cli(redis_url, "sh", "schedules", "list", "--json")
    got = json.loads(out.stdout)
    assert [(s["task"], s["host"], s["every"], s["adaptive"]) for s in got["schedules"]] == [
        ("crawl_list", None, 86400, False), ("fetch_page", "news.example", 604800, True)]
    assert (got["waiting"], got["due"]) == (0, 0)
    table = cli(redis_url, "sh", "schedules", "list").stdout
    assert "crawl_list" in table and "news.example" in table and "0 run(s) waiting" in table
    assert cli(redis_url, "sh", "schedules", "unset", "--task", "crawl_list").exit_code == 0
    missing = cli(redis_url, "sh", "schedules", "unset", "--task", "crawl_list")
    assert_one_line_error(missing, contains="no such schedule")
    assert [s.task for s in TaskQueue.from_url(redis_url, namespace="sh").schedules()] == ["fetch_page"]


def test_bad_input_is_one_line(redis_url: str) -> None:
    TaskQueue.from_url(redis_url, namespace="sb").enqueue("https://shop.example/")  # a namespace in use
    assert_one_line_error(cli(redis_url, "sb", "schedules", "set", "--every", "1d"),
                          contains="give --task, --host")
    assert_one_line_error(cli(redis_url, "sb", "schedules", "set", "--task", "t", "--every", "often"),
                          contains="bad every")
    assert_one_line_error(cli(redis_url, "sb", "schedules", "set", "--task", "t", "--every", "1h",
                              "--max", "2h"), contains="adaptive")
    assert TaskQueue.from_url(redis_url, namespace="sb").schedules() == []


def test_recrawl_due_queues_the_runs_whose_time_came(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, namespace="sd")
    q.set_schedule("page", every=1)
    ids = q.enqueue_many([f"https://shop.example/{i}" for i in range(3)], task="page")
    for tid in ids:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.complete(lease)
    wait_for(lambda: q.refetch_pending()["due"] == 3, timeout=10, message="due runs")
    dry = json.loads(cli(redis_url, "sd", "recrawl", "--due", "--dry-run", "--json").stdout)
    assert dry == {"namespace": "sd", "would_queue": 3, "dry_run": True}
    out = cli(redis_url, "sd", "recrawl", "--due", "--no-pump")
    assert out.exit_code == 0 and "queued 3 due scheduled refetch(es)" in out.stdout, out.output
    assert {i.state for i in q.get_many(ids)} == {"queued"} and q.stats()["refetched"] == 3
    assert_one_line_error(cli(redis_url, "sd", "recrawl", "--due", "--all"), contains="--due takes no ids")
