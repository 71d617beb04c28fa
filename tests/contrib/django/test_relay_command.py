"""``manage.py celery_ha relay``: what stops it and what it marks, on both databases.

Bad data (``InvalidInput``) marks its own row and the others are pushed; a refusal that is the
process's, not a row's (a ``ConfigurationError``: ``CELERY_HA['SHARDS']`` differs from the layout the
namespace was written with), stops the run with exit 1 and leaves every row as it was, to be pushed
once the configuration is fixed. An unknown ``--database`` alias is a usage error (exit 2)."""

from __future__ import annotations

import json
import subprocess

import redis

from celery_ha.state import TaskQueue
from tests.contrib.django.conftest import Project

LEFTOVER = {"url": "https://shop.example/left", "task": "fetch_page", "priority": 0, "dedup": False}


def _errors(out: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr's lines without the relay's own log line."""
    assert "Traceback" not in out.stderr, out.stderr
    return [line for line in out.stderr.splitlines()
            if line.strip() and not line.startswith("celery-ha outbox")]


def test_a_configuration_error_stops_the_relay_and_leaves_every_row(project: Project, redis_url: str,
                                                                    r: redis.Redis) -> None:
    TaskQueue.from_url(redis_url, namespace="shop").enqueue("https://shop.example/old")  # 1 shard, in use
    ids = [f"LeftOverCfg{n}" for n in range(3)]
    for n, task_id in enumerate(ids):
        project.db.insert_outbox(task_id, {**LEFTOVER, "url": f"https://shop.example/left/{n}"})
    out = project.manage("celery_ha", "relay", env={"DJPROJ_EXTRA": json.dumps({"SHARDS": 3})})
    assert out.returncode == 1, out
    lines = _errors(out)
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: the relay stopped; the requests not pushed stay in the outbox: "
                               "namespace 'shop' holds tasks in 1 shard(s)"), lines
    assert project.db.query("SELECT attempts, last_error FROM celery_ha_outbox") == [(0, "")] * 3  # untouched
    assert r.hget("cha:{shop}:stats", "enqueued") == "1"
    fixed = project.manage("celery_ha", "relay", "--json")  # the configuration fixed: all of them go
    assert fixed.returncode == 0, fixed.stderr
    report = json.loads(fixed.stdout)
    assert (report["pushed"], report["created"], report["invalid"], report["left"]) == (3, 3, 0, 0)


def test_bad_data_marks_its_row_and_the_others_are_pushed(project: Project) -> None:
    project.db.insert_outbox("BadDataRow01", {**LEFTOVER, "url": "ftp://shop.example/left"})
    project.db.insert_outbox("GoodDataRow1", LEFTOVER)
    out = project.manage("celery_ha", "relay", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["pushed"], report["invalid"], report["left"]) == (1, 1, 1)
    ((task_id, attempts, error),) = project.db.query("SELECT task_id, attempts, last_error "
                                                     "FROM celery_ha_outbox")
    assert (task_id, attempts) == ("BadDataRow01", 1) and error.startswith("InvalidInput"), error


def test_an_unknown_database_alias_is_a_usage_error(project: Project) -> None:
    project.db.insert_outbox("LeftOverDb01", LEFTOVER)
    out = project.manage("celery_ha", "relay", "--database", "nope")
    assert out.returncode == 2, out
    lines = _errors(out)
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: Invalid value for '--database': no database 'nope' in "
                               "settings.DATABASES (known: default)"), lines
    assert project.db.count("celery_ha_outbox") == 1
