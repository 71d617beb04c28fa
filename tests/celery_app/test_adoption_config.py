"""A team's own Celery app with ``init_app``: what celery-ha sets for the whole worker and what it sets
only on its own tasks, the warnings for settings celery-ha would otherwise ignore, and the CLI's word on
the embedded Redis. Real ``celery`` and ``python`` processes against the session's redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_ha.runtime.resolve import NO_REDIS_URL
from celery_ha.state import TaskQueue
from tests.support.adoption import CeleryProcess, clean_env, worker_args, write_app
from tests.support.cli import run
from tests.support.polling import wait_until

DURABLE = ("fetch_page", "crawl_list", "sitemap")
MAINTENANCE = tuple(f"celery_ha.maintenance.{job}"
                    for job in ("sweep", "pump", "dead_letters", "proxy_health", "fan_out"))

# The team's app: its own plain tasks are acknowledged early, pickled, requeued when a child dies.
TEAM_PY = '''
import os
import redis
from celery import Celery
import celery_ha

app = Celery("team", broker=os.environ["TEAM_BROKER"])
app.conf.update(task_acks_late=False, task_reject_on_worker_lost=True, task_retry_on_worker_lost=True,
                accept_content=["json", "pickle"], task_serializer="pickle", result_serializer="pickle",
                task_annotations=[{"fetch_page": {"rate_limit": "50/s"}}])
celery_ha.init_app(app, redis_url=os.environ["TEAM_STATE"], namespace=os.environ["TEAM_NS"])


@app.task(name="team.plain")
def plain(key, value):
    redis.Redis.from_url(os.environ["TEAM_STATE"]).set(key, repr(value))
'''

# What the team's app sets on each task and what its messages are, read in a process of its own.
INSPECT_PY = '''
import importlib, json, os
import redis
from team import app

for module in app.conf.imports:
    importlib.import_module(module)
conf, ns = app.conf, os.environ["TEAM_NS"]
tasks = {name: {"acks_late": t.acks_late, "reject_on_worker_lost": t.reject_on_worker_lost,
                "retry_on_worker_lost": t.retry_on_worker_lost, "serializer": t.serializer,
                "rate_limit": t.rate_limit, "time_limit": t.time_limit}
         for name, t in app.tasks.items() if not name.startswith("celery.")}
app.send_task("fetch_page", args=["id-1"], queue=f"{ns}.crawl")  # registered here
app.send_task("not_imported_here", args=["id-2"], queue=f"{ns}.crawl")  # a web process's pump
app.send_task("celery_ha.maintenance.sweep")
app.send_task("team.plain", args=["k", {1, 2}])
broker = redis.Redis.from_url(os.environ["TEAM_BROKER"])
sent = {}
for queue in (f"{ns}.crawl", f"{ns}.maintenance", "celery"):
    for raw in broker.lrange(queue, 0, -1):
        message = json.loads(raw)
        sent[message["headers"]["task"]] = message["content-type"]
print(json.dumps({"conf": {key: conf[key] for key in (
    "task_acks_late", "task_reject_on_worker_lost", "task_serializer", "accept_content",
    "result_accept_content", "event_serializer", "worker_prefetch_multiplier")},
    "tasks": tasks, "sent": sent}))
'''


class Team:
    """The team's project folder and the Redis databases it uses."""

    def __init__(self, root: Path, server_url: str) -> None:
        self.root = root
        self.namespace = f"team{uuid.uuid4().hex[:8]}"
        base = server_url.rsplit("/", 1)[0]
        self.state, self.broker, self.spare_broker = f"{base}/0", f"{base}/5", f"{base}/6"
        write_app(root, "team", TEAM_PY)
        write_app(root, "inspect_team", INSPECT_PY)
        self.env = {"TEAM_STATE": self.state, "TEAM_BROKER": self.broker, "TEAM_NS": self.namespace}
        self.procs: list[CeleryProcess] = []

    def start(self, app: str, *args: str, label: str = "", **env: str) -> CeleryProcess:
        proc = CeleryProcess(self.root, app, *args, label=label, **{**self.env, **env})
        self.procs.append(proc)
        return proc

    def python(self, module: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", module], cwd=self.root, capture_output=True, text=True,
                              timeout=60, env=clean_env(PYTHONPATH=str(self.root), **{**self.env, **env}))


@pytest.fixture
def team(tmp_path: Path, redis_url: str) -> Iterator[Team]:
    made = Team(tmp_path / "team", redis_url)
    yield made
    for proc in made.procs:
        proc.stop()


def test_the_teams_own_tasks_keep_their_settings_and_celery_has_tasks_carry_their_own(team: Team) -> None:
    """An app that acknowledges early, pickles and requeues a dead child's message, app-wide: the app keeps
    all of it for its own tasks (no refusal, no change); celery-ha's durable tasks are acks_late, not
    requeued nor retried when their child dies, and every celery-ha message is JSON (by the task's own
    serializer, or by celery-ha's routes where the task is not imported); prefetch is 1 for the worker."""
    out = team.python("inspect_team", TEAM_BROKER=team.spare_broker)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout)
    assert seen["conf"] == {"task_acks_late": False, "task_reject_on_worker_lost": True,
                            "task_serializer": "pickle", "accept_content": ["json", "pickle"],
                            "result_accept_content": None, "event_serializer": "json",
                            "worker_prefetch_multiplier": 1}
    tasks = seen["tasks"]
    assert tasks["team.plain"] == {"acks_late": False, "reject_on_worker_lost": True,
                                   "retry_on_worker_lost": True, "serializer": "pickle",
                                   "rate_limit": None, "time_limit": None}
    for name in DURABLE:  # the team's own annotation of fetch_page still applies
        assert tasks[name] == {"acks_late": True, "reject_on_worker_lost": False,
                               "retry_on_worker_lost": False, "serializer": "json",
                               "rate_limit": "50/s" if name == "fetch_page" else None,
                               "time_limit": 600.0}, name
    for name in MAINTENANCE:
        assert tasks[name]["acks_late"] is False and tasks[name]["serializer"] == "json", name
    assert seen["sent"] == {"fetch_page": "application/json", "not_imported_here": "application/json",
                            "celery_ha.maintenance.sweep": "application/json",
                            "team.plain": "application/x-python-serialize"}

    # The worker starts (it was refused: task_acks_late=False, accept_content with pickle), runs a
    # durable task to its end and the team's own pickled task.
    # C_FORCE_ROOT: Celery refuses a pickle-accepting worker run as root (as this test may be).
    worker = team.start("team", *worker_args(f"team-{team.namespace}@localhost", "-c", "1", pool="prefork"),
                        C_FORCE_ROOT="1")
    worker.wait_for(" ready.")
    q = TaskQueue.from_url(team.state, namespace=team.namespace)
    tid = q.enqueue("http://127.0.0.1:9/unreachable", task="crawl_list", max_attempts=1)
    client = Celery("client", broker=team.broker, set_as_current=False)
    client.conf.update(task_serializer="pickle", accept_content=["json", "pickle"])
    client.send_task("team.plain", args=["team-plain-ran", {1, 2}])
    client.close()
    state = redis.Redis.from_url(team.state, decode_responses=True)
    wait_until(lambda: q.get(tid).state == "dead", 60, 0.1, "the durable task to run (and die: no site)")
    assert wait_until(lambda: state.get("team-plain-ran"), 30, 0.1, "the team's task") == "{1, 2}"
    assert "configuration error" not in worker.text
    state.close()
    q.client.close()


def test_an_app_that_accepts_no_json_is_refused_in_one_line(team: Team) -> None:
    """The one worker-wide content setting celery-ha needs: JSON among the accepted types."""
    write_app(team.root, "nojson", '''
        import os
        from celery import Celery
        import celery_ha
        app = Celery("nojson", broker=os.environ["TEAM_BROKER"])
        app.conf.update(accept_content=["pickle"], task_serializer="pickle", task_acks_late=False)
        celery_ha.init_app(app, redis_url=os.environ["TEAM_STATE"], namespace=os.environ["TEAM_NS"])
    ''')
    worker = team.start("nojson", *worker_args("nojson@localhost"))
    assert worker.exit_code() == 2, worker.text
    assert worker.lines == ["celery-ha: configuration error: this Celery app's settings break celery-ha's "
                            "guarantees: accept_content=['pickle'] (celery-ha needs 'json' among them: "
                            "celery-ha's messages are JSON) — remove them or set the values celery-ha needs"]


def test_mistyped_celery_ha_variables_are_named_once_with_the_closest_knob(team: Team) -> None:
    """``CELERY_HA_LEASE_TLL`` and ``CELERY_HA_NAMSPACE`` are no knobs: a prefork worker (two pool
    processes) says so once each, naming the knob meant; the test suite's own CELERY_HA_TEST_* is not
    named, nor is any knob that exists."""
    node = f"typo-{team.namespace}@localhost"
    worker = team.start("celery_ha", *worker_args(node, "-c", "2", pool="prefork"),
                        CELERY_HA_REDIS_URL=team.state, CELERY_BROKER_URL=team.broker,
                        CELERY_HA_NAMESPACE=team.namespace, CELERY_HA_LEASE_TLL="5",
                        CELERY_HA_NAMSPACE="shop", CELERY_HA_TEST_ANYTHING="1",
                        CELERY_HA_HEARTBEAT_INTERVAL="1")
    worker.wait_for(" ready.")
    named = [line for line in worker.lines if "CELERY_HA_" in line and "environment variable" in line]
    assert named == [
        "celery-ha: unknown environment variable CELERY_HA_LEASE_TLL (celery-ha ignores it); "
        "did you mean CELERY_HA_LEASE_TTL?",
        "celery-ha: unknown environment variable CELERY_HA_NAMSPACE (celery-ha ignores it); "
        "did you mean CELERY_HA_NAMESPACE?"], worker.text


def test_celery_ha_keys_in_the_apps_own_configuration_are_named(team: Team) -> None:
    """Settings put in app.conf, Celery-style, are not celery-ha's: the worker says which and how to pass
    them, then, with no state Redis left, stops with one line (rc 2) instead of starting."""
    write_app(team.root, "confkey", '''
        import os
        from celery import Celery
        import celery_ha
        app = Celery("confkey")
        app.conf.update(broker_url=os.environ["TEAM_BROKER"], CELERY_HA_REDIS_URL=os.environ["TEAM_STATE"],
                        CELERY_HA_NAMESPACE="shop")
        celery_ha.init_app(app)
    ''')
    worker = team.start("confkey", *worker_args("confkey@localhost"))
    assert worker.exit_code() == 2, worker.text
    assert worker.lines[0] == (
        "celery-ha: this Celery app's configuration holds CELERY_HA_NAMESPACE, CELERY_HA_REDIS_URL, which "
        "celery-ha does not read there (ignored): pass them as init_app(app, namespace=..., redis_url=...), "
        "or set them in the environment")
    assert worker.lines[1:] == [f"celery-ha: configuration error: {NO_REDIS_URL}"]


def test_a_second_configuration_names_only_what_differs(team: Team) -> None:
    """Two init_app calls with other settings in one process: the error names the fields that differ,
    masked, not the whole settings."""
    write_app(team.root, "twice", '''
        from celery import Celery
        import celery_ha
        first, second = "redis://:Secret-One-123@127.0.0.1:1/0", "redis://:Secret-Two-456@127.0.0.1:1/0"
        celery_ha.init_app(Celery("a"), redis_url=first, namespace="shop")
        try:
            celery_ha.init_app(Celery("b"), redis_url=second, namespace="news")
        except Exception as exc:
            print(exc)
    ''')
    out = team.python("twice")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "celery-ha is already attached with other settings in this process (redis_url "
        "'redis://***@127.0.0.1:1/0' (other credentials), namespace 'shop' -> 'news'); one celery-ha "
        "configuration per process")


def test_the_cli_help_says_which_commands_start_the_embedded_redis() -> None:
    text = " ".join(run(["--help"]).stdout.split())
    assert "every command shares one local Redis started on demand" not in text
    assert ("`demo`, `up` and `redis start` start it on demand; every other command uses it when it runs, "
            "else stops with one line") in text


def test_which_celery_ha_variables_are_named() -> None:
    """Every knob of the settings table is known; the test suite's CELERY_HA_TEST_* family is not named;
    a Scrapy knob in the environment is named for what it is (celery-ha reads it from Scrapy's settings);
    a name close to none gets no guess."""
    from celery_ha.base.settings import _ENV, unknown_variables

    knobs = {var: "1" for var, _ in _ENV.values()}
    assert unknown_variables({**knobs, "CELERY_HA_TEST_REDIS_URL": "x", "PATH": "/bin"}) == []
    assert unknown_variables({"CELERY_HA_SCRAPY_ENABLED": "0", "CELERY_HA_ZZZ": "1"}) == [
        "environment variable CELERY_HA_SCRAPY_ENABLED is a Scrapy setting, read from the Scrapy project's "
        "settings (settings.py, custom_settings, scrapy crawl -s NAME=VALUE), not from the environment: "
        "celery-ha ignores it",
        "unknown environment variable CELERY_HA_ZZZ (celery-ha ignores it)"]
