"""The project's own ``djproj/celery.py`` with ``celery_ha.init_app(app)``: its worker and beat run
celery-ha from the ``CELERY_HA`` settings dict alone (no ``CELERY_HA_*`` variable in their environment)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis

from celery_ha.demo import DemoSite
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from tests.contrib.django.conftest import PROJECT, Project
from tests.support.polling import wait_until
from tests.support.records import has_record

LEFTOVER = {"url": "https://shop.example/own-app", "task": "fetch_page", "priority": 0, "meta": {},
            "dedup": True}


def test_own_app_worker_and_beat_read_the_celery_ha_dict(project: Project, r: redis.Redis,
                                                            tmp_path: Path) -> None:
    task_id = "LeftOverOwn1"
    project.db.insert_outbox(task_id, LEFTOVER)
    extra = json.dumps({"EXTRA_IMPORTS": "celery_ha.contrib.django.tasks"})
    env = project.environ(DJPROJ_RELAY_INTERVAL="0.5", DJPROJ_EXTRA=extra)
    assert not [k for k in env if k.startswith("CELERY_HA_") or k == "CELERY_BROKER_URL"]
    celery = str(Path(sys.executable).with_name("celery"))
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [celery, "-A", "djproj", "worker", "-B", "--pool", "prefork", "-c", "1", "-l", "info",
             "-n", f"djown-{os.getpid()}@%h", "-s", str(tmp_path / "beat-schedule")],
            cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        # beat (celery-ha's relay entry, from the dict's EXTRA_IMPORTS) pushes the outbox to Redis
        wait_until(lambda: project.db.count("celery_ha_outbox") == 0, timeout=60, interval=0.2,
                   what=f"beat to relay the outbox (log: {log_path})")
        assert has_record(r, QueueKeys("shop"), task_id)
        # the worker serves the dict's namespace on the dict's Redis: a shipped task runs to the end
        q = TaskQueue.from_url(project.env["DJPROJ_REDIS_URL"], namespace="shop")
        with DemoSite(total=10, page_size=10) as site:
            tid = q.enqueue(site.case_url(3), task="fetch_page")
            wait_until(lambda: q.get(tid).state == "completed", timeout=60, interval=0.1,
                       what=f"the page task to complete (log: {log_path})")
        q.client.close()
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert "celery-ha: configuration error" not in log_path.read_text()
