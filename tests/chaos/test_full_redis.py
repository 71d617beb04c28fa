"""A full state Redis (used memory over maxmemory, noeviction) is an outage, not a task failure: no
attempt and no death is counted, and the crawl resumes by itself once memory is free again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.celery_helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "small",
                          extra_args=["--maxmemory-policy", "noeviction"]).start()
    yield server
    server.stop()


def test_a_full_redis_kills_no_task_and_the_crawl_resumes(make_cluster, site, small_redis, redis_server):
    broker = redis_server.url.rsplit("/", 1)[0] + "/9"  # the broker keeps working: only state is full
    redis.Redis.from_url(broker).flushdb()
    cluster = make_cluster(state_url=small_redis.url, broker_url=broker, CELERY_HA_LEASE_TTL="20",
                           CELERY_HA_HEARTBEAT_INTERVAL="1")
    site.delays["/case/"] = 0.05
    worker = cluster.worker("w1", concurrency=2)
    ids = cluster.q.enqueue_many([site.case_url(n) for n in range(60)])
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["completed"] >= 10, timeout=30, message="10 pages before the fill")

    state = redis.Redis.from_url(small_redis.url)
    used = int(state.info("memory")["used_memory"])
    state.config_set("maxmemory", max(1, used // 2))  # Redis is full: every write is refused now
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        state.set("probe", "1")
    done_when_full = cluster.q.stats()["completed"]
    def met_full() -> bool:
        log = cluster.log_text(worker)
        return "Redis unavailable" in log or "cannot claim" in log

    wait_for(met_full, timeout=30, message="the worker to meet the full Redis")

    state.config_set("maxmemory", 0)  # memory raised: nobody restarts or redrives anything
    wait_for(lambda: all(i is not None and i.state == "completed" for i in cluster.q.get_many(ids)),
             timeout=60, interval=0.5, message="every page after memory came back")
    infos = cluster.q.get_many(ids)
    counted = [(i.id, i.attempts, i.error) for i in infos if i.attempts]
    assert not counted, counted
    assert cluster.q.stats()["dead"] == 0 and cluster.q.stats()["completed"] == 60 > done_when_full
