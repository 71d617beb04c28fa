"""``celery-ha hosts list|set|block|unblock`` and the host lines of ``stats``, on a real Redis."""

from __future__ import annotations

import json
import time

from celery_ha import TaskQueue
from tests.support.cli import assert_one_line_error, run


def cli(url: str, namespace: str, *args: str):
    return run(["--redis-url", url, "--namespace", namespace, *args])


def test_set_block_list_and_unblock_a_host(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="hc", host_gate=True)
    q.enqueue_many([f"http://a.example/{i}" for i in range(3)] + ["http://b.example:8080/x"])
    result = cli(redis_url, "hc", "hosts", "set", "A.example", "--rate", "2/1", "--concurrency", "1",
                 "--budget", "10")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "a.example: rate 2/1, max 1; budget 10/10 left"
    result = cli(redis_url, "hc", "hosts", "block", "b.example:8080", "--seconds", "600",
                 "--reason", "429 storm")
    assert result.exit_code == 0 and "blocked until" in result.stdout
    listed = json.loads(cli(redis_url, "hc", "hosts", "list", "--json").stdout)
    assert listed["enabled"] and listed["total"] == 2
    by_host = {h["host"]: h for h in listed["hosts"]}
    assert by_host["a.example"]["queued"] == 3 and by_host["a.example"]["rate"] == "2/1"
    assert by_host["a.example"]["concurrency"] == 1 and by_host["a.example"]["budget_left"] == 10
    b = by_host["b.example:8080"]
    assert b["state"] == "blocked" and b["block_reason"] == "429 storm"
    assert b["blocked_until"] > time.time() + 500
    table = cli(redis_url, "hc", "hosts", "list", "--sort", "host")
    assert table.exit_code == 0 and "a.example" in table.stdout and "429 storm" in table.stdout
    stats = json.loads(cli(redis_url, "hc", "stats", "--json").stdout)
    assert stats["hosts"] == {"blocked": 1, "not_eligible": 0, "eligible": 3}
    assert "waiting on blocked hosts 1" in cli(redis_url, "hc", "stats").stdout
    assert cli(redis_url, "hc", "hosts", "unblock", "b.example:8080").exit_code == 0
    assert q.hosts.get("b.example:8080").blocked_until is None
    assert cli(redis_url, "hc", "hosts", "set", "a.example", "--rate", "none").exit_code == 0
    assert q.hosts.get("a.example").rate is None


def test_bad_input_is_one_line_and_writes_nothing(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="hb")
    q.enqueue("http://a.example/1")  # a namespace in use (the gate is off: no host queue)
    assert_one_line_error(cli(redis_url, "hb", "hosts", "set", "a.example"), code=2)
    assert_one_line_error(cli(redis_url, "hb", "hosts", "set", "a.example", "--rate", "fast"),
                          contains="rate")
    assert_one_line_error(cli(redis_url, "hb", "hosts", "set", "a.example", "--concurrency", "x"))
    assert_one_line_error(cli(redis_url, "hb", "hosts", "set", "a b", "--delay", "1"), contains="host")
    assert_one_line_error(cli(redis_url, "hb", "hosts", "block", "a.example"), code=2)
    assert_one_line_error(cli(redis_url, "hb", "hosts", "list", "--sort", "bogus"), code=2)
    assert not q.hosts.enabled() and q.hosts.hosts() == []
    assert "no hosts in namespace hb" in cli(redis_url, "hb", "hosts", "list").stdout
    for sub in ("list", "set", "block", "unblock"):
        assert cli(redis_url, "hb", "hosts", sub, "--help").exit_code == 0


def test_hosts_mode_shows_and_sets_the_key_mode_for_every_process(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="hm")
    shown = cli(redis_url, "hm", "hosts", "mode").stdout.strip()
    assert shown == "host key mode: host (the host gate is off)"
    # set before its first enqueue (tasks keep the keys they were queued with): --force
    result = cli(redis_url, "hm", "hosts", "mode", "registered-domain", "--force")
    assert result.exit_code == 0 and "registered-domain" in result.stdout
    tids = q.enqueue_many(["http://a.example.test/1", "http://b.example.test/2"])
    assert {q.get(t).host for t in tids} == {"example.test"}
    listed = json.loads(cli(redis_url, "hm", "hosts", "list", "--json").stdout)
    assert listed["mode"] == "registered-domain" and listed["hosts"][0]["queued"] == 2
    assert_one_line_error(cli(redis_url, "hm", "hosts", "mode", "subdomain"), code=2)


def test_hosts_off_and_on_switch_the_gate(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, namespace="ho")
    # switched on before its first enqueue: --force
    assert cli(redis_url, "ho", "hosts", "on", "--force").stdout.strip() == "host gate of namespace ho: on"
    assert q.hosts.enabled() and q.get(q.enqueue("http://a.example/1")).host == "a.example"
    assert cli(redis_url, "ho", "hosts", "off").exit_code == 0
    assert not q.hosts.enabled() and q.get(q.enqueue("http://a.example/2")).host is None
