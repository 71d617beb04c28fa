"""A real worker says at start-up which patches are on and how its refill messages reach the broker,
and a lost broker is retried within a second (``quick_reconnect``): if Celery stops connecting
through ``Consumer.ensure_connected`` or kombu stops taking the intervals, the retries are Celery's
own again (2 s, 4 s, 6 s …) and the test fails."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from celery_ha.runtime.redis_process import RedisProcess, free_port
from celery_ha.state.worker_registry import list_workers
from tests.support.celery_fixtures import make_cluster, site  # noqa: F401  (fixtures)
from tests.support.celery_helpers import wait_for

ALL_ON = "kombu_fixes, kombu_client_reuse, kombu_lean_acks, quick_reconnect, child_reaper"


def _startup_line(log: str) -> str | None:
    found = re.search(r"celery-ha patches: .*", log)
    return found.group() if found else None


@pytest.mark.parametrize(("script_push", "dispatch"), [
    ("1", "script push"),
    ("0", "Python publish (CELERY_HA_SCRIPT_PUSH=0)"),
])
def test_a_worker_names_its_patches_and_dispatch_path(make_cluster, script_push: str,  # noqa: F811
                                                      dispatch: str) -> None:
    cluster = make_cluster(CELERY_HA_SCRIPT_PUSH=script_push)
    worker = cluster.worker("w1", concurrency=1)
    line = wait_for(lambda: _startup_line(cluster.log_text(worker)), timeout=30, message="start-up line")
    assert line == f"celery-ha patches: {ALL_ON}; refill dispatch: {dispatch}"
    assert "celery-ha patch " not in cluster.log_text(worker)  # no patch switched itself off
    # `celery-ha workers` shows the same report beside the node's processes.
    workers = wait_for(lambda: list_workers(cluster.q.client, cluster.namespace), timeout=30,
                       message="registered pool process")
    assert {(w["patches"], w["dispatch"]) for w in workers} == {(ALL_ON, dispatch)}


def test_a_lost_broker_is_retried_within_a_second_and_the_crawl_resumes(
        make_cluster, site, tmp_path: Path) -> None:  # noqa: F811
    broker = RedisProcess(port=free_port(), data_dir=tmp_path / "broker").start()
    restarted = None
    try:
        cluster = make_cluster(broker_url=broker.url)
        worker = cluster.worker("w1", concurrency=1)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait(timeout=10)
        # Celery logs each failed attempt with the wait before the next: under a second at first
        # ("now"), then RETRY_START + n * RETRY_STEP. Celery's own would be 2 s, then 4 s.
        wait_for(lambda: "Trying again in 1.70 seconds" in cluster.log_text(worker), timeout=30,
                 message="the fourth retry")
        log = cluster.log_text(worker)
        assert "Trying again now" in log and "Trying again in 1.20 seconds" in log, log[-3000:]
        assert "Trying again in 2.00 seconds" not in log and "in 4.00 seconds" not in log, log[-3000:]
        restarted = RedisProcess(port=broker.port, data_dir=tmp_path / "broker-new").start()
        tid = cluster.q.enqueue(site.case_url(1))
        cluster.pump()
        wait_for(lambda: cluster.state(tid) == "completed", timeout=30, message="a page after the return")
    finally:
        broker.stop()
        if restarted is not None:
            restarted.stop()
