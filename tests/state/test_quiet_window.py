"""A lease that expired while no worker could reach Redis is handed back without a stall."""

from __future__ import annotations

import redis

from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.worker_registry import heartbeat, quiet_window
from tests.support.polling import wait_until


def _expired_lease(q: TaskQueue) -> str:
    tid = q.enqueue("http://example.com/quiet")
    lease = q.claim(tid, "w:1", ttl=0.05)
    assert lease is not None
    wait_until(lambda: redis_now_ms(q.client) > lease.expires_at * 1000, timeout=5, what="the lease expiry")
    return tid


def test_spared_lease_goes_back_without_a_stall(r: redis.Redis, redis_url: str) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "qw")
    tid = _expired_lease(q)
    now = redis_now_ms(r)
    assert q.reclaim_expired(spare=(now - 60_000, now)) == 1
    info = q.get(tid)
    assert info.state == "queued" and info.stalls == 0 and info.attempts == 0
    assert q.stats()["reclaimed_in_outage"] == 1


def test_lease_outside_the_spare_stretch_counts_its_stall(r: redis.Redis, redis_url: str) -> None:
    q = TaskQueue(redis.Redis.from_url(redis_url, decode_responses=True), "qw")
    tid = _expired_lease(q)
    now = redis_now_ms(r)
    assert q.reclaim_expired(spare=(now - 120_000, now - 60_000)) == 1
    assert q.get(tid).stalls == 1 and q.stats().get("reclaimed_in_outage", 0) == 0


def test_heartbeats_record_a_silence_and_the_window_reads_it(r: redis.Redis) -> None:
    assert quiet_window(r, "qw", silence_after=1) is None  # no process ever beat
    first = heartbeat(r, "qw", "n:1", silence_after=0.05)
    assert quiet_window(r, "qw", silence_after=60) is None  # recent beat, no silence recorded
    wait_until(lambda: redis_now_ms(r) - first > 100, timeout=5, what="a silence of 100 ms")
    ongoing = quiet_window(r, "qw", silence_after=0.05)  # the silence going on now
    assert ongoing is not None and ongoing[0] == first and ongoing[1] - first > 100
    second = heartbeat(r, "qw", "n:2", silence_after=0.05)  # ends the silence: recorded
    meta = r.hgetall(QueueKeys("qw").meta)
    assert (int(meta["quiet_from"]), int(meta["quiet_to"])) == (first, second)
    assert quiet_window(r, "qw", silence_after=60) == (first, second)
