"""``celery-ha demo`` for real: a short chaos run must verify 0 lost / 0 duplicates and leave nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from celery_ha.demo.runner import broker_url_for, inject_failures
from celery_ha.demo.site import DemoSite
from celery_ha.runtime.embedded import EmbeddedRedis
from tests.support.cli import interrupt, pids_with_env, reaped
from tests.support.polling import wait_until

CLI = [sys.executable, "-m", "celery_ha.cli"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CELERY_HA_REDIS_URL", None)
    env["CELERY_HA_DATA_DIR"] = str(tmp_path / "state")
    return env


@pytest.mark.slow
def test_short_chaos_demo_verifies_and_cleans_up(tmp_path: Path) -> None:
    """As a user runs it: no CELERY_HA_REDIS_URL, so on the embedded Redis, which it stops again."""
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    report_file = tmp_path / "report.json"
    cmd = [*CLI, "--namespace", namespace, "demo", "--pages", "150", "--workers",
           "2", "--concurrency", "3", "--chaos", "--timeout", "200", "--report-json", str(report_file)]
    proc = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    with reaped(proc, f"CELERY_HA_NAMESPACE={namespace}"):
        out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out[-4000:]
    assert "VERIFIED: 0 lost, 0 duplicate items" in out
    report = json.loads(report_file.read_text())
    assert report["verified"] is True
    assert (report["lost"], report["duplicates"], report["unexpected"]) == (0, 0, 0)
    assert report["pages"] == report["expected_pages"] == 150 - report["expected_dead"]
    assert report["list_items"] == 150
    assert report["dead"] == report["expected_dead"] >= 1
    kinds = [k["kind"] for k in report["kills"]]
    # A pool child is killed only while it holds a task; a short run on a busy machine may find fewer
    # busy moments than the five planned, so at least one child kill plus the whole worker.
    assert kinds.count("worker") == 1 and kinds.count("pool child") >= 1
    assert report["failovers_recovered"] == report["failovers"] == len(kinds)
    assert all(k["latency_s"] < 30 for k in report["kills"])
    assert report["workers_started"] == 3  # two, plus the replacement of the killed one
    assert "Traceback" not in out
    assert pids_with_env(f"CELERY_HA_NAMESPACE={namespace}") == []  # every child is gone
    embedded = EmbeddedRedis(tmp_path / "state")
    assert not embedded.status().running  # the demo started it, so the demo stopped it
    client = redis.Redis.from_url(embedded.ensure_running())  # ... and its data survived (AOF)
    try:
        assert client.hlen(f"cha:{{{namespace}}}:items") == report["items"]
    finally:
        client.close()
        embedded.stop()


@pytest.mark.slow
def test_ctrl_c_stops_every_demo_process(redis_url: str, tmp_path: Path) -> None:
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    marker = f"CELERY_HA_NAMESPACE={namespace}"
    cmd = [*CLI, "--redis-url", redis_url, "--namespace", namespace, "demo", "--pages", "5000",
           "--workers", "1", "--concurrency", "2", "--timeout", "300"]
    proc = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    with reaped(proc, marker):
        wait_until(lambda: len(pids_with_env(marker)) >= 4, timeout=90, what="worker, pool and beat up")
        interrupt(proc, marker, returncode=130, says="interrupted", what="all demo processes gone")


def test_demo_refuses_a_namespace_it_did_not_create(redis_url: str, tmp_path: Path) -> None:
    from celery_ha import TaskQueue

    TaskQueue.from_url(redis_url, namespace="precious").enqueue("https://example.com/")
    # The namespace before the command (global) and after it (the demo's own option) mean the same.
    for where in (["--namespace", "precious", "demo"], ["demo", "--namespace", "precious"]):
        result = subprocess.run([*CLI, "--redis-url", redis_url, *where, "--pages", "20"],
                                env=_env(tmp_path), capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            "Error: namespace 'precious' holds data the demo did not create; pick another one with "
            "--namespace"]
    assert TaskQueue.from_url(redis_url, namespace="precious").stats()["queued"] == 1


def test_broker_gets_its_own_database() -> None:
    assert broker_url_for("redis://h:1/0") == "redis://h:1/1"
    assert broker_url_for("redis://:pw@h:1") == "redis://:pw@h:1/1"
    assert broker_url_for("rediss://h:1/15") == "rediss://h:1/0"
    assert broker_url_for("unix:///tmp/r.sock") == "unix:///tmp/r.sock"


def test_injected_failures_are_few_and_deterministic() -> None:
    site = DemoSite(total=2000)
    permanent = inject_failures(site, 2000)
    assert len(permanent) == 5 and permanent == inject_failures(DemoSite(total=2000), 2000)
    assert 1 <= len(inject_failures(DemoSite(total=150), 150)) <= 2
