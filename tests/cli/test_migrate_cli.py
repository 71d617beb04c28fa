"""``celery-ha migrate`` as an operator runs it: a migration SIGKILLed half-way and run again ends with
every task in the target exactly once, and the refusals are one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import redis

from celery_ha import TaskQueue
from celery_ha.state.records import TaskInfo
from celery_ha.state.shards import namespace_keys
from celery_ha.state.sink import iter_items
from celery_ha.state.worker_registry import heartbeat
from tests.support.polling import wait_until
from tests.support.records import all_records, record_count

TASKS = 60_000


def _cli(redis_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "-n", "big", *args]


def _urls_in(r: redis.Redis, namespace: str) -> list[str]:
    return [TaskInfo.parse(tid, raw).url for k in namespace_keys(r, namespace)
            for tid, raw in all_records(r, k)]


def test_a_migration_killed_half_way_finishes_when_run_again(redis_url: str, r: redis.Redis) -> None:
    src = TaskQueue.from_url(redis_url, "big", host_gate=True, shards=2)
    src.enqueue_many([f"https://h{i % 40}.example/p/{i}" for i in range(TASKS)], batch_size=1000)
    for _ in range(50):
        lease = src.claim_next("w")
        src.commit(lease, [(lease.url, {"url": lease.url})])
        src.complete(lease)
    queued = src.stats()["queued"]

    proc = subprocess.Popen(_cli(redis_url, "migrate", "big3", "--shards", "3", "--yes"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    try:
        wait_until(lambda: sum(record_count(r, k) for k in namespace_keys(r, "big3")) >= 5_000, timeout=60,
                   what="the migration to move 5,000 tasks")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    partial = sum(record_count(r, k) for k in namespace_keys(r, "big3"))
    assert proc.returncode == -signal.SIGKILL and partial < TASKS, partial  # killed half-way

    done = subprocess.run(_cli(redis_url, "migrate", "big3", "--shards", "3", "--yes", "--json"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["present"] > 0 and partial + sum(report["tasks"].values()) == TASKS  # the rest, once
    dst = TaskQueue.from_url(redis_url, "big3", host_gate=True, shards=3)
    stats = dst.stats()
    assert stats["queued"] == queued and stats["completed_history"] == 50 and stats["remembered"] == 50
    urls = _urls_in(r, "big3")
    assert len(urls) == len(set(urls)) == TASKS  # each task once: none lost, none twice
    assert sorted(item["url"] for item in iter_items(r, "big3")) == sorted(
        item["url"] for item in iter_items(r, "big"))


def test_refusals_are_one_line(redis_url: str, r: redis.Redis) -> None:
    TaskQueue.from_url(redis_url, "big").enqueue_many(["https://a.example/1"])
    heartbeat(r, "big", "node-1:4242")
    refused = subprocess.run(_cli(redis_url, "migrate", "big2", "--shards", "4", "--yes"),
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "stop the workers of 'big' first" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    r.delete("cha:{big}:workers")
    missing = subprocess.run(_cli(redis_url, "migrate", "big2", "--yes"), capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "--shards" in missing.stderr
    assert not r.exists("cha:{big2}:meta")
