"""A task running when its worker loses the broker: Celery terminates it (acks-late, its message comes
back), celery-ha hands it back without counting an attempt, the worker reconnects to the restarted
broker and runs it again; its output is stored once and the worker process keeps running (no kombu
error on the old channel ends it, see ``integration/patches/kombu_fixes.py``)."""

from __future__ import annotations

import signal

import pytest

from celery_ha.runtime.redis_process import RedisProcess
from celery_ha.state.sink import iter_items
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow


def test_a_task_running_at_a_broker_loss_is_run_again_and_stored_once(make_cluster, site, broker_redis,
                                                                       tmp_path):
    cluster = make_cluster(broker_url=broker_redis.url, CELERY_HA_LEASE_TTL="10",
                           CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/slow/"] = 3.0
    worker = cluster.worker("w1", concurrency=1)
    slow = cluster.q.enqueue(f"{site.url}/slow/long")
    cluster.pump()
    wait_for(lambda: cluster.state(slow) == "running", timeout=30, message="the slow task to start")

    assert broker_redis.proc is not None
    broker_redis.proc.send_signal(signal.SIGKILL)
    broker_redis.proc.wait(timeout=10)
    restarted = RedisProcess(port=broker_redis.port, data_dir=tmp_path / "broker-new").start()
    try:
        wait_for(lambda: cluster.state(slow) == "completed" or worker.poll() is not None, timeout=60,
                 message="the slow task to complete after the broker's return")
        nxt = cluster.q.enqueue(site.case_url(1))
        cluster.pump()
        wait_for(lambda: cluster.state(nxt) == "completed" or worker.poll() is not None, timeout=30,
                 message="a task after the reconnection")
        log = cluster.log_text(worker)
        assert worker.poll() is None, f"the worker exited ({worker.poll()}):\n{log[-4000:]}"
        assert "AttributeError" not in log, log[-4000:]
        info = cluster.q.get(slow)
        assert (info.state, info.attempts) == ("completed", 0), info  # the loss counted no attempt
        keys = [key for key, _ in iter_items(cluster.r, cluster.namespace, with_keys=True)]
        assert keys.count(f"{site.url}/slow/long") == 1, keys  # run twice, stored once
    finally:
        cluster.kill_group(worker)
        restarted.stop()
