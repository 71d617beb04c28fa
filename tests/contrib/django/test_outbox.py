"""The transactional outbox: nothing lost when Redis is frozen or the process dies after the commit,
and a request relayed twice is queued once (dedup or not)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.runtime.redis_process import RedisProcess, free_port
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from tests.contrib.django.conftest import PROJECT, Project
from tests.support.polling import wait_until
from tests.support.records import all_records, has_record

PUSH_TIMEOUT = 0.5  # the test project's CELERY_HA["PUSH_TIMEOUT"]
SLACK = 1.0  # a loaded 2-core machine: process scheduling, Django's commit itself


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own (it gets frozen: the session's server must not be)."""
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "redis").start()
    yield server
    assert server.proc is not None
    server.proc.send_signal(signal.SIGCONT)  # a stopped process would not see the SIGTERM
    server.stop()


def _tasks(client: redis.Redis, namespace: str = "shop") -> dict[str, str]:
    return dict(all_records(client, QueueKeys(namespace)))


def _ready(client: redis.Redis, namespace: str = "shop") -> list[str]:
    ids: list[str] = []
    for band in client.zrange(f"cha:{{{namespace}}}:readyp", 0, -1):
        ids += client.lrange(f"cha:{{{namespace}}}:r:{band}", 0, -1)
    return ids


def _relay(project: Project) -> dict[str, object]:
    out = project.manage("celery_ha", "relay", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("warm", [True, False], ids=["open-connection", "new-connection"])
def test_a_frozen_redis_at_commit_costs_the_timeout_and_the_relay_queues_once(
        database: object, own_redis: RedisProcess, warm: bool) -> None:
    project = Project(database, own_redis.url)  # type: ignore[arg-type]
    project.db.clean()
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    child = project.start("paused", warm=warm)
    assert child.stdout is not None and child.stdin is not None and own_redis.proc is not None
    try:
        assert child.stdout.readline().strip() == "READY"
        before = set(_tasks(client))
        own_redis.proc.send_signal(signal.SIGSTOP)
        child.stdin.write("GO\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        own_redis.proc.send_signal(signal.SIGCONT)
        if child.poll() is None:
            child.kill()
    result = json.loads(out.strip().splitlines()[-1].removeprefix("RESULT "))
    print(f"commit with Redis frozen took {result['seconds']:.3f}s (PUSH_TIMEOUT {PUSH_TIMEOUT}s)")
    # The commit (and its on-commit push) returned after one timeout, not a hang or retries.
    assert result["seconds"] < PUSH_TIMEOUT + SLACK, result
    assert result["seconds"] >= PUSH_TIMEOUT * 0.9, result  # it did wait for Redis, once
    assert result["outbox"] == 2, (result, err)  # both requests kept for the relay
    assert "stay in the outbox" in err
    # With an open connection the script was already in Redis' socket: it runs once Redis resumes,
    # its reply lost. The relay must not queue it again (the random-id task included).
    relayed = _relay(project)
    assert relayed["pushed"] == 2 and relayed["left"] == 0 and relayed["error"] is None
    ids = result["ids"]
    assert all(i in _tasks(client) for i in ids)
    new = [i for i in _ready(client) if i not in before]
    assert sorted(new) == sorted(ids)  # each exactly once
    assert project.db.count("celery_ha_outbox") == 0
    again = _relay(project)  # nothing left: nothing changes
    assert again["pushed"] == 0 and sorted(i for i in _ready(client) if i not in before) == sorted(ids)
    client.close()


def test_a_process_killed_between_commit_and_push_is_relayed_once(project: Project, r: redis.Redis) -> None:
    child = project.start("hold_after_commit")
    assert child.stdout is not None
    try:
        task_id = wait_until(lambda: child.stdout.readline().strip(), what="the task id").removeprefix("ID ")
        assert wait_until(lambda: child.stdout.readline().strip()) == "COMMITTED"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    saved = project.db.query("SELECT id, created_at, namespace, task_id, spec, attempts, last_error "
                             "FROM celery_ha_outbox")
    assert len(saved) == 1 and json.loads(saved[0][4])["dedup"] is False  # committed, never pushed
    assert r.dbsize() == 0
    first = _relay(project)
    assert (first["pushed"], first["created"], first["left"]) == (1, 1, 0)
    assert _ready(r) == [task_id] and r.hget("cha:{shop}:stats", "enqueued") == "1"
    # A relay that pushed and died before its delete: the same row, pushed again, queues nothing new
    # (a random id, dedup off: only "create this id if absent" tells it from a new task).
    project.db.query("INSERT INTO celery_ha_outbox (id, created_at, namespace, task_id, spec, attempts, "
                     "last_error) VALUES ({})".format(", ".join(_literal(v) for v in saved[0])))
    again = _relay(project)
    assert (again["pushed"], again["created"], again["left"]) == (1, 0, 0)
    assert _ready(r) == [task_id] and r.hget("cha:{shop}:stats", "enqueued") == "1"


def _literal(value: object) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


LEFTOVER = {"url": "https://shop.example/left", "task": "fetch_page", "priority": 0, "dedup": False}


def test_a_relay_with_redis_down_keeps_the_rows_and_says_so(project: Project) -> None:
    project.db.insert_outbox("LeftOver0001", LEFTOVER)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    out = project.manage("celery_ha", "relay", env={"DJPROJ_REDIS_URL": dead})
    assert out.returncode == 3, out
    lines = [line for line in out.stderr.splitlines()
             if line.strip() and not line.startswith("celery-ha outbox")]  # the log line of the relay
    assert len(lines) == 1 and lines[0].startswith("Error: Redis did not take the requests"), out.stderr
    assert "1 request(s) stay" in lines[0]
    assert project.db.query("SELECT attempts FROM celery_ha_outbox") == [(1,)]


def test_beat_relays_the_outbox(project: Project, r: redis.Redis, tmp_path: Path) -> None:
    """A real celery-ha worker with beat, set up for the project: the leftover reaches Redis."""
    task_id = "LeftOver0002"
    project.db.insert_outbox(task_id, LEFTOVER)
    url = project.env["DJPROJ_REDIS_URL"]
    env = project.environ(DJANGO_SETTINGS_MODULE="djproj.settings", DJPROJ_RELAY_INTERVAL="0.5",
                          CELERY_HA_REDIS_URL=url, CELERY_HA_NAMESPACE="shop",
                          CELERY_HA_EXTRA_IMPORTS="celery_ha.contrib.django.tasks")
    celery = str(Path(sys.executable).with_name("celery"))
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen(
            [celery, "-A", "celery_ha", "worker", "-B", "--pool", "solo", "-l", "info",
             "-n", f"djbeat-{os.getpid()}@%h", "-s", str(tmp_path / "beat-schedule")],
            cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        wait_until(lambda: project.db.count("celery_ha_outbox") == 0, timeout=60, interval=0.2,
                   what=f"beat to relay the outbox (log: {tmp_path / 'worker.log'})")
        assert has_record(r, QueueKeys("shop"), task_id)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert r.hget("cha:{shop}:stats", "enqueued") == "1"


def test_a_request_past_the_dedup_ttl_crawls_again_and_a_replay_of_it_does_not(
        project: Project, redis_url: str, r: redis.Redis) -> None:
    """``enqueue_on_commit`` of a URL whose task finished more than DEDUP_TTL ago queues a new run,
    as ``enqueue`` does; a row pushed again after its run (a delete lost) changes nothing, however
    long ago that run finished."""
    ttl = {"DJPROJ_EXTRA": json.dumps({"DEDUP_TTL": "1"})}
    url = "https://shop.example/daily-report"
    q = TaskQueue.from_url(redis_url, namespace="shop")

    def run_it(task_id: str) -> float:
        lease = q.claim(task_id, "w")
        assert lease is not None
        q.complete(lease)
        finished = q.get(task_id).updated_at
        assert finished is not None
        return finished

    first = project.scenario("commit_url", env=ttl, url=url)
    assert (first["state"], first["outbox"]) == ("queued", 0)
    finished = run_it(first["id"])
    wait_until(lambda: _redis_seconds(r) > finished + 1.05, timeout=10, what="DEDUP_TTL (Redis clock)")
    # The first request again, pushed past the TTL: its run finished after it was made, nothing to do.
    replayed = project.scenario("replay_row", env=ttl, row=first["row"])
    assert (replayed["relay"]["pushed"], replayed["relay"]["created"]) == (1, 0)
    assert replayed["state"] == "completed" and replayed["stats"]["recrawled"] == 0

    second = project.scenario("commit_url", env=ttl, url=url)  # a new request: a new run
    assert second["id"] == first["id"]
    assert (second["state"], second["outbox"], second["stats"]["recrawled"]) == ("queued", 0, 1)
    assert q.ready_ids() == [first["id"]]
    run_it(second["id"])
    replayed = project.scenario("replay_row", env=ttl, row=second["row"])
    assert (replayed["relay"]["created"], replayed["state"], replayed["stats"]["recrawled"]) == (
        0, "completed", 1)
    assert replayed["stats"]["enqueued"] == 2  # two runs, one per request


def _redis_seconds(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6
