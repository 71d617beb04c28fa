"""``manage.py celery_ha …`` (the CLI under the project's settings) and the ``CELERY_HA`` settings dict.

The command line does not touch the database (``relay`` aside, tested on both databases in
test_outbox.py), so these run on SQLite only.
"""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import TaskQueue
from tests.contrib.django.conftest import PROJECT, Project

pytestmark = pytest.mark.parametrize("database", ["sqlite"], indirect=True)


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_the_cli_runs_with_the_projects_settings(project: Project, redis_url: str, r: redis.Redis) -> None:
    enqueued = project.manage("celery_ha", "enqueue", "https://shop.example/cli", "--task", "crawl_list",
                              "--no-pump", "--json")
    assert enqueued.returncode == 0, enqueued.stderr
    assert json.loads(enqueued.stdout)["namespace"] == "shop"  # CELERY_HA["NAMESPACE"], not "default"
    q = TaskQueue.from_url(redis_url, namespace="shop")
    (task_id,) = q.ready_ids()
    assert q.get(task_id).max_attempts == 4  # CELERY_HA["MAX_ATTEMPTS"] reached the CLI too

    stats = project.manage("celery_ha", "stats", "--json")
    assert stats.returncode == 0 and json.loads(stats.stdout)["queued"] == 1, stats.stderr
    shown = project.manage("celery_ha", "task", task_id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "queued"

    lease = q.claim(task_id, worker="w1")
    assert lease is not None
    q.fail(lease, "gave up", retry=False)
    dead = project.manage("celery_ha", "dead", "list", "--json")
    assert [t["error"] for t in json.loads(dead.stdout)["tasks"]] == ["gave up"]
    redriven = project.manage("celery_ha", "dead", "redrive", "--all")
    assert redriven.returncode == 0 and "redrove 1 task(s)" in redriven.stdout
    assert q.get(task_id).state == "queued"


def test_help_errors_and_call_command(project: Project) -> None:
    helped = project.manage("celery_ha", "--help")
    assert helped.returncode == 0 and "relay" in helped.stdout and "enqueue" in helped.stdout
    unknown = project.manage("celery_ha", "no-such-command")
    assert unknown.returncode == 2 and _last_line(unknown.stderr).startswith("Error: ")
    assert "Traceback" not in unknown.stderr
    bad = project.manage("celery_ha", "task", "no-such-id")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    out = project.scenario("call_cli")
    assert out["returncode"] == 1 and "status 1" in out["error"]


@pytest.mark.parametrize(("extra", "env", "expected"), [
    ({"LEASE_TTL": "soon"}, {}, ("CELERY_HA['LEASE_TTL']: CELERY_HA_LEASE_TTL='soon' is not a float",)),
    ({"LEASE_TIME": 30}, {}, ("CELERY_HA: unknown key 'LEASE_TIME'; known: ", "LEASE_TTL")),
    ({"PUSH_TIMEOUT": 0}, {}, ("CELERY_HA['PUSH_TIMEOUT']=0 must be between",)),
    ({"REDIS_URL": None}, {}, ("celery-ha has no Redis: set CELERY_HA = {'REDIS_URL'", "EMBEDDED_REDIS")),
    ({}, {"CELERY_HA_MAX_ATTEMPTS": "many"}, ("CELERY_HA_MAX_ATTEMPTS='many'", "(set in the environment")),
], ids=["bad-value", "unknown-key", "bad-django-key", "no-redis", "bad-environment"])
def test_a_bad_setting_stops_start_up_with_one_line_naming_it(project: Project, extra: dict[str, object],
                                                              env: dict[str, str],
                                                              expected: tuple[str, ...]) -> None:
    out = project.manage("check", env={"DJPROJ_EXTRA": json.dumps(extra), **env})
    assert out.returncode != 0
    line = _last_line(out.stderr)
    assert line.startswith(f"django.core.exceptions.ImproperlyConfigured: {expected[0]}"), out.stderr[-800:]
    assert all(part in line for part in expected), line


def test_the_environment_wins_and_the_embedded_redis_is_opt_in(project: Project) -> None:
    config = project.scenario("config", env={"CELERY_HA_NAMESPACE": "fromenv"})
    assert (config["namespace"], config["max_attempts"], config["push_timeout"]) == ("fromenv", 4, 0.5)
    assert config["lease_ttl"] == 45  # a top-level CELERY_HA_LEASE_TTL counts, below the dict
    embedded = project.scenario("config", env={"DJPROJ_EXTRA": json.dumps({"REDIS_URL": None,
                                                                           "EMBEDDED_REDIS": True})})
    assert embedded["embedded"] is True and embedded["redis_url"] is None
    assert not (PROJECT / ".celery-ha").exists()  # asked for, but not started: nothing used it yet
