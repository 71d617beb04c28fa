"""Flower tells the truth about durable tasks: a real Flower (basic auth) watching real workers shows
a dead letter as FAILURE with its error, a retry waiting in Redis as RETRY with its due time, a
dropped duplicate message as a SUCCESS whose result says "dropped", and the URL of every run."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import requests

from celery_ha.integration.running.celery_outcome import DurableRetry, DurableTaskDead, report
from celery_ha.integration.running.runner import Outcome
from celery_ha.runtime.redis_process import free_port
from tests.support.celery_fixtures import make_cluster, site
from tests.support.celery_helpers import wait_for

__all__ = ["make_cluster", "site"]
AUTH = ("watcher", "flower-test-password")


def test_outcomes_map_to_celery_states() -> None:
    from celery.exceptions import Retry

    assert report(Outcome("completed", "t1", "http://e.com/a")) == "completed http://e.com/a"
    with pytest.raises(DurableTaskDead, match=r"http://e.com/a: HTTP 404"):
        report(Outcome("failed:dead", "t1", "http://e.com/a", "HTTP 404"))
    with pytest.raises(Retry) as retry:
        report(Outcome("failed:retry", "t1", "http://e.com/a", "HTTP 503", due_at=1_900_000_000.0))
    assert isinstance(retry.value.exc, DurableRetry)
    assert "retry due 2030-03-17T17:46:40+00:00" in str(retry.value)
    assert report(Outcome("dropped", "t1", detail="not claimable")) == "dropped: task t1: not claimable"
    with pytest.raises(Retry, match=r"http://e\.com/a: lease lost"):
        report(Outcome("lost", "t1", "http://e.com/a", "lease lost: reclaimed"))


def _flower_tasks(port: int) -> dict[str, Any]:
    response = requests.get(f"http://127.0.0.1:{port}/api/tasks", auth=AUTH, timeout=5)
    response.raise_for_status()
    return response.json()


@pytest.mark.slow
def test_flower_shows_the_durable_outcome(make_cluster, site) -> None:
    cluster = make_cluster(CELERY_HA_MAX_ATTEMPTS="3")
    port = free_port()
    flower = cluster._spawn(["flower", f"--port={port}", "--address=127.0.0.1"], "flower",
                            {"FLOWER_BASIC_AUTH": ":".join(AUTH)})
    def answers() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/api/tasks", auth=AUTH, timeout=2).ok
        except requests.ConnectionError:
            return False

    wait_for(answers, timeout=30, interval=0.2, message="Flower to answer")
    assert requests.get(f"http://127.0.0.1:{port}/api/tasks", timeout=5).status_code == 401  # auth needed
    worker = cluster.worker("w1", concurrency=2)
    site.fail("/case/2", "404")
    site.fail("/case/3", "503")
    ok, dead, retry = (cluster.q.enqueue(site.case_url(n)) for n in (1, 2, 3))
    cluster.pump()
    wait_for(lambda: cluster.state(ok) == "completed" and cluster.state(dead) == "dead"
             and cluster.state(retry) == "delayed", timeout=30, message="the three outcomes in Redis")
    cluster.send_raw("fetch_page", ok)  # a duplicate message of a completed task

    def by_durable_id() -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for uuid, info in _flower_tasks(port).items():
            out.setdefault(uuid.split(".", 1)[0], []).append(info)
        return out

    def states() -> dict[str, set[str]]:
        return {tid: {i["state"] for i in infos} for tid, infos in by_durable_id().items()}

    wait_for(lambda: len(by_durable_id().get(ok, [])) == 2 and states()[ok] == {"SUCCESS"}
             and "FAILURE" in states().get(dead, set()) and "RETRY" in states().get(retry, set()),
             timeout=30, interval=0.3, message="Flower's view of the outcomes")
    tasks = by_durable_id()
    results = sorted(str(i["result"]) for i in tasks[ok])
    assert site.case_url(1) in results[0] and results[0].startswith("'completed")
    assert results[1].startswith("'dropped: task") and "not claimable" in results[1]
    failure = next(i for i in tasks[dead] if i["state"] == "FAILURE")
    assert "DurableTaskDead" in failure["exception"] and site.case_url(2) in failure["exception"]
    assert "404" in failure["exception"]
    retried = next(i for i in tasks[retry] if i["state"] == "RETRY")
    assert site.case_url(3) in retried["exception"] and "retry due" in retried["exception"]
    log = cluster.log_text(worker)
    assert "Traceback" not in log, log[-3000:]  # expected outcomes are logged in one line
    cluster.kill_group(flower)
    assert isinstance(flower, subprocess.Popen)
