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


class _DiesAtWait(redis.Connection):
    """A connection whose socket dies just as WAIT is written, once: everything before it (the
    script, whole) has reached the server."""

    died = 0

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        items = [command] if isinstance(command, (bytes, str, memoryview)) else list(command)
        for item in items:
            if _DiesAtWait.died == 0 and bytes(item).startswith(b"*3\r\n$4\r\nWAIT\r\n"):
                _DiesAtWait.died += 1
                self.disconnect()
                raise redis.ConnectionError("the socket died while WAIT was being written")
            super().send_packed_command([item], check_health=check_health)


def test_a_send_that_dies_after_the_script_went_whole_is_not_sent_again(
        pair: tuple[RedisProcess, RedisProcess]) -> None:
    """The script reached the server whole and runs; only WAIT's write failed. Sending both again
    would run the script twice (here: two tasks for one enqueue), so the call fails instead, as a
    call whose reply was lost does."""
    master, _ = pair
    pool = redis.ConnectionPool.from_url(master.url, connection_class=_DiesAtWait, decode_responses=True)
    q = TaskQueue(redis.Redis(connection_pool=pool), "once", min_replicas=1, replica_timeout=0.5)
    _DiesAtWait.died = 1  # not yet: the queue's first calls (its registration, layout) go through
    q.enqueue("https://example.com/first", dedup=False)
    _DiesAtWait.died = 0
    with pytest.raises(redis.ConnectionError):
        q.enqueue("https://example.com/a", dedup=False)
    assert _DiesAtWait.died == 1
    assert q.stats()["queued"] == 2  # the first, and this one's script once
