"""The CLI on a Redis Cluster (``--redis-url redis+cluster://…``), sharded and not: enqueue, stats,
tasks, dead letters, export and purge see every shard; credentials stay masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_ha.state import TaskQueue
from tests.support.cli import SECRET, assert_one_line_error, run
from tests.support.redis_cluster import RedisClusterGroup, cluster_binaries, move_slot, owner_of


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


def test_shards_move_puts_a_shard_on_another_master_and_every_task_stays(
        cluster_url: str, redis_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing a sharded namespace onto more masters ("Growing a sharded namespace" in the README):
    with the namespace's processes stopped, `shards move` puts a shard's slot on another master;
    `shards` then shows it there, and every task is still there to claim, once. It refuses while a
    worker heartbeats or a task runs, and for an unknown master or shard, with one line each."""
    monkeypatch.setenv("CELERY_HA_SHARDS", "6")
    base = ["--redis-url", cluster_url, "--namespace", "clmove"]
    assert run([*base, "enqueue", *[f"https://example.com/m{i}" for i in range(60)]]).exit_code == 0
    before = json.loads(run([*base, "shards", "--json"]).stdout)
    assert len(before) == 6 and sum(r["records"] for r in before) == 60
    ports = [redis_cluster.nodes[owner_of(redis_cluster, r["slot"])].port for r in before]
    assert [r["node"] for r in before] == [f"127.0.0.1:{port}" for port in ports]
    shard = before[1]
    source = owner_of(redis_cluster, shard["slot"])
    target = (source + 1) % len(redis_cluster.nodes)
    to = f"127.0.0.1:{redis_cluster.nodes[target].port}"
    q = TaskQueue.from_url(cluster_url, "clmove")
    lease = q.claim_next("w")  # a task running: the move must wait for the crawl to stop
    assert_one_line_error(run([*base, "shards", "move", "1", "--to", to, "--yes"]), contains="running task")
    q.release(lease.task_id, token=lease.token, worker="w", count_stall=False, reason="test")
    assert_one_line_error(run([*base, "shards", "move", "1", "--to", "127.0.0.1:1", "--yes"]),
                          contains="not a master of this cluster")
    assert_one_line_error(run([*base, "shards", "move", "6", "--to", to, "--yes"]), contains="0..5")
    moved = run([*base, "shards", "move", "1", "--to", to, "--yes"])
    try:
        assert moved.exit_code == 0, moved.output
        assert f"to {to}" in moved.stdout and owner_of(redis_cluster, shard["slot"]) == target
        after = json.loads(run([*base, "shards", "--json"]).stdout)
        assert after[1]["node"] == to
        assert [(r["records"], r["queued"]) for r in after] == [(r["records"], r["queued"]) for r in before]
        again = run([*base, "shards", "move", "1", "--to", to, "--yes"])
        assert again.exit_code == 0 and "already" in again.stdout
        q = TaskQueue.from_url(cluster_url, "clmove")
        seen = []
        while (lease := q.claim_next("w")) is not None:
            q.commit(lease, [(lease.task_id, {"url": lease.url})])
            q.complete(lease)
            seen.append(lease.url)
        assert sorted(seen) == sorted(f"https://example.com/m{i}" for i in range(60))
        assert q.stats()["completed"] == 60
    finally:
        move_slot(redis_cluster, shard["slot"], source)  # the session's cluster as the other tests expect it


def test_shards_move_needs_a_cluster(redis_url: str) -> None:
    result = run(["--redis-url", redis_url, "shards", "move", "0", "--to", "127.0.0.1:7000", "--yes"])
    assert_one_line_error(result, contains="needs a Redis Cluster")


def test_a_sharded_namespace_grows_onto_a_master_added_to_the_cluster(tmp_path: Path) -> None:
    """The whole growth path on a cluster of its own: 3 masters, a namespace of 6 shards, a 4th master
    added without slots, two shards moved onto it with `shards move`; the 4th then holds their keys
    and the namespace's tasks all drain."""
    binaries = cluster_binaries()
    if binaries is None:
        pytest.skip("Redis Cluster tests need redis-server and redis-cli >= 7 (/usr/bin or PATH)")
    group = RedisClusterGroup(tmp_path / "grow", *binaries).start()
    try:
        base = ["--redis-url", group.url, "--namespace", "grow"]
        urls = [f"https://example.com/g{i}" for i in range(120)]
        assert run([*base, "enqueue", *urls], env={"CELERY_HA_SHARDS": "6"}).exit_code == 0
        new = group.add_master()
        to = f"127.0.0.1:{new.port}"
        before = json.loads(run([*base, "shards", "--json"]).stdout)
        for shard in (2, 5):
            moved = run([*base, "shards", "move", str(shard), "--to", to, "--yes"])
            assert moved.exit_code == 0, moved.output
        after = json.loads(run([*base, "shards", "--json"]).stdout)
        assert [r["node"] for r in after if r["node"] == to] == [to, to]
        assert {r["index"] for r in after if r["node"] == to} == {2, 5}
        assert group.node_client(3).dbsize() == after[2]["keys_in_slot"] + after[5]["keys_in_slot"] > 0
        assert [r["records"] for r in after] == [r["records"] for r in before]
        q = TaskQueue.from_url(group.url, "grow", shards=6)
        seen = []
        while (lease := q.claim_next("w")) is not None:
            q.complete(lease)
            seen.append(lease.url)
        assert sorted(seen) == sorted(urls)
    finally:
        group.stop()
