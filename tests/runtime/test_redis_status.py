"""``celery-ha redis status`` under a Redis user that may not run INFO (ACL): what it can, exit 0."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.cli import run


@pytest.fixture
def acl_user(r: redis.Redis) -> Iterator[tuple[str, str, str]]:
    """Make ``(name, password, url_prefix)`` a user on the session server; deletes it afterwards."""
    name, password = f"limited-{uuid.uuid4().hex[:6]}", f"pw-{uuid.uuid4().hex}"
    yield name, password, f"redis://{name}:{password}@"
    r.acl_deluser(name)


def _as(redis_url: str, user: tuple[str, str, str]) -> str:
    return redis_url.replace("redis://", user[2])


@pytest.mark.parametrize("as_json", [False, True])
def test_status_without_info_shows_keys_and_one_line_per_problem(
        r: redis.Redis, redis_url: str, acl_user: tuple[str, str, str], as_json: bool) -> None:
    name, password, _ = acl_user
    r.acl_setuser(name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+ping", "+dbsize"])
    r.set("a", 1)
    r.set("b", 2)
    flags = ["--json"] if as_json else []
    result = run(["--redis-url", _as(redis_url, acl_user), "redis", "status", *flags])
    assert result.exit_code == 0, result.output
    assert password not in result.output
    if as_json:
        data = json.loads(result.stdout)
        assert data["running"] is True and data["reachable"] is True and data["keys"] == 2
        assert "version" not in data and data["maxmemory_policy"].startswith("unknown")
        assert len(data["problems"]) == 1 and "INFO" in data["problems"][0]
    else:
        notes = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(notes) == 1 and notes[0].startswith("Note: cannot read INFO") and "permission" in notes[0]
        assert "keys" in result.stdout and "2" in result.stdout and "reachable" in result.stdout


def test_status_with_nearly_no_permissions_still_says_reachable(
        r: redis.Redis, redis_url: str, acl_user: tuple[str, str, str]) -> None:
    name, password, _ = acl_user
    r.acl_setuser(name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+get"])
    result = run(["--redis-url", _as(redis_url, acl_user), "redis", "status", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["reachable"] is True and "keys" not in data
    assert [p.split(" (")[0] for p in data["problems"]] == ["cannot read INFO", "cannot read DBSIZE"]
    assert password not in result.output


def test_status_with_full_rights_has_no_problems(redis_url: str) -> None:
    data = json.loads(run(["--redis-url", redis_url, "redis", "status", "--json"]).stdout)
    assert "problems" not in data and data["version"] and data["keys"] == 0


def test_status_says_when_task_records_do_not_fit_their_compact_buckets(r: redis.Redis,
                                                                         redis_url: str) -> None:
    data = json.loads(run(["--redis-url", redis_url, "redis", "status", "--json"]).stdout)
    assert data["hash_max_listpack_value"] == 64 and "set it to 256" in data["memory_note"]
    r.config_set("hash-max-ziplist-value", 256)  # the session's own server, put back below
    try:
        data = json.loads(run(["--redis-url", redis_url, "redis", "status", "--json"]).stdout)
        assert data["hash_max_listpack_value"] == 256 and "memory_note" not in data
    finally:
        r.config_set("hash-max-ziplist-value", 64)
