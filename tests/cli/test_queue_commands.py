"""CLI commands over the durable task layer: enqueue, stats, task, dead, export, workers, purge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state import task_id_for
from celery_ha.state.keys import QueueKeys
from celery_ha.state.worker_registry import heartbeat, register_task_names
from tests.support.cli import SECRET, assert_one_line_error, run
from tests.support.records import record_count


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url)


def cli(redis_url: str, *args: str, input: str | None = None, namespace: str = "default"):
    return run(["--redis-url", redis_url, "--namespace", namespace, *args], input=input)


# ---------------------------------------------------------------- enqueue
def test_enqueue_arguments_counts_new_and_duplicates(redis_url: str, q: TaskQueue) -> None:
    result = cli(redis_url, "enqueue", "https://example.com/a", "https://example.com/b", "https://example.com/a")
    assert result.exit_code == 0, result.output
    assert "queued 2 new task(s), 1 duplicate(s)" in result.stdout
    result = cli(redis_url, "enqueue", "--json", "https://example.com/a", "https://example.com/c")
    assert json.loads(result.stdout) == {"namespace": "default", "task": "fetch_page", "submitted": 2,
                                         "new": 1, "duplicates": 1, "pumped": False}
    assert q.stats()["queued"] == 3


def test_enqueue_file_and_stdin_skip_blanks_and_comments(redis_url: str, q: TaskQueue,
                                                         tmp_path: Path) -> None:
    listing = tmp_path / "urls.txt"
    listing.write_text("# seeds\nhttps://example.com/1\n\n   \nhttps://example.com/2#frag\n# done\n")
    result = cli(redis_url, "enqueue", "-f", str(listing), "--task", "crawl_list", "--priority", "5",
                 "--meta", '{"src": "file"}')
    assert result.exit_code == 0, result.output
    assert "queued 2 new" in result.stdout
    info = q.get(task_id_for("crawl_list", "https://example.com/1"))
    assert (info.task, info.priority, info.meta) == ("crawl_list", 5, {"src": "file"})
    result = cli(redis_url, "enqueue", "-f", "-", input="https://example.com/3\nhttps://example.com/1\n")
    assert "queued 2 new task(s), 0 duplicate(s)" in result.stdout  # other task name: not a duplicate
    result = cli(redis_url, "enqueue", "-f", "-", "--task", "crawl_list", input="https://example.com/1\n")
    assert "queued 0 new task(s), 1 duplicate(s)" in result.stdout


def test_enqueue_kicks_the_pump_only_when_a_worker_is_alive(redis_url: str, r: redis.Redis) -> None:
    result = cli(redis_url, "enqueue", "--json", "https://example.com/a")
    assert json.loads(result.stdout)["pumped"] is False and not r.exists("default.maintenance")
    heartbeat(r, "default", "celery@box:1")
    result = cli(redis_url, "enqueue", "--json", "https://example.com/b")
    assert json.loads(result.stdout)["pumped"] is True
    message = json.loads(r.lpop("default.maintenance"))
    assert message["headers"]["task"] == "celery_ha.maintenance.pump"
    result = cli(redis_url, "enqueue", "--json", "--no-pump", "https://example.com/c")
    assert json.loads(result.stdout)["pumped"] is False and not r.exists("default.maintenance")


def test_enqueue_no_dedup_queues_again(redis_url: str, q: TaskQueue) -> None:
    cli(redis_url, "enqueue", "https://example.com/a")
    result = cli(redis_url, "enqueue", "--no-dedup", "https://example.com/a")
    assert "queued 1 new task(s), 0 duplicate(s)" in result.stdout
    assert q.stats()["queued"] == 2


def test_enqueue_bad_line_names_it_and_writes_nothing(redis_url: str, q: TaskQueue, r: redis.Redis) -> None:
    text = "https://example.com/ok\nftp://example.com/nope\n"
    line = assert_one_line_error(cli(redis_url, "enqueue", "-f", "-", input=text), code=1)
    assert "stdin line 2" in line
    assert r.dbsize() == 0
    line = assert_one_line_error(cli(redis_url, "enqueue", "https://example.com/x", "not a url"))
    assert "argument 2" in line
    assert r.dbsize() == 0


def test_enqueue_masks_credentials_in_bad_urls(redis_url: str) -> None:
    line = assert_one_line_error(cli(redis_url, "enqueue", f"ftp://user:{SECRET}@example.com/"))
    assert "user:***@" in line


# ---------------------------------------------------------------- stats
def test_stats_table_json_and_watch(redis_url: str, q: TaskQueue) -> None:
    q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    lease = q.claim_next("w1")
    q.complete(lease)
    data = json.loads(cli(redis_url, "stats", "--json").stdout)
    assert data["queued"] == 2 and data["completed"] == 1 and data["namespace"] == "default"
    table = cli(redis_url, "stats")
    assert table.exit_code == 0 and "queued" in table.stdout and "completed" in table.stdout
    watch = cli(redis_url, "stats", "--watch", "--interval", "0.1", "--updates", "2")
    assert watch.exit_code == 0, watch.output
    assert "1/3" in watch.stdout and "tasks/s" in watch.stdout


def test_stats_namespaces_are_separate(redis_url: str) -> None:
    TaskQueue.from_url(redis_url, namespace="other").enqueue("https://example.com/")
    assert json.loads(cli(redis_url, "stats", "--json").stdout)["queued"] == 0
    assert json.loads(cli(redis_url, "stats", "--json", namespace="other").stdout)["queued"] == 1


# ---------------------------------------------------------------- task
def test_task_shows_one_task_with_masked_url(redis_url: str, q: TaskQueue) -> None:
    tid = q.enqueue(f"https://bob:{SECRET}@example.com/page", meta={"k": 1})
    lease = q.claim(tid, "w1")
    q.save_checkpoint(lease, {"page": 7})
    result = cli(redis_url, "task", tid)
    assert result.exit_code == 0, result.output
    assert tid in result.stdout and "running" in result.stdout and "bob:***@example.com" in result.stdout
    assert SECRET not in result.stdout and '"page": 7' in result.stdout.replace("'", '"')
    data = json.loads(cli(redis_url, "task", tid, "--json").stdout)
    assert data["checkpoint"] == {"page": 7} and data["worker"] == "w1" and SECRET not in json.dumps(data)


def test_task_unknown_id_is_one_line(redis_url: str) -> None:
    assert_one_line_error(cli(redis_url, "task", "nope"), code=1, contains="no task 'nope'")


# ---------------------------------------------------------------- dead
def _kill(q: TaskQueue, url: str, why: str) -> str:
    tid = q.enqueue(url)
    q.fail(q.claim(tid, "w1"), why, retry=False)
    return tid


def test_dead_list_show_redrive(redis_url: str, q: TaskQueue) -> None:
    assert "no dead tasks" in cli(redis_url, "dead", "list").stdout
    a = _kill(q, "https://example.com/a", "HTTP 404 not found")
    b = _kill(q, "https://example.com/b", "captcha")
    listing = cli(redis_url, "dead", "list")
    assert listing.exit_code == 0 and a in listing.stdout and "HTTP 404" in listing.stdout
    data = json.loads(cli(redis_url, "dead", "list", "--json").stdout)
    assert data["total"] == 2 and [t["id"] for t in data["tasks"]] == [a, b]
    show = cli(redis_url, "dead", "show", b)
    assert show.exit_code == 0 and "captcha" in show.stdout and "dead" in show.stdout
    result = cli(redis_url, "dead", "redrive", a)
    assert result.exit_code == 0 and "redrove 1 task(s)" in result.stdout
    assert q.get(a).state == "queued"
    skipped = cli(redis_url, "dead", "redrive", a)
    assert "redrove 0" in skipped.stdout and "not dead" in skipped.stderr
    assert "redrove 1 task(s)" in cli(redis_url, "dead", "redrive", "--all").stdout
    assert q.stats()["dead"] == 0
    assert_one_line_error(cli(redis_url, "dead", "redrive", "unknown-id"), code=1, contains="no task")
    assert_one_line_error(cli(redis_url, "dead", "redrive", a, "--all"), code=2)
    # An unknown id among others is reported; the others are still redriven (exit 1, as cancel).
    c, d = _kill(q, "https://example.com/c", "gone"), _kill(q, "https://example.com/d", "gone")
    mixed = cli(redis_url, "dead", "redrive", "nosuchid", c, d)
    assert mixed.exit_code == 1 and "redrove 2 task(s), 1 unknown" in mixed.stdout, mixed.output
    assert "no task 'nosuchid'" in mixed.stderr and q.get(c).state == q.get(d).state == "queued"


# ---------------------------------------------------------------- export
def _emit(q: TaskQueue, url: str, items: list[tuple[str, dict]]) -> None:
    tid = q.enqueue(url)
    lease = q.claim(tid, "w1")
    q.commit(lease, items)
    q.complete(lease)


def test_export_jsonl_stdout_and_file(redis_url: str, q: TaskQueue, tmp_path: Path) -> None:
    _emit(q, "https://example.com/1", [("case-1", {"id": 1, "title": "A v B"}), ("case-2", {"id": 2})])
    _emit(q, "https://example.com/2", [("case-2", {"id": 2}), ("case-3", {"id": 3, "title": "Ü"})])
    result = cli(redis_url, "export", "--format", "jsonl")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in rows] == [1, 2, 3]
    assert "exported 3 item(s)" in result.stderr
    out = tmp_path / "items.jsonl"
    result = cli(redis_url, "export", "--output", str(out))
    assert result.exit_code == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 3
    assert list(tmp_path.iterdir()) == [out]  # atomic: no temp file left


def test_export_to_unwritable_path_is_one_line(redis_url: str, tmp_path: Path) -> None:
    assert_one_line_error(cli(redis_url, "export", "-o", str(tmp_path / "missing" / "x.jsonl")), code=1)


# ---------------------------------------------------------------- workers
def test_workers_lists_alive_workers_and_their_leases(redis_url: str, q: TaskQueue, r: redis.Redis) -> None:
    assert "no live workers" in cli(redis_url, "workers").stdout
    heartbeat(r, "default", "celery@box:101")
    heartbeat(r, "default", "celery@box:102")
    tid = q.enqueue("https://example.com/held")
    q.claim(tid, "celery@box:101")
    orphan = q.enqueue("https://example.com/orphan")
    q.claim(orphan, "celery@gone:7")
    result = cli(redis_url, "workers")
    assert result.exit_code == 0, result.output
    assert "celery@box:101" in result.stdout and tid in result.stdout
    data = {w["name"]: w for w in json.loads(cli(redis_url, "workers", "--json").stdout)}
    assert data["celery@box:101"]["tasks"] == [tid] and data["celery@box:102"]["tasks"] == []
    assert data["celery@gone:7"]["alive"] is False and data["celery@gone:7"]["tasks"] == [orphan]


# ---------------------------------------------------------------- purge
def test_purge_removes_only_the_namespace(redis_url: str, r: redis.Redis) -> None:
    TaskQueue.from_url(redis_url, namespace="a").enqueue_many([f"https://example.com/{i}" for i in range(50)])
    TaskQueue.from_url(redis_url, namespace="ab").enqueue("https://example.com/keep")
    r.set("unrelated", "1")
    refused = cli(redis_url, "purge", namespace="a")
    assert_one_line_error(refused, code=2, contains="--yes")
    assert record_count(r, QueueKeys("a")) == 50
    result = cli(redis_url, "purge", "--yes", namespace="a")
    assert result.exit_code == 0 and "purged namespace a" in result.stdout
    assert not r.keys("cha:{a}:*")
    assert record_count(r, QueueKeys("ab")) == 1 and r.get("unrelated") == "1"


def test_enqueue_file_with_a_bom_binary_or_non_utf8_bytes(redis_url: str, q: TaskQueue,
                                                           tmp_path: Path) -> None:
    """A UTF-8 BOM is dropped; non-UTF-8 or binary content is one line naming the line; nothing queued."""
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbfhttps://example.com/bom\n")
    assert cli(redis_url, "enqueue", "-f", str(bom)).exit_code == 0
    assert q.ready_ids() == [task_id_for("fetch_page", "https://example.com/bom")]
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"https://example.com/ok\nhttps://example.com/caf\xe9\n")
    line = assert_one_line_error(cli(redis_url, "enqueue", "-f", str(latin)), code=1, contains="line 2")
    assert "UTF-8" in line
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"https://example.com/a\n\x00\x01\x02garbage\n")
    assert_one_line_error(cli(redis_url, "enqueue", "-f", str(binary)), code=1, contains="NUL")
    assert q.stats()["queued"] == 1  # only the BOM file's URL


def test_enqueue_refuses_a_task_name_the_live_workers_do_not_run(redis_url: str, r: redis.Redis,
                                                                  q: TaskQueue) -> None:
    assert cli(redis_url, "enqueue", "--task", "fetch_pgae", "https://example.com/early").exit_code == 0
    register_task_names(r, "default", "celery@box", ["crawl_list", "fetch_page"])
    heartbeat(r, "default", "celery@box:7")  # a live pool process of that node
    line = assert_one_line_error(cli(redis_url, "enqueue", "--task", "fetch_pgae", "https://example.com/x"),
                                 code=2, contains="fetch_pgae")
    assert "crawl_list, fetch_page" in line
    assert q.stats()["queued"] == 1  # only the one queued before any worker registered
    result = cli(redis_url, "enqueue", "--task", "fetch_pgae", "--allow-unknown-task", "https://example.com/y")
    assert result.exit_code == 0 and q.stats()["queued"] == 2
    assert cli(redis_url, "enqueue", "--task", "crawl_list", "https://example.com/z").exit_code == 0


def test_shards_lists_each_shard_of_a_namespace_on_one_redis(redis_url: str) -> None:
    """One row per shard, with the recorded count (not this process's setting): tag, slot and counts
    that add up to the namespace's own."""
    q = TaskQueue.from_url(redis_url, "shardlist", shards=3)
    q.enqueue_many([f"https://example.com/s{i}" for i in range(30)])
    lease = q.claim_next("w")
    assert lease is not None
    q.fail(lease, "gone", retry=False)
    result = cli(redis_url, "shards", "--json", namespace="shardlist")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["index"] for r in rows] == [0, 1, 2] and rows[0]["tag"] == "shardlist"
    assert all(r["node"] is None and r["keys_in_slot"] is None for r in rows)
    assert sum(r["records"] for r in rows) == 30 and sum(r["queued"] for r in rows) == 29
    assert sum(r["dead"] for r in rows) == 1 and all(r["queued"] > 0 for r in rows)
    table = cli(redis_url, "shards", namespace="shardlist")
    assert table.exit_code == 0 and "3 shard(s) on one Redis" in table.stdout, table.output
