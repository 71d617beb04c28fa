"""An evicting state Redis is refused by workers and reported by beat, `stats` and `redis status`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.redisio.memory_policy import eviction_policy, eviction_warning
from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.celery_helpers import Cluster, wait_for
from tests.support.cli import run


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "lru",
                          extra_args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]).start()
    yield server
    server.stop()


def test_the_policy_is_read_and_only_noeviction_is_quiet(evicting: RedisProcess, redis_url: str) -> None:
    lru = redis.Redis.from_url(evicting.url, decode_responses=True)
    assert eviction_policy(lru) == "allkeys-lru"
    assert "allkeys-lru" in (eviction_warning("allkeys-lru") or "")
    assert eviction_policy(redis.Redis.from_url(redis_url, decode_responses=True)) == "noeviction"
    assert eviction_warning("noeviction") is None and eviction_warning(None) is None


def test_workers_refuse_an_evicting_redis_unless_told_otherwise(evicting: RedisProcess,
                                                                tmp_path: Path) -> None:
    (tmp_path / "refused").mkdir()
    (tmp_path / "allowed").mkdir()
    refused = Cluster(evicting.url, tmp_path / "refused")
    try:
        proc = refused.worker("w1", wait=False)
        assert proc.wait(timeout=60) == 2
        log = refused.log_text(proc)
        assert "refusing to start" in log and "allkeys-lru" in log and "CELERY_HA_ALLOW_EVICTION" in log
        assert not refused.children("w1-" + refused.namespace + "@localhost")
    finally:
        refused.stop_all()
    allowed = Cluster(evicting.url, tmp_path / "allowed", CELERY_HA_ALLOW_EVICTION="1")
    try:
        proc = allowed.worker("w2", concurrency=1)  # waits until its pool child registered
        wait_for(lambda: "starting anyway" in allowed.log_text(proc), message="the warning in the log")
    finally:
        allowed.stop_all()


def test_stats_and_redis_status_warn(evicting: RedisProcess) -> None:
    env = {"CELERY_HA_REDIS_URL": evicting.url}
    shown = run(["stats"], env=env)
    assert shown.exit_code == 0 and "Warning:" in shown.stderr and "allkeys-lru" in shown.stderr
    data = json.loads(run(["stats", "--json"], env=env).stdout)
    assert data["warnings"] and "allkeys-lru" in data["warnings"][0]
    status = json.loads(run(["redis", "status", "--json"], env=env).stdout)
    assert status["maxmemory_policy"] == "allkeys-lru" and "allkeys-lru" in status["warning"]
