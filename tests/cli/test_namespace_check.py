"""A mistyped namespace (``-n shpo`` for ``shop``): writing verbs refuse it with one line naming it and
the known ones, and write nothing; reading verbs warn on stderr and still answer. A namespace written
before the registry existed (keys, no registry entry) is accepted; ``--force`` writes anyway."""

from __future__ import annotations

import json

import pytest
import redis

from celery_ha import TaskQueue
from celery_ha.state.namespaces import REGISTRY_KEY
from tests.support.cli import assert_one_line_error, run

WRITES = [
    ["pause"],
    ["pause", "--reason", "maintenance"],
    ["resume"],
    ["purge", "--yes"],
    ["cancel", "abcdefabcdef"],
    ["recrawl", "--all", "--no-pump"],
    ["recrawl", "abcdefabcdef", "--no-pump"],
    ["recrawl", "--due", "--no-pump"],
    ["dead", "redrive", "--all"],
    ["dead", "redrive", "abcdefabcdef"],
    ["hosts", "set", "x.example", "--rate", "2/1"],
    ["hosts", "block", "x.example", "--seconds", "60"],
    ["hosts", "unblock", "x.example"],
    ["hosts", "mode", "registered-domain"],
    ["hosts", "on"],
    ["hosts", "off"],
    ["schedules", "set", "--task", "fetch_page", "--every", "1d"],
    ["schedules", "unset", "--task", "fetch_page"],
    ["migrate", "shop2", "--shards", "2", "--yes"],
]

READS = [
    ["stats"],
    ["stats", "--json"],
    ["tasks", "--state", "dead"],
    ["dead", "list"],
    ["export"],
    ["hosts", "list"],
    ["hosts", "mode"],
    ["schedules", "list"],
    ["workers"],
    ["proxies", "list"],
    ["recrawl", "--all", "--dry-run"],
]


def cli(url: str, namespace: str, *args: str):
    return run(["--redis-url", url, "--namespace", namespace, *args])


@pytest.fixture
def shop(redis_url: str) -> TaskQueue:
    """The real namespace, registered by its first enqueue, as a user's would be."""
    q = TaskQueue.from_url(redis_url, namespace="shop")
    q.enqueue("https://shop.example/1")
    return q


@pytest.mark.parametrize("args", WRITES, ids=lambda a: " ".join(a))
def test_a_writing_verb_refuses_an_unregistered_namespace(redis_url: str, r: redis.Redis, shop: TaskQueue,
                                                          args: list[str]) -> None:
    before = set(r.keys("*"))
    line = assert_one_line_error(cli(redis_url, "shpo", *args), code=1, contains="namespace 'shpo'")
    assert "not registered" in line and "did you mean 'shop'?" in line and "registered: shop" in line
    assert "--force" in line
    assert set(r.keys("*")) == before  # nothing created (no cha:{shpo}:meta), nothing deleted
    assert json.loads(cli(redis_url, "shop", "stats", "--json").stdout)["paused"] is None


@pytest.mark.parametrize("args", READS, ids=lambda a: " ".join(a))
def test_a_reading_verb_warns_and_still_answers(redis_url: str, r: redis.Redis, shop: TaskQueue,
                                                args: list[str]) -> None:
    before = set(r.keys("*"))
    result = cli(redis_url, "shpo", *args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warnings == ["Warning: namespace 'shpo' is not registered and holds nothing (did you mean "
                        "'shop'? registered: shop)"], result.stderr
    assert "Error" not in result.stderr
    assert set(r.keys("*")) == before
    assert "Warning" not in cli(redis_url, "shop", *args).stderr  # the real one: no warning


def test_the_refusal_lists_the_registered_namespaces_when_nothing_is_close(redis_url: str) -> None:
    for name in ("alpha", "beta"):
        TaskQueue.from_url(redis_url, namespace=name).enqueue("https://a.example/")
    line = assert_one_line_error(cli(redis_url, "zzz", "pause"), code=1)
    assert "did you mean" not in line and "registered: alpha, beta" in line
    assert "registered: alpha, beta" in assert_one_line_error(cli(redis_url, "zzz", "hosts", "off"), code=1)


def test_no_registered_namespace_says_how_to_find_older_ones(redis_url: str) -> None:
    line = assert_one_line_error(cli(redis_url, "zzz", "pause"), code=1)
    assert "no namespace is registered" in line and "namespaces --scan" in line


def test_a_namespace_from_before_the_registry_is_accepted(redis_url: str, r: redis.Redis,
                                                          shop: TaskQueue) -> None:
    """Written by a release before the registry (its keys, no entry): still an existing namespace."""
    r.srem(REGISTRY_KEY, "shop")
    result = cli(redis_url, "shop", "pause")
    assert result.exit_code == 0 and "namespace shop paused" in result.stdout, result.output
    stats = cli(redis_url, "shop", "stats", "--json")
    assert "Warning" not in stats.stderr and json.loads(stats.stdout)["queued"] == 1
    assert cli(redis_url, "shop", "resume").exit_code == 0


def test_force_writes_to_an_unregistered_namespace(redis_url: str, r: redis.Redis) -> None:
    """Host limits set up before the first enqueue: --force, after which the namespace is known."""
    result = cli(redis_url, "fresh", "hosts", "set", "x.example", "--rate", "2/1", "--force")
    assert result.exit_code == 0 and result.stdout.strip() == "x.example: rate 2/1; budget -", result.output
    listed = cli(redis_url, "fresh", "hosts", "list", "--json")
    assert listed.stderr == "" and json.loads(listed.stdout)["hosts"][0]["rate"] == "2/1"
    assert cli(redis_url, "fresh", "pause").exit_code == 0  # its settings make it known now


def test_enqueue_still_creates_a_namespace(redis_url: str) -> None:
    result = cli(redis_url, "brandnew", "enqueue", "--no-pump", "https://a.example/1")
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert cli(redis_url, "brandnew", "pause").exit_code == 0
