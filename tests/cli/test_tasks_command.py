"""``celery-ha tasks``: every state listed in its order, filters and paging, one-line errors."""

from __future__ import annotations

import json

import pytest

from celery_ha import TaskQueue
from celery_ha.state.listing import list_tasks
from tests.support.cli import assert_one_line_error, run


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, namespace="lt")


def cli(redis_url: str, *args: str):
    return run(["--redis-url", redis_url, "--namespace", "lt", "tasks", *args])


def _listed(redis_url: str, *args: str) -> list[str]:
    result = cli(redis_url, "--json", *args)
    assert result.exit_code == 0, result.output
    return [t["id"] for t in json.loads(result.stdout)["tasks"]]


def test_each_state_in_its_order(redis_url: str, q: TaskQueue) -> None:
    low = q.enqueue_many([f"http://example.com/low/{n}" for n in range(3)], priority=0)
    high = q.enqueue("http://example.com/high", priority=5, task="crawl_list")
    assert _listed(redis_url) == [high, *low]  # claim order: priority band first, then age
    lease = q.claim(low[0], "w:1")
    assert lease is not None
    assert _listed(redis_url, "--state", "running") == [low[0]]
    q.complete(lease)
    assert _listed(redis_url, "--state", "completed") == [low[0]]
    dead = q.claim(low[1], "w:1")
    assert dead is not None
    q.fail(dead, "gone", retry=False)
    assert _listed(redis_url, "--state", "dead") == [low[1]]
    delayed = q.claim(low[2], "w:1")
    assert delayed is not None
    q.fail(delayed, "try later")
    assert _listed(redis_url, "--state", "delayed") == [low[2]]
    assert [d.task_id for d in q.dispatch(5)] == [high]
    assert _listed(redis_url, "--state", "dispatched") == [high]
    assert _listed(redis_url, "--state", "queued") == []


def test_filter_by_task_and_paging(redis_url: str, q: TaskQueue) -> None:
    pages = q.enqueue_many([f"http://example.com/p/{n}" for n in range(7)])
    lists = q.enqueue_many([f"http://example.com/l/{n}" for n in range(5)], task="crawl_list")
    assert _listed(redis_url, "--limit", "3", "--offset", "2") == pages[2:5]
    assert _listed(redis_url, "--task", "crawl_list", "--limit", "2", "--offset", "1") == lists[1:3]
    assert [t.id for t in list_tasks(q, "queued", task="fetch_page", limit=100)] == pages
    table = cli(redis_url, "--task", "crawl_list")
    assert table.exit_code == 0 and "queued tasks of crawl_list, 1-5 (12 queued in all)" in table.stdout
    assert "no dead tasks in namespace lt" in cli(redis_url, "--state", "dead").stdout


@pytest.mark.parametrize("args", [["--state", "lost"], ["--limit", "0"], ["--offset", "-1"],
                                  ["--task", "bad name"], ["--task", "fetch_page\n"]])
def test_bad_options_are_one_line(redis_url: str, args: list[str]) -> None:
    assert_one_line_error(cli(redis_url, *args), code=2)
