"""A broker SIGKILLed and restarted empty: the messages it held are gone, and the crawl resumes within
seconds of its return (the marker check), not after CELERY_HA_REDISPATCH_AFTER."""

from __future__ import annotations

import signal

import pytest

from celery_ha.runtime.redis_process import RedisProcess
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow


def test_broker_restarted_empty_resumes_within_seconds(make_cluster, site, broker_redis, tmp_path):
    # The redispatch timeout is far beyond the deadline below: only the marker check can pass it.
    cluster = make_cluster(broker_url=broker_redis.url, CELERY_HA_REDISPATCH_AFTER="300",
                           CELERY_HA_WINDOW="4", CELERY_HA_LEASE_TTL="10", CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/case/"] = 0.3
    worker = cluster.worker("w1", concurrency=2)
    beat = cluster.beat()  # as in production: its sweeps (run by the workers) check the broker's marker
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(24)])
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 4, timeout=30, message="4 pages before the loss")

    assert broker_redis.proc is not None
    broker_redis.proc.send_signal(signal.SIGKILL)
    broker_redis.proc.wait(timeout=10)
    stats = cluster.q.stats()
    assert stats["dispatched"] > 0, stats  # messages were in the broker when it died
    restarted = RedisProcess(port=broker_redis.port, data_dir=tmp_path / "broker-new").start()
    try:
        first_progress, recovery = cluster.recovery(ids, "the broker came back empty")
        infos = cluster.q.get_many(ids)
        assert not [(i.id, i.attempts) for i in infos if i.attempts]  # the loss counted against no task
        log = cluster.log_text(worker)
        assert "the broker lost its messages" in log, log[-3000:]
        print(f"broker restarted empty: first page {first_progress:.1f}s, crawl finished {recovery:.1f}s "
              "after its return")
    finally:
        cluster.kill_group(worker)
        cluster.kill_group(beat)
        restarted.stop()
