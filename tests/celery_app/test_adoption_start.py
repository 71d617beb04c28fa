"""A team's app whose worker or beat cannot work stops at start-up with one line (exit 2) instead of
starting and failing at every hook: no state Redis although the app has a broker of its own; a state
Redis that refuses the password. And a worker of the team's queues only is told what it leaves out in
words that fit a namespace given to ``init_app``. Real ``celery`` processes; a redis-server of this
module's own with a password."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ha.base.masking import mask_url
from celery_ha.runtime.redis_process import RedisProcess, free_port
from celery_ha.runtime.resolve import NO_REDIS_URL
from tests.support.adoption import CeleryProcess, worker_args, write_app

PASSWORD = "Adoption-pw-0123456789"
WRONG = "WrongSecret-99999999"

APP_PY = '''
import os
from celery import Celery
import celery_ha

app = Celery("team", broker=os.environ["TEAM_BROKER"])
settings = {"namespace": os.environ["TEAM_NS"]}
if os.environ.get("TEAM_STATE"):
    settings["redis_url"] = os.environ["TEAM_STATE"]
celery_ha.init_app(app, **settings)
'''


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A redis-server that requires a password (this module's own, on a free loopback port)."""
    server = RedisProcess(port=free_port(), data_dir=tmp_path_factory.mktemp("secured"), password=PASSWORD)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_app(tmp_path, "team", APP_PY)
    return tmp_path


def _env(server: RedisProcess, state_password: str | None, **more: str) -> dict[str, str]:
    base = f"redis://:{PASSWORD}@127.0.0.1:{server.port}"
    env = {"TEAM_BROKER": f"{base}/1", "TEAM_NS": f"team{uuid.uuid4().hex[:6]}", **more}
    if state_password is not None:
        env["TEAM_STATE"] = f"redis://:{state_password}@127.0.0.1:{server.port}/0"
    return env


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_an_app_with_its_own_broker_and_no_state_redis_stops_in_one_line(
        folder: Path, secured: RedisProcess, command: str) -> None:
    """The worker connected, forked and died with a CRITICAL traceback; beat ran on, warning at every
    sweep. Both now stop before starting, as the ready-made app does."""
    args = worker_args("noredis@localhost") if command == "worker" else ("beat", "-l", "info",
                                                                          "-s", str(folder / "beat-schedule"))
    proc = CeleryProcess(folder, "team", *args, **_env(secured, None))
    try:
        assert proc.exit_code() == 2, proc.text
        assert proc.lines == [f"celery-ha: configuration error: {NO_REDIS_URL}"]
    finally:
        proc.stop()


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_a_state_redis_that_refuses_the_password_stops_the_process_in_one_line(
        folder: Path, secured: RedisProcess, command: str) -> None:
    """The worker warned at each heartbeat and reported "ready"; now it (and beat) stop at start-up with
    one masked line."""
    args = worker_args("wrongpw@localhost") if command == "worker" else ("beat", "-l", "info",
                                                                          "-s", str(folder / "beat-schedule"))
    proc = CeleryProcess(folder, "team", *args, **_env(secured, WRONG))
    try:
        assert proc.exit_code() == 2, proc.text
        url = mask_url(f"redis://:{WRONG}@127.0.0.1:{secured.port}/0")
        # beat has set its logging up by then: the line is logged (as a WARNING) after its banner
        assert f"celery-ha: refusing to start: the state Redis at {url} refused the credentials: " \
            in proc.lines[-1], proc.text
        if command == "worker":
            assert len(proc.lines) == 1, proc.text
        assert "check the user and password of CELERY_HA_REDIS_URL, or init_app's redis_url" in proc.lines[-1]
        assert WRONG not in proc.text and PASSWORD not in proc.text
        assert "ready." not in proc.text and "Traceback" not in proc.text
    finally:
        proc.stop()


def test_the_right_password_still_starts(folder: Path, secured: RedisProcess) -> None:
    proc = CeleryProcess(folder, "team", *worker_args("rightpw@localhost"), **_env(secured, PASSWORD))
    try:
        proc.wait_for(" ready.")
        assert "refusing" not in proc.text
    finally:
        proc.stop()


def test_a_worker_of_the_teams_queues_is_told_in_words_that_fit_init_app(
        folder: Path, secured: RedisProcess) -> None:
    env = _env(secured, PASSWORD)
    proc = CeleryProcess(folder, "team", *worker_args("teamq@localhost", "-Q", "team"), **env)
    try:
        proc.wait_for(" ready.")
        [line] = [line for line in proc.lines if "consumes none of namespace" in line]
        assert line == (
            f"celery-ha: this worker consumes none of namespace '{env['TEAM_NS']}''s durable tasks: -Q team "
            f"leaves out '{env['TEAM_NS']}.crawl' (the namespace of CELERY_HA_NAMESPACE or "
            "init_app(namespace=...)): add it to -Q for this worker to run them; a worker meant for your "
            "other queues only may ignore this, it does not count as a worker of the namespace")
    finally:
        proc.stop()
