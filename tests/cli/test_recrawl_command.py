"""``celery-ha recrawl`` and ``enqueue --recrawl-after``: on a real Redis, and with a real worker
fetching from a real site (the page is served again)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from tests.support.celery_fixtures import make_cluster, site
from tests.support.celery_helpers import wait_for
from tests.support.cli import assert_one_line_error, run

__all__ = ["make_cluster", "site"]


def cli(url: str, namespace: str, *args: str, env: dict[str, str] | None = None):
    return run(["--redis-url", url, "--namespace", namespace, *args], env=env)


def _finish(q: TaskQueue, urls: list[str], task: str = "fetch_page") -> list[str]:
    ids = q.enqueue_many(urls, task=task)
    for tid in ids:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.complete(lease)
    return ids


def test_recrawl_by_id_reports_each(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, namespace="rc")
    (done,) = _finish(q, ["https://shop.example/a"])
    live = q.enqueue("https://shop.example/live")
    result = cli(redis_url, "rc", "recrawl", "--no-pump", done, live, "nosuchtask00")
    assert result.exit_code == 1, result.output  # an unknown id is an error, the others still act
    assert result.stdout.splitlines()[:3] == [f"{done}: queued", f"{live}: not completed",
                                              "nosuchtask00: unknown"]
    assert q.get(done).state == "queued" and q.get(live).state == "queued"
    result = cli(redis_url, "rc", "recrawl", "--json", "--no-pump", done)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"namespace": "rc", "queued": 0, "not_completed": 1, "unknown": 0,
                                         "pumped": False, "results": {done: "not completed"}}


def test_recrawl_selects_by_pattern_age_and_task(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="rs")
    shoes = _finish(q, [f"https://shop.example/shoes/{n}" for n in range(3)])
    hats = _finish(q, [f"https://shop.example/hats/{n}" for n in range(2)])
    listed = _finish(q, ["https://shop.example/shoes/list"], task="crawl_list")
    dry = cli(redis_url, "rs", "recrawl", "--match", "https://shop.example/shoes/*", "--dry-run", "--json")
    assert json.loads(dry.stdout) == {"namespace": "rs", "would_queue": 4, "dry_run": True}
    assert all(i.state == "completed" for i in q.get_many(shoes + hats + listed))  # nothing moved
    result = cli(redis_url, "rs", "recrawl", "--no-pump", "--match", "https://shop.example/shoes/*",
                 "--task", "fetch_page")
    assert result.exit_code == 0 and "queued 3 completed task(s) again" in result.stdout, result.output
    assert [i.state for i in q.get_many(shoes + hats + listed)] == ["queued"] * 3 + ["completed"] * 3
    # Nothing finished a day ago; everything finished at least 0 s ago.
    assert "queued 0 " in cli(redis_url, "rs", "recrawl", "--no-pump", "--older-than", "1d").stdout
    assert "queued 3 " in cli(redis_url, "rs", "recrawl", "--no-pump", "--older-than", "0s").stdout
    assert q.stats()["recrawled"] == 6


def _script_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...], Any]]:
    """Every script call of every queue from now on (the CLI builds its own), as (script, args, reply)."""
    calls: list[tuple[str, tuple[Any, ...], Any]] = []
    original = TaskQueue._run

    def wrapped(self: TaskQueue, script: str, *args: Any, **kw: Any) -> Any:
        reply = original(self, script, *args, **kw)
        calls.append((script, args, reply))
        return reply

    monkeypatch.setattr(TaskQueue, "_run", wrapped)
    return calls


def test_the_bulk_verbs_send_short_script_calls(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """recrawl --all, recrawl --due and dead redrive --all: at most SCRIPT_BATCH ids per script call
    (README "Short scripts"), so a big recrawl never keeps the workers waiting behind one call."""
    q = TaskQueue.from_url(redis_url, namespace="rk")
    q.set_schedule("page", every=1)
    done = _finish(q, [f"https://shop.example/p/{n}" for n in range(260)])
    scheduled = _finish(q, [f"https://shop.example/s/{n}" for n in range(120)], task="page")
    dead = q.enqueue_many([f"https://shop.example/d/{n}" for n in range(140)])
    for tid in dead:
        lease = q.claim(tid, "w:1")
        assert lease is not None
        q.fail(lease, "boom", retry=False)
    wait_for(lambda: q.refetch_pending()["due"] == len(scheduled), timeout=10, message="due runs")
    calls = _script_calls(monkeypatch)

    result = cli(redis_url, "rk", "recrawl", "--due", "--no-pump")
    assert result.exit_code == 0 and "queued 120 due" in result.stdout, result.output
    limits = [int(args[0]) for script, args, _ in calls if script == "refetch_due"]
    assert limits and max(limits) <= SCRIPT_BATCH, limits
    result = cli(redis_url, "rk", "recrawl", "--all", "--no-pump", "--task", "fetch_page")
    assert result.exit_code == 0 and f"queued {len(done)} completed" in result.stdout, result.output
    rows = [len(args) for script, args, _ in calls if script == "recrawl"]
    assert sum(rows) == len(done) and max(rows) <= SCRIPT_BATCH, rows
    result = cli(redis_url, "rk", "dead", "redrive", "--all")
    assert result.exit_code == 0 and f"redrove {len(dead)} task(s)" in result.stdout, result.output
    moved = [(int(args[1]), int(reply)) for script, args, reply in calls if script == "redrive"]
    assert max(max(pair) for pair in moved) <= SCRIPT_BATCH, moved


@pytest.mark.parametrize("args, code, contains", [
    ([], 2, "name the tasks"),
    (["abcdefabcdef", "--all"], 2, "not both"),
    (["--older-than", "soon"], 2, "--older-than"),
    (["--task", "bad name!"], 1, "task"),
])
def test_recrawl_bad_input_is_one_line(redis_url: str, args: list[str], code: int, contains: str) -> None:
    TaskQueue.from_url(redis_url, namespace="rb").enqueue("https://shop.example/")  # a namespace in use
    assert_one_line_error(cli(redis_url, "rb", "recrawl", *args), code=code, contains=contains)


def test_enqueue_recrawl_after_and_the_dedup_ttl_setting(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="re")
    (tid,) = _finish(q, ["https://shop.example/daily"])
    assert "0 new task(s), 1 duplicate(s)" in cli(redis_url, "re", "enqueue", "--no-pump",
                                                  "https://shop.example/daily").stdout
    assert "0 new task(s), 1 duplicate(s)" in cli(redis_url, "re", "enqueue", "--no-pump", "--recrawl-after",
                                                  "1d", "https://shop.example/daily").stdout
    assert "1 new task(s), 0 duplicate(s)" in cli(redis_url, "re", "enqueue", "--no-pump", "--recrawl-after",
                                                  "0", "https://shop.example/daily").stdout
    assert q.get(tid).state == "queued"
    lease = q.claim(tid, "w:1")
    assert lease is not None
    q.complete(lease)
    result = cli(redis_url, "re", "enqueue", "--no-pump", "https://shop.example/daily",
                 env={"CELERY_HA_DEDUP_TTL": "0s"})
    assert "1 new task(s)" in result.stdout, result.output
    assert_one_line_error(cli(redis_url, "re", "enqueue", "--recrawl-after", "later", "https://a.example/"),
                          code=2, contains="--recrawl-after")
    assert_one_line_error(cli(redis_url, "re", "stats", env={"CELERY_HA_DEDUP_TTL": "a while"}),
                          contains="CELERY_HA_DEDUP_TTL")


@pytest.mark.slow
def test_a_real_worker_fetches_a_recrawled_page_again(make_cluster, site) -> None:
    cluster = make_cluster()
    cluster.worker("w1", concurrency=1)
    url = site.case_url(7)
    path = url.split(site.url, 1)[1]
    tid = cluster.q.enqueue(url)
    cluster.pump()
    wait_for(lambda: cluster.state(tid) == "completed", timeout=30, message="the first fetch")
    assert len(site.hits(path=path)) == 1
    result = cli(cluster.state_url, cluster.namespace, "recrawl", tid)
    assert result.exit_code == 0 and f"{tid}: queued" in result.stdout, result.output
    wait_for(lambda: len(site.hits(path=path)) == 2 and cluster.state(tid) == "completed", timeout=30,
             message="the recrawl's fetch")
    # The same again through enqueue: a finished URL past its window (0 s) is crawled again.
    result = cli(cluster.state_url, cluster.namespace, "enqueue", "--recrawl-after", "0", url)
    assert "1 new task(s)" in result.stdout, result.output
    wait_for(lambda: len(site.hits(path=path)) == 3 and cluster.state(tid) == "completed", timeout=30,
             message="the third fetch")
    assert cluster.q.stats()["recrawled"] == 2
