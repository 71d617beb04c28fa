"""``celery-ha up`` and its supervisor: everything starts, Ctrl-C stops every process it started."""

from __future__ import annotations

import base64
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from celery_ha.cli.context import CLIContext
from celery_ha.cli.up_cmd import FLOWER_USER, build_plan, child_env, flower_auth
from celery_ha.runtime.redis_process import free_port
from celery_ha.runtime.supervisor import Supervisor, group_alive
from celery_ha.state.worker_registry import list_workers
from tests.support.cli import SECRET, assert_one_line_error, interrupt, pids_with_env, reaped, run
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
        credentials = (tmp_path / "state" / "flower.auth").read_text().strip()
        assert stat.S_IMODE((tmp_path / "state" / "flower.auth").stat().st_mode) == 0o600
        assert _flower_status(port) == 401  # behind basic auth by default
        assert _flower_status(port, "celery-ha:wrong") == 401
        assert _flower_status(port, credentials) == 200
        password = credentials.partition(":")[2]
        cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids_with_env(marker)]
        assert cmdlines and not any(password.encode() in line for line in cmdlines)  # not in `ps`
        out = interrupt(proc, marker, returncode=0, says="all processes stopped",
                        what="all up processes gone")
        assert out.count(password) == 1  # shown once, when generated


def _flower_status(port: int, credentials: str | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/")
    if credentials:
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _plan(redis_url: str, data_dir: Path) -> tuple[CLIContext, dict[str, tuple[list[str], dict[str, str]]]]:
    obj = CLIContext(redis_url_option=redis_url)
    auth = flower_auth(obj, data_dir)
    plan = build_plan(obj, "celery_ha", child_env(obj), data_dir, concurrency=1, loglevel="info",
                      no_beat=False, no_flower=False, flower_port=5555, auth=auth)
    return obj, {name: (argv, env) for name, argv, env in plan}


def test_up_gives_flower_a_generated_login_through_its_environment(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_HA_FLOWER_AUTH", raising=False)
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    data_dir = tmp_path / "state"
    obj = CLIContext(redis_url_option=redis_url)
    first = flower_auth(obj, data_dir)
    assert first.generated and first.users == FLOWER_USER and first.credentials not in repr(first)
    user, _, password = first.credentials.partition(":")
    assert user == FLOWER_USER and len(password) >= 20
    auth_file = data_dir / "flower.auth"
    assert auth_file.read_text().strip() == first.credentials
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600 and stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    again = flower_auth(obj, data_dir)
    assert again.credentials == first.credentials and not again.generated  # generated once

    _, plan = _plan(redis_url, data_dir)
    argv, env = plan["flower"]
    assert "flower" in argv and "--address=127.0.0.1" in argv
    # Flower reads FLOWER_BASIC_AUTH like --basic-auth; a command line would show it to every local user.
    assert env["FLOWER_BASIC_AUTH"] == first.credentials
    assert not any(password in arg or arg.startswith("--basic-auth") for arg in argv)
    assert "FLOWER_BASIC_AUTH" not in plan["worker"][1] and "FLOWER_BASIC_AUTH" not in plan["beat"][1]


def test_up_flower_login_from_the_environment(redis_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    monkeypatch.setenv("CELERY_HA_FLOWER_AUTH", "ops:chosen-pw,viewer:other-pw")
    _, plan = _plan(redis_url, tmp_path / "state")
    assert plan["flower"][1]["FLOWER_BASIC_AUTH"] == "ops:chosen-pw,viewer:other-pw"
    assert not (tmp_path / "state" / "flower.auth").exists()  # nothing generated
    monkeypatch.delenv("CELERY_HA_FLOWER_AUTH")
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "flowers:own-var")  # Flower's own variable is honoured too
    _, plan = _plan(redis_url, tmp_path / "state")
    assert plan["flower"][1]["FLOWER_BASIC_AUTH"] == "flowers:own-var"


def test_a_bad_flower_auth_knob_is_one_line_without_the_value(tmp_path: Path) -> None:
    result = run(["up", "--no-beat"], env={"CELERY_HA_FLOWER_AUTH": SECRET,
                                            "CELERY_HA_DATA_DIR": str(tmp_path / "state")})
    assert_one_line_error(result, contains="CELERY_HA_FLOWER_AUTH")


def test_up_with_unreachable_redis_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([*CLI, "--redis-url", "redis://u:pw-123@127.0.0.1:1/0", "up", "--no-flower"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis" in lines[0] and "pw-123" not in result.stderr
