"""A worker started with a setting that could only fail later stops at once with one line (exit 2), or
warns: a broker URL kombu cannot use, a missing extra task module, a shard count other than the one the
namespace holds its tasks in, a ``-Q`` that leaves out the namespace's crawl queue. Real ``celery``
processes against the session's redis-server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from tests.celery_app.test_own_app import CELERY, _clean_env
from tests.support.polling import wait_until


def _start(tmp_path: Path, redis_url: str, *extra: str, timeout: float = 60, **env: str
           ) -> tuple[int | None, list[str]]:
    """Run a worker that should stop by itself (killed after ``timeout`` s if it does not): (exit code,
    or None when it had to be killed; its output's lines)."""
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([CELERY, "-A", "celery_ha", "worker", "-P", "solo", "-l", "info", *extra],
                                cwd=tmp_path, env=_clean_env(CELERY_HA_REDIS_URL=redis_url, **env),
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    return code, [line for line in log.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize(("env", "says"), [
    ({"CELERY_BROKER_URL": "foo://"}, "CELERY_BROKER_URL='foo://': kombu has no transport 'foo'"),
    ({"CELERY_BROKER_URL": "redis://127.0.0.1:1/abc"}, "the database ('abc') must be a number"),
    ({"CELERY_HA_EXTRA_IMPORTS": "no_such_module_here"},
     "CELERY_HA_EXTRA_IMPORTS: no module named 'no_such_module_here'"),
])
def test_a_setting_that_can_only_fail_later_stops_the_worker_in_one_line(
        tmp_path: Path, redis_url: str, env: dict[str, str], says: str) -> None:
    code, lines = _start(tmp_path, redis_url, **env)
    assert code == 2, lines
    assert len(lines) == 1 and says in lines[0], lines


def test_a_shard_count_other_than_the_namespaces_stops_the_worker(tmp_path: Path, redis_url: str) -> None:
    TaskQueue.from_url(redis_url, "sharded", shards=4).enqueue("https://example.com/a")
    code, lines = _start(tmp_path, redis_url, CELERY_HA_NAMESPACE="sharded")
    assert code == 2, lines
    assert len(lines) == 1 and "holds tasks in 4 shard(s); CELERY_HA_SHARDS=1" in lines[0], lines


def test_a_worker_whose_queues_leave_out_the_crawl_queue_says_so(tmp_path: Path, redis_url: str) -> None:
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([CELERY, "-A", "celery_ha", "worker", "-P", "solo", "-l", "info",
                                 "-Q", "proj"],
                                cwd=tmp_path, env=_clean_env(CELERY_HA_REDIS_URL=redis_url,
                                                             CELERY_HA_NAMESPACE="shopq"),
                                stdout=out, stderr=subprocess.STDOUT)
        try:  # it runs (it may serve other queues), and says what it will not do
            wait_until(lambda: "consumes none of namespace 'shopq'" in log.read_text(), timeout=30,
                       what="the warning")
            assert proc.poll() is None and "'shopq.crawl'" in log.read_text()
        finally:
            proc.kill()
            proc.wait()


def test_a_worker_of_other_queues_is_no_worker_of_the_namespace(tmp_path: Path, redis_url: str) -> None:
    """Its pool processes heartbeat only the registries of the namespaces whose durable queues it
    consumes: the window and ``celery-ha workers`` do not count it where its -Q leaves them out."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    served, left_out = QueueKeys("runq").workers, QueueKeys("idleq").workers
    client.delete(served, left_out)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([CELERY, "-A", "celery_ha", "worker", "-P", "prefork", "-c", "1",
                                 "-l", "info", "-Q", "runq.crawl,proj"],
                                cwd=tmp_path, env=_clean_env(CELERY_HA_REDIS_URL=redis_url,
                                                             CELERY_HA_NAMESPACES="idleq,runq",
                                                             CELERY_HA_HEARTBEAT_INTERVAL="0.2"),
                                stdout=out, stderr=subprocess.STDOUT)
        try:  # the pool process beats runq's registry again and again, never idleq's
            wait_until(lambda: client.zcard(served) == 1, timeout=60, what="the child's first heartbeat")
            first = client.zrange(served, 0, 0, withscores=True)[0][1]
            wait_until(lambda: client.zrange(served, 0, 0, withscores=True)[0][1] >= first + 600,
                       timeout=30, what="three more heartbeats")
            assert client.zcard(left_out) == 0, client.zrange(left_out, 0, -1)
            assert "consumes none of namespace 'idleq'" in log.read_text()
        finally:
            proc.kill()
            proc.wait()
