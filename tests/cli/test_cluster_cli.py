"""The CLI on a Redis Cluster (``--redis-url redis+cluster://…``), sharded and not: enqueue, stats,
tasks, dead letters, export and purge see every shard; credentials stay masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_ha.state import TaskQueue
from tests.support.cli import SECRET, assert_one_line_error, run


@pytest.mark.parametrize("shards", ["1", "3"])
def test_the_cli_works_on_a_cluster(cluster_url: str, tmp_path: Path, shards: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_HA_SHARDS", shards)
    base = ["--redis-url", cluster_url, "--namespace", "clcli"]
    urls = [f"https://example.com/{i}" for i in range(30)]
    assert run([*base, "enqueue", *urls]).exit_code == 0
    q = TaskQueue.from_url(cluster_url, "clcli", backoff_base=0, backoff_cap=0)
    for _ in range(3):
        lease = q.claim_next("w")
        assert lease is not None
        q.commit(lease, [(lease.task_id, {"url": lease.url})])
        q.fail(lease, "gone", retry=False)
    stats = json.loads(run([*base, "stats", "--json"]).stdout)
    assert (stats["queued"], stats["dead"]) == (27, 3)
    listed = run([*base, "tasks", "--state", "queued", "--json", "--limit", "100"])
    assert listed.exit_code == 0, listed.output
    assert len(json.loads(listed.stdout)["tasks"]) == 27
    assert run([*base, "dead", "redrive", "--all"]).exit_code == 0
    assert q.stats()["queued"] == 30
    out = tmp_path / "items.jsonl"
    assert run([*base, "export", "--output", str(out)]).exit_code == 0
    assert len(out.read_text().splitlines()) == 3
    assert run([*base, "purge", "--yes"]).exit_code == 0
    assert TaskQueue.from_url(cluster_url, "clcli").stats()["queued"] == 0


def test_an_unreachable_cluster_is_one_masked_line() -> None:
    result = run(["--redis-url", f"redis+cluster://app:{SECRET}@127.0.0.1:1", "stats"])
    assert_one_line_error(result)


def test_redis_status_shows_every_node_of_the_cluster(cluster_url: str, redis_cluster,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_HA_SHARDS", "3")
    base = ["--redis-url", cluster_url, "--namespace", "clstat"]
    assert run([*base, "enqueue", *[f"https://example.com/s{i}" for i in range(30)]]).exit_code == 0
    result = run([*base, "redis", "status", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["mode"], data["cluster_state"], data["masters"]) == ("cluster", "ok", 3)
    # Each node read on its own: their key counts are the nodes' own, and add up to the cluster's.
    assert sorted(n["keys"] for n in data["nodes"]) == sorted(redis_cluster.keys_per_node())
    assert len({n["node"] for n in data["nodes"]}) == 3 and SECRET not in result.output
    table = run([*base, "redis", "status"])
    assert table.exit_code == 0 and table.stdout.count("primary, ") == 3, table.output
