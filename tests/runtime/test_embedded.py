"""The embedded Redis: started on demand, shared by concurrent processes, persistent, stoppable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.base.procfs import pid_alive
from celery_ha.base.settings import Settings
from celery_ha.runtime.embedded import EmbeddedRedis, locate_data_dir
from celery_ha.runtime.redis_process import RedisProcess, free_port
from celery_ha.runtime.resolve import resolve_redis_url
from tests.support.cli import poll, run


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private data dir, no CELERY_HA_REDIS_URL; whatever a test starts there is stopped after it."""
    folder = tmp_path / "state"
    monkeypatch.setenv("CELERY_HA_DATA_DIR", str(folder))
    monkeypatch.delenv("CELERY_HA_REDIS_URL", raising=False)
    yield folder
    emb = EmbeddedRedis(folder)
    pid = emb.status().pid
    emb.stop()
    if pid:
        assert not pid_alive(pid)


def test_starts_on_demand_and_attaches(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    assert not emb.status().running
    url = emb.ensure_running()
    assert EmbeddedRedis(data_dir).ensure_running() == url  # a second caller attaches
    st = emb.status()
    assert st.running and st.url == url and st.pid and st.info["aof_enabled"] is True
    assert (data_dir / ".gitignore").read_text().strip().endswith("*")
    assert resolve_redis_url(Settings.from_env()) == url  # the default every entry point uses


def test_two_processes_starting_at_once_get_one_server(data_dir: Path) -> None:
    code = ("import sys, json; from celery_ha.runtime.embedded import EmbeddedRedis; "
            "e = EmbeddedRedis(sys.argv[1]); u = e.ensure_running(); print(json.dumps([u, e.status().pid]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(data_dir)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append(tuple(json.loads(out)))
    assert len(set(results)) == 1  # one URL, one pid
    pid = results[0][1]
    assert pid_alive(pid)  # outlives the processes that started it


def test_data_survives_stop_and_restart(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    client = redis.Redis.from_url(emb.ensure_running())
    client.set("kept", "yes")
    client.rpush("list", *range(100))
    client.close()
    pid = emb.status().pid
    assert emb.stop() is True
    assert not pid_alive(pid) and not emb.status().running
    assert (data_dir / "appendonly.aof").exists()
    assert emb.stop() is False  # already stopped
    client = redis.Redis.from_url(emb.ensure_running())
    assert client.get("kept") == b"yes" and client.llen("list") == 100
    client.close()


def test_foreign_server_on_the_recorded_port_is_not_used(data_dir: Path, tmp_path: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    emb.ensure_running()
    emb.stop()
    other = RedisProcess(port=free_port(), data_dir=tmp_path / "other").start()
    try:
        (data_dir / "redis.port").write_text(str(other.port))  # a stale file pointing elsewhere
        url = emb.ensure_running()
        assert url != other.url
        assert emb.status().pid != other.proc.pid
    finally:
        other.stop()


def test_locate_data_dir_finds_the_project_root(tmp_path: Path) -> None:
    root = tmp_path / "project"
    sub = root / "src" / "pkg"
    sub.mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    assert locate_data_dir(".celery-ha", cwd=sub) == root / ".celery-ha"
    (sub / ".celery-ha").mkdir()
    assert locate_data_dir(".celery-ha", cwd=sub) == sub / ".celery-ha"  # an existing one wins
    assert locate_data_dir(tmp_path / "abs", cwd=sub) == tmp_path / "abs"


def test_cli_uses_embedded_redis_by_default(data_dir: Path) -> None:
    env = {"CELERY_HA_DATA_DIR": str(data_dir), "CELERY_HA_REDIS_URL": None}
    status = run(["redis", "status", "--json"], env=env)
    assert status.exit_code == 0 and json.loads(status.stdout)["running"] is False
    result = run(["enqueue", "https://example.com/"], env=env)  # starts it on demand
    assert result.exit_code == 0, result.output
    data = json.loads(run(["redis", "status", "--json"], env=env).stdout)
    assert data["mode"] == "embedded" and data["running"] and data["keys"] > 0
    assert "running" in run(["redis", "status"], env=env).stdout
    stop = run(["redis", "stop"], env=env)
    assert stop.exit_code == 0 and "stopped" in stop.stdout
    assert "not running" in run(["redis", "stop"], env=env).stdout
    started = run(["redis", "start"], env=env)
    assert started.exit_code == 0 and "running at redis://127.0.0.1:" in started.stdout
    stats = json.loads(run(["stats", "--json"], env=env).stdout)
    assert stats["queued"] == 1  # survived the stop (AOF)


def test_cli_redis_commands_with_an_external_url(redis_url: str) -> None:
    secret_url = redis_url.replace("redis://", "redis://default:pw-xyz@")
    status = run(["--redis-url", redis_url, "redis", "status", "--json"])
    assert status.exit_code == 0 and json.loads(status.stdout)["mode"] == "external"
    for action in ("stop", "start"):
        result = run(["--redis-url", secret_url, "redis", action])
        assert result.exit_code == 2 and "external Redis" in result.stderr and "pw-xyz" not in result.output


def test_embedded_stop_waits_for_the_process(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    emb.ensure_running()
    pid = emb.status().pid
    assert pid and os.path.exists(f"/proc/{pid}")
    emb.stop()
    poll(lambda: not pid_alive(pid), timeout=5)
