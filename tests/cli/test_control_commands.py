"""``celery-ha cancel`` / ``pause`` / ``resume``: on a real Redis, and with real workers and pump."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.sink import count_items
from tests.support.celery_fixtures import make_cluster, site
from tests.support.celery_helpers import wait_for
from tests.support.cli import assert_one_line_error, run

__all__ = ["make_cluster", "site"]


def cli(url: str, namespace: str, *args: str):
    return run(["--redis-url", url, "--namespace", namespace, *args])


def test_cancel_reports_each_id(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="cc")
    a, b = q.enqueue_many(["http://example.com/a", "http://example.com/b"])
    result = cli(redis_url, "cc", "cancel", a, "nosuchtask00", "--reason", "wrong seed")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [f"{a}: cancelled (was queued)", "nosuchtask00: unknown"]
    assert q.get(a).error == "cancelled: wrong seed" and q.get(b).state == "queued"
    result = cli(redis_url, "cc", "cancel", "--json", a, b)
    assert result.exit_code == 0
    assert json.loads(result.stdout)["results"] == {a: "already finished", b: "cancelled (was queued)"}
    assert_one_line_error(cli(redis_url, "cc", "cancel"), code=2)


def test_pause_and_resume_flags(redis_url: str, r: redis.Redis) -> None:
    TaskQueue.from_url(redis_url, namespace="pz").enqueue("http://example.com/")  # a namespace in use
    assert "paused" in cli(redis_url, "pz", "pause", "--reason", "site maintenance").stdout
    assert "already paused" in cli(redis_url, "pz", "pause").stdout
    stats = json.loads(cli(redis_url, "pz", "stats", "--json").stdout)
    assert stats["paused"]["reason"] == "site maintenance"
    assert "paused" in cli(redis_url, "pz", "stats").stdout
    assert "resumed" in cli(redis_url, "pz", "resume").stdout
    assert "was not paused" in cli(redis_url, "pz", "resume").stdout
    assert json.loads(cli(redis_url, "pz", "stats", "--json").stdout)["paused"] is None
    assert not r.hexists(QueueKeys("pz").meta, "paused")


@pytest.mark.slow
def test_pause_stops_a_real_pump_and_resume_restarts_it(make_cluster, site) -> None:
    cluster = make_cluster()
    cluster.worker("w1", concurrency=2)
    cluster.beat()
    url = cluster.state_url
    assert cli(url, cluster.namespace, "pause").exit_code == 0
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(6)])
    assert cluster.pump() == 0  # this process's pump sees the pause at once

    meta = QueueKeys(cluster.namespace).meta
    first = int(cluster.r.hget(meta, "last_sweep") or 0)
    # Two sweeps of beat later (each pumps), nothing was dispatched: the workers honour it too.
    wait_for(lambda: int(cluster.r.hget(meta, "last_sweep") or 0) > first, timeout=20, message="a sweep")
    second = int(cluster.r.hget(meta, "last_sweep"))
    wait_for(lambda: int(cluster.r.hget(meta, "last_sweep") or 0) > second, timeout=20, message="another")
    stats = cluster.q.stats()
    assert (stats["queued"], stats["dispatched"], stats["completed"]) == (6, 0, 0), stats
    assert not site.hits(prefix="/case/")

    assert cli(url, cluster.namespace, "resume").exit_code == 0
    wait_for(lambda: all(i.state == "completed" for i in cluster.q.get_many(ids)), timeout=30,
             message="every page after resume")


@pytest.mark.slow
def test_cancel_stops_a_running_task_at_its_next_write(make_cluster, site) -> None:
    cluster = make_cluster(CELERY_HA_LEASE_TTL="30", CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/slow/"] = 0.2
    cluster.worker("w1", concurrency=1)
    tid = cluster.q.enqueue(f"{site.url}/slow/C1", task="test_steps", meta={"n": 40})
    cluster.pump()
    wait_for(lambda: len(site.hits(prefix="/slow/C1/")) >= 3, message="three steps")
    result = cli(cluster.state_url, cluster.namespace, "cancel", tid, "--reason", "not needed")
    assert result.exit_code == 0 and "cancelled (was running)" in result.stdout
    items_at_cancel = count_items(cluster.r, cluster.namespace)
    # The worker is free again (a new task runs) and the cancelled one stopped early.
    other = cluster.q.enqueue(site.case_url(1))
    cluster.pump()
    wait_for(lambda: cluster.state(other) == "completed", timeout=30, message="the next task")
    info = cluster.q.get(tid)
    assert info.state == "dead" and info.error == "cancelled: not needed"
    assert len(site.hits(prefix="/slow/C1/")) < 40
    assert count_items(cluster.r, cluster.namespace) <= items_at_cancel + 1  # the page's own item
