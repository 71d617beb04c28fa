"""``celery-ha up`` and its supervisor: everything starts, Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from celery_ha.runtime.redis_process import free_port
from celery_ha.runtime.supervisor import Supervisor, group_alive
from celery_ha.state.worker_registry import list_workers
from tests.support.cli import interrupt, pids_with_env, reaped
from tests.support.polling import wait_until

CLI = [sys.executable, "-m", "celery_ha.cli"]


def test_supervisor_stops_whole_process_groups() -> None:
    sup = Supervisor(stop_timeout=5)
    # Background grandchildren of the shell must die with its process group.
    child = sup.start("tree", ["sh", "-c", "sleep 300 & sleep 300 & wait"])
    stubborn = sup.start("stubborn", [sys.executable, "-c",
                                      "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                                      "print('ready', flush=True); signal.pause()"])
    assert child.pid and stubborn.pid
    children = Path(f"/proc/{child.pid}/task/{child.pid}/children")
    wait_until(lambda: len(children.read_text().split()) == 2, timeout=10)
    sup.stop_all(timeout=1)  # the stubborn one needs SIGKILL after the timeout
    assert not group_alive(child.pid) and not group_alive(stubborn.pid)
    sup.stop_all()  # idempotent


def test_supervisor_restart_and_exited() -> None:
    sup = Supervisor(stop_timeout=2)
    try:
        sup.start("quick", [sys.executable, "-c", "pass"])
        exited = wait_until(lambda: sup.exited(), timeout=10)
        assert [c.name for c in exited] == ["quick"]
        sup.restart("quick")
        assert sup.children["quick"].restarts == 1
    finally:
        sup.stop_all()


@pytest.mark.slow
def test_up_runs_worker_beat_flower_and_ctrl_c_stops_all(redis_url: str, tmp_path: Path) -> None:
    namespace = f"up-{uuid.uuid4().hex[:8]}"
    marker = f"CELERY_HA_NAMESPACE={namespace}"
    port = free_port()
    env = dict(os.environ, CELERY_HA_DATA_DIR=str(tmp_path / "state"), CELERY_BROKER_URL=redis_url)
    env.pop("CELERY_HA_REDIS_URL", None)
    proc = subprocess.Popen([*CLI, "--redis-url", redis_url, "--namespace", namespace, "up", "--concurrency",
                             "1", "--flower-port", str(port), "--loglevel", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path,
                            # as a shell starts a background job: SIGINT ignored; `up` must still obey it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    with reaped(proc, marker):
        import redis

        client = redis.Redis.from_url(redis_url, decode_responses=True)
        wait_until(lambda: list_workers(client, namespace), timeout=90, what="worker registered")

        def flower_up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        wait_until(flower_up, timeout=90, interval=0.2, what="flower answering")
        assert len(pids_with_env(marker)) >= 4  # worker + its pool child + beat + flower
        interrupt(proc, marker, returncode=0, says="all processes stopped", what="all up processes gone")


def test_up_with_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([*CLI, "--redis-url", "redis://u:pw-123@127.0.0.1:1/0", "up", "--no-flower"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis" in lines[0] and "pw-123" not in result.stderr
