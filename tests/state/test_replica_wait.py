"""CELERY_HA_MIN_REPLICAS: each transition waits (bounded) until replicas hold it, on a real replica."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.base.settings import Settings
from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.polling import wait_until
from tests.support.records import raw_record


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    master = RedisProcess(port=free_port(), data_dir=tmp_path / "m").start()
    replica = RedisProcess(port=free_port(), data_dir=tmp_path / "r",
                           extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    probe = redis.Redis(port=replica.port)
    wait_until(lambda: probe.info("replication").get("master_link_status") == "up", timeout=10,
               what="the replica to sync")
    yield master, replica
    for server in (replica, master):
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def _timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def test_transitions_wait_for_the_replica_and_stop_waiting_at_the_timeout(
        pair: tuple[RedisProcess, RedisProcess], caplog: pytest.LogCaptureFixture) -> None:
    master, replica = pair
    client = redis.Redis.from_url(master.url, decode_responses=True)
    waiting = TaskQueue(client, "w", min_replicas=1, replica_timeout=0.4)
    plain = TaskQueue(client, "p")
    tid = waiting.enqueue("https://example.com/a")
    lease = waiting.claim(tid, "w1")
    assert lease is not None
    waiting.renew(lease)  # loads the script: a first call meets NOSCRIPT, and waits twice
    assert waiting._scripts.wait.short == 0  # the replica answered every WAIT
    assert raw_record(redis.Redis(port=replica.port, decode_responses=True), waiting.keys, tid) == \
        raw_record(client, waiting.keys, tid)

    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGSTOP)  # the replica stops acknowledging
    try:
        with caplog.at_level("WARNING", logger="celery_ha.redisio.replicas"):
            took = _timed(lambda: waiting.renew(lease))
        assert took >= 0.35, took  # it waited for the replica, up to the timeout
        assert took < 5, took  # and no longer
        assert waiting._scripts.wait.short == 1
        assert any("replica" in rec.getMessage() for rec in caplog.records)
        assert _timed(lambda: plain.enqueue("https://example.com/b")) < 0.35  # no wait configured
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    wait_until(lambda: client.wait(1, 100) == 1, timeout=10, what="the replica to acknowledge again")
    waiting.complete(lease)
    assert waiting.get(tid).state == "completed" and waiting._scripts.wait.short == 1


def test_settings_carry_the_replica_bound() -> None:
    s = Settings.from_env({"CELERY_HA_MIN_REPLICAS": "2", "CELERY_HA_REPLICA_TIMEOUT": "0.5"})
    assert (s.min_replicas, s.replica_timeout) == (2, 0.5)
    q = TaskQueue.for_settings(redis.Redis(port=1), s)
    assert q._scripts.wait is not None and q._scripts.wait.command == ("WAIT", 2, 500)
