"""``celery-ha migrate`` as an operator runs it: a migration SIGKILLed half-way (or between its last
marks, or before it recorded its lineage) and run again ends with every task in the target exactly
once, the old namespace closed and the lineage kept, and the refusals are one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.records import TaskInfo
from celery_ha.state.replay import enqueue_if_absent
from celery_ha.state.shards import namespace_keys
from celery_ha.state.sink import iter_items
from celery_ha.state.worker_registry import heartbeat
from tests.support.polling import wait_until
from tests.support.records import all_records, record_count

TASKS = 60_000


def _cli(redis_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "-n", "big", *args]


# A `celery-ha migrate` that SIGKILLs itself at one instant: before a call of the Redis client on the
# target's meta naming a field (argv: target, method, field, then the CLI's arguments), or when it
# records the target's lineage (method "set_carries").
_KILLED_AT = """
import os, signal, sys
import redis
import celery_ha.state.migrate as migrate
from celery_ha.cli.app import main

target, method, field = sys.argv[1:4]

def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if method == "set_carries":
    migrate.set_carries = die
else:
    real = getattr(redis.Redis, method)
    def trap(self, name, *args, **kwargs):
        if name == "cha:{" + target + "}:meta" and args[:1] == (field,):
            die()
        return real(self, name, *args, **kwargs)
    setattr(redis.Redis, method, trap)
main(args=sys.argv[4:], prog_name="celery-ha")
"""


def _killed_at(redis_url: str, namespace: str, target: str, shards: int, method: str, field: str = ""
               ) -> subprocess.CompletedProcess[str]:
    cli = ["--redis-url", redis_url, "-n", namespace, "migrate", target, "--shards", str(shards), "--yes"]
    return subprocess.run([sys.executable, "-c", _KILLED_AT, target, method, field, *cli],
                          capture_output=True, text=True, timeout=60, check=False)


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


def _refused(redis_url: str, target: str, shards: int, says: str) -> None:
    refused = subprocess.run(_cli(redis_url, "migrate", target, "--shards", str(shards), "--yes"),
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert says in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_refusals_are_one_line(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "big")
    q.enqueue_many(["https://a.example/1", "https://a.example/2"])
    heartbeat(r, "big", "node-1:4242")
    _refused(redis_url, "big2", 4, "stop the workers of 'big' first")
    r.delete("cha:{big}:workers")
    lease = q.claim_next("standalone")  # a worker that does not heartbeat: its lease shows it
    _refused(redis_url, "big2", 4, "'big' first: 1 task(s) hold a lease that has not expired")
    q.complete(lease)
    missing = subprocess.run(_cli(redis_url, "migrate", "big2", "--yes"), capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "--shards" in missing.stderr
    assert not r.exists("cha:{big2}:meta")
    done = subprocess.run(_cli(redis_url, "migrate", "big2", "--shards", "4", "--yes"), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    _refused(redis_url, "big3", 2, "namespace 'big' was migrated to 'big2' already: migrate 'big2' instead")
    assert not r.exists("cha:{big3}:meta")


@pytest.mark.parametrize(("method", "field"), [("hset", "migrated_from"), ("hdel", "migrating_from")])
def test_a_migration_killed_between_its_last_marks_is_finished_by_the_next_run(
        redis_url: str, r: redis.Redis, method: str, field: str) -> None:
    """Killed with every task moved, the marks half written: the next run neither refuses nor leaves
    the old namespace open to new tasks."""
    TaskQueue.from_url(redis_url, "big").enqueue_many([f"https://a.example/{i}" for i in range(100)])
    killed = _killed_at(redis_url, "big", "big2", 3, method, field)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    again = subprocess.run(_cli(redis_url, "migrate", "big2", "--shards", "3", "--yes"), capture_output=True,
                           text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert r.hmget("cha:{big2}:meta", ["migrated_from", "migrating_from"]) == ["big", None]
    assert r.hmget("cha:{big}:meta", ["migrated_to", "migrating_to"]) == ["big2", None]
    late = subprocess.run(_cli(redis_url, "enqueue", "https://a.example/late"), capture_output=True,
                          text=True, timeout=60, check=False)
    assert late.returncode != 0 and "migrated to 'big2'" in late.stderr
    assert TaskQueue.from_url(redis_url, "big2", shards=3).stats()["queued"] == 100


def test_a_migration_killed_before_it_kept_its_lineage_keeps_it_when_run_again(
        redis_url: str, r: redis.Redis) -> None:
    """Dedup tasks queued while the gate was off take new ids (the gate is on now), so the new
    namespace lists the old one in meta ``ancestors``: an outbox replay of their old ids finds them.
    Killed before that was written, the run after finds every task in already (renamed 0) and must
    still write it."""
    urls = [f"http://h{i % 7}.example/a/{i}" for i in range(60)]
    plain = TaskQueue.from_url(redis_url, "big", shards=2).enqueue_many(urls)  # the outbox's ids
    TaskQueue.from_url(redis_url, "big", shards=2, host_gate=True).enqueue_many(["http://h1.example/on"])
    killed = _killed_at(redis_url, "big", "big2", 2, "set_carries")
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    again = subprocess.run(_cli(redis_url, "migrate", "big2", "--shards", "2", "--yes", "--json"),
                           capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["renamed"] == 0  # all in already: this run renamed nothing
    assert json.loads(r.hget("cha:{big2}:meta", "ancestors")) == [{"shards": 2, "by_host": True}]  # big's ids
    dst = TaskQueue.from_url(redis_url, "big2", shards=2, host_gate=True)
    assert not any(enqueue_if_absent(dst, list(zip(plain, urls, strict=True))))
    assert dst.stats()["queued"] == 61
