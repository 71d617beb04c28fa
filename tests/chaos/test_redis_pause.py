"""The state Redis paused (SIGSTOP) for longer than the lease TTL: every lease expires during the
pause, yet no task is charged an attempt or a stall, and the crawl resumes by itself on SIGCONT."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow



def test_pause_longer_than_the_lease_ttl_counts_no_stall(make_cluster, site, state_redis, redis_server):
    broker = redis_server.url.rsplit("/", 1)[0] + "/10"  # the broker stays up: only state pauses
    redis.Redis.from_url(broker).flushdb()
    cluster = make_cluster(state_url=state_redis.url, broker_url=broker, CELERY_HA_LEASE_TTL="3",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_WINDOW="4")
    site.delays["/case/"] = 1.0  # tasks are running when Redis stops
    worker = cluster.worker("w1", concurrency=2)
    beat = cluster.beat()
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(16)])
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["running"] >= 2, timeout=30, message="two tasks running")

    assert state_redis.proc is not None
    state_redis.proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    wait_for(lambda: time.monotonic() - paused > 7, timeout=10, interval=0.2,
             message="a pause longer than two lease TTLs")  # the pause itself is what is tested
    state_redis.proc.send_signal(signal.SIGCONT)
    first_progress, _ = cluster.recovery(ids, "the pause")
    infos = cluster.q.get_many(ids)
    charged = [(i.id, i.attempts, i.stalls, i.error) for i in infos if i.attempts or i.stalls]
    assert not charged, charged
    stats = cluster.q.stats()
    assert stats["dead"] == 0 and stats["completed"] == 16
    # Every lease reclaimed here expired during the pause, and each was spared its stall. (Usually the
    # sweep reclaims first; when a renewal reaches Redis first after SIGCONT the lease simply lives on.)
    assert stats["reclaimed"] == stats.get("reclaimed_in_outage", 0), stats
    print(f"state Redis paused 7 s (lease TTL 3 s): first page {first_progress:.1f}s after SIGCONT, "
          f"{stats['reclaimed']} lease(s) reclaimed without a stall")
    cluster.kill_group(worker)
    cluster.kill_group(beat)


def test_a_pause_during_the_shutdown_grace_still_stops_the_long_task(make_cluster, site, state_redis,
                                                                     redis_server):
    """A worker told to stop (SIGTERM) while its child runs a 30 s page, the state Redis paused across
    the end of the grace period: the main process's look at its children's leases fails once, looks
    again, and the child hands its task back seconds after the grace period, not when the page ends."""
    broker = redis_server.url.rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(broker).flushdb()
    cluster = make_cluster(state_url=state_redis.url, broker_url=broker, CELERY_HA_LEASE_TTL="3",
                           CELERY_HA_HEARTBEAT_INTERVAL="0.5", CELERY_HA_SOFT_SHUTDOWN_TIMEOUT="2")
    site.delays["/case/"] = 30.0
    worker = cluster.worker("w1", concurrency=1)
    [tid] = cluster.q.enqueue_many([site.case_url(0)])
    cluster.pump()
    wait_for(lambda: cluster.state(tid) == "running", timeout=30, message="the page running")
    os.kill(worker.pid, signal.SIGTERM)  # the main process only: its child is asked after the grace
    stopped = time.monotonic()
    assert state_redis.proc is not None
    wait_for(lambda: time.monotonic() - stopped > 0.3, timeout=5, interval=0.05, message="the grace begun")
    state_redis.proc.send_signal(signal.SIGSTOP)  # from inside the grace period to past its end
    paused = time.monotonic()
    wait_for(lambda: time.monotonic() - paused > 2.5, timeout=5, interval=0.05,
             message="a pause across the end of the grace period")  # the pause itself is what is tested
    state_redis.proc.send_signal(signal.SIGCONT)
    # Handed back: queued, and dispatched again by the hand-back's pump (its message waits for a worker).
    wait_for(lambda: cluster.state(tid) in ("queued", "dispatched"), timeout=12,
             message="the page handed back")
    assert time.monotonic() - stopped < 15  # the page would have ended 30 s after it began
    info = cluster.q.get(tid)
    assert (info.attempts, info.stalls) == (0, 0), info
    assert "asking child" in cluster.log_text(worker)
    cluster.kill_group(worker)
