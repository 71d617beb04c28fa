"""Remembered URLs a migration carried (``state/carried.py``), after the migration, against a real
Redis: a duplicate they make is counted as any other, and the outbox's replay (``enqueue_if_absent``)
finds them and the tasks the migration renamed, so a request sent again after the move is not
crawled twice."""

from __future__ import annotations

import pytest
import redis

from celery_ha.state import TaskQueue, enqueue_ops
from celery_ha.state.migrate import Migration
from celery_ha.state.replay import enqueue_if_absent

HOSTS = ["a.example", "b.example", "c.example", "d.example", "e.example"]


def _migrated(redis_url: str) -> tuple[TaskQueue, TaskQueue, list[str], list[str], list[str]]:
    """A gated namespace of 1 shard with 20 finished URLs (out of its history: only remembered) and
    20 queued ones, migrated to 3 shards: (source, target, finished URLs, queued URLs, their ids)."""
    src = TaskQueue.from_url(redis_url, "c1", lease_ttl=30, history_max=0, host_gate=True)
    finished = [f"http://{HOSTS[i % 5]}/done/{i}" for i in range(20)]
    for _ in src.enqueue_many(finished):
        src.complete(src.claim_next("w"))
    queued = [f"http://{HOSTS[i % 5]}/todo/{i}" for i in range(20)]
    queued_ids = src.enqueue_many(queued)
    report = Migration(src.client, "c1", "c3", 3).run()
    assert report.carried == 20 and report.renamed > 0
    return src, TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3), finished, \
        queued, queued_ids


def test_a_carried_duplicate_counts_in_stats(redis_url: str, r: redis.Redis) -> None:
    _src, dst, finished, queued, _ = _migrated(redis_url)
    before = dst.stats()["duplicates"]
    status = dst.enqueue_many_with_status(finished[:7] + queued[:3])
    assert not any(new for _, new in status)
    assert dst.stats()["duplicates"] == before + 10  # 7 carried, 3 found by the script


def test_a_replay_after_the_migration_finds_carried_and_renamed_tasks(redis_url: str, r: redis.Redis) -> None:
    src, dst, finished, queued, queued_ids = _migrated(redis_url)
    finished_ids = src.task_ids(finished)  # what the outbox was handed before the move
    before = dst.stats()
    pairs = list(zip(finished_ids + queued_ids, finished + queued, strict=True))
    assert enqueue_if_absent(dst, pairs) == [False] * 40
    after = dst.stats()
    assert after["queued"] == before["queued"] == 20 and after["enqueued"] == before["enqueued"]
    assert after["duplicates"] == before["duplicates"] + 40
    # A request made after the move, and a new URL, are created as before.
    fresh = "http://a.example/fresh"
    fresh_id = dst.task_ids([fresh])[0]
    assert enqueue_if_absent(dst, [(fresh_id, fresh)]) == [True]
    assert enqueue_if_absent(dst, [(fresh_id, fresh)]) == [False]
    assert dst.get(fresh_id).url == fresh and dst.stats()["queued"] == 21


def _carried_keys(r: redis.Redis, q: TaskQueue) -> list[str]:
    return [key for k in q.shard_keys() for key in r.scan_iter(match=k.prefix + "cd:*", count=1000)]


def test_the_dedup_sweep_forgets_carried_ids_past_the_ttl_and_then_the_carry_list(
        redis_url: str, r: redis.Redis) -> None:
    _src, dst, finished, _queued, _ = _migrated(redis_url)
    assert _carried_keys(r, dst) and r.hget(dst.keys.meta, "carry")
    # A TTL that has not reached them (ids are kept by the hour): nothing goes, and the next sweep
    # reads no bucket until it may have.
    week = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl="7d")
    assert week.forget_finished() == 0
    assert all(r.hget(k.stats, "cmin") is not None for k in week.shard_keys())
    assert "cmin" not in week.stats() and r.hget(dst.keys.meta, "carry")
    assert not any(new for _, new in week.enqueue_many_with_status(finished))
    # A TTL they are past (1 ms: ids of this hour are past it, see _remembered.lua).
    short = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl=0.001)
    assert short.forget_finished() == 20
    assert _carried_keys(r, dst) == [] and r.hget(dst.keys.meta, "carry") is None
    assert not any(r.exists(k.prefix + "cdk") for k in dst.shard_keys())  # their buckets' bitmap too
    assert short.forget_finished() == 0
    fresh = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3)
    assert [new for _, new in fresh.enqueue_many_with_status(finished)] == [True] * 20


def test_no_carried_id_is_forgotten_while_a_migration_is_under_way(redis_url: str, r: redis.Redis) -> None:
    _src, dst, _finished, _queued, _ = _migrated(redis_url)
    r.hset(dst.keys.meta, "migrating_from", "c1")  # as a migration killed half-way leaves it
    short = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl=0.001)
    assert short.forget_finished() == 0
    assert len(_carried_keys(r, dst)) > 0 and r.hget(dst.keys.meta, "carry")


def test_carried_ids_without_their_bitmap_are_found_bucket_by_bucket(redis_url: str, r: redis.Redis) -> None:
    """Ids carried before the migration kept the bitmap cdk: the pass reads every bucket instead."""
    _src, dst, _finished, _queued, _ = _migrated(redis_url)
    r.delete(*[k.prefix + "cdk" for k in dst.shard_keys()])
    short = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl=0.001)
    assert short.forget_finished() == 20
    assert _carried_keys(r, dst) == [] and r.hget(dst.keys.meta, "carry") is None


def test_a_replay_maps_old_ids_after_the_sweep_dropped_the_carry_list(redis_url: str, r: redis.Redis) -> None:
    """Nothing finished before the move: no id is carried and the first sweep drops `carry`, but the
    queued dedup tasks were renamed, and a replay of their old ids must still find them."""
    src = TaskQueue.from_url(redis_url, "q1", lease_ttl=30, host_gate=True)
    urls = [f"http://{HOSTS[i % 5]}/todo/{i}" for i in range(20)]
    old_ids = src.enqueue_many(urls)
    assert Migration(src.client, "q1", "q3", 3).run().renamed > 0
    dst = TaskQueue.from_url(redis_url, "q3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl=0.001)
    dst.forget_finished()
    assert r.hget(dst.keys.meta, "carry") is None and r.hget(dst.keys.meta, "ancestors")
    assert enqueue_if_absent(dst, list(zip(old_ids, urls, strict=True))) == [False] * 20
    assert dst.stats()["queued"] == 20
    # An id no ancestor gives the URL is the caller's own: kept (created under it, as before).
    assert enqueue_if_absent(dst, [("ownid0000001", "http://a.example/own")]) == [True]
    assert dst.get("ownid0000001").url == "http://a.example/own"


def test_a_queue_reads_the_carry_list_again_after_a_while(redis_url: str, r: redis.Redis,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer that lives on after the sweep dropped `carry` stops looking carried ids up once
    CARRY_TTL has passed since its last read (here at once)."""
    _src, dst, finished, _queued, _ = _migrated(redis_url)
    producer = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3)
    assert not any(new for _, new in producer.enqueue_many_with_status(finished[:2]))
    assert producer._carries
    sweeper = TaskQueue.from_url(redis_url, "c3", lease_ttl=30, host_gate=True, shards=3, dedup_ttl=0.001)
    sweeper.forget_finished()
    assert r.hget(dst.keys.meta, "carry") is None
    monkeypatch.setattr(enqueue_ops, "CARRY_TTL", 0.0)
    assert [new for _, new in producer.enqueue_many_with_status(finished[2:4])] == [True, True]
    assert producer._carries == []


def test_a_replay_maps_old_ids_of_a_namespace_migrated_before_ancestors_were_kept(
        redis_url: str, r: redis.Redis) -> None:
    """A migration of an earlier release wrote `carry` only: the replay takes its ancestors too."""
    src = TaskQueue.from_url(redis_url, "o1", lease_ttl=30, host_gate=True)
    urls = [f"http://{HOSTS[i % 5]}/todo/{i}" for i in range(20)]
    old_ids = src.enqueue_many(urls)
    Migration(src.client, "o1", "o3", 3).run()
    dst = TaskQueue.from_url(redis_url, "o3", lease_ttl=30, host_gate=True, shards=3)
    r.hdel(dst.keys.meta, "ancestors")
    assert enqueue_if_absent(dst, list(zip(old_ids, urls, strict=True))) == [False] * 20
    assert dst.stats()["queued"] == 20


def test_a_replay_maps_ids_renamed_by_a_migration_to_the_same_count(redis_url: str, r: redis.Redis) -> None:
    """Dedup tasks queued by ungated processes while the gate was off keep their plain ids; a gated
    target of the same count renames them, and a replay of those ids finds them."""
    gated = TaskQueue.from_url(redis_url, "s2", lease_ttl=30, host_gate=True, shards=2)
    gated.enqueue_many(["http://other.example/x"])
    gated.hosts.switch(False)
    plain = TaskQueue.from_url(redis_url, "s2", lease_ttl=30, shards=2)
    urls = [f"http://{HOSTS[i % 5]}/off/{i}" for i in range(20)]
    old_ids = plain.enqueue_many(urls)
    report = Migration(gated.client, "s2", "s2b", 2).run()
    assert report.renamed > 0 and report.carried == 0
    dst = TaskQueue.from_url(redis_url, "s2b", lease_ttl=30, host_gate=True, shards=2)
    before = dst.stats()["queued"]
    assert enqueue_if_absent(dst, list(zip(old_ids, urls, strict=True))) == [False] * 20
    assert dst.stats()["queued"] == before == 21


def test_a_replay_costs_one_round_trip_per_batch(redis_url: str) -> None:
    """The lineage is read with the URL rules (once per queue, then every CARRY_TTL), not per call."""
    from celery_ha.redisio.client import redis_client
    from tests.state.test_queue import CountingConnection

    _migrated(redis_url)
    q = TaskQueue(redis_client(redis_url, connection_class=CountingConnection), "c3", lease_ttl=30,
                  host_gate=True, shards=3)
    q._scripts.prepare()  # scripts and the function library loaded beforehand
    enqueue_if_absent(q, [("first0000001", "http://a.example/first")])  # the rules' check
    enqueue_if_absent(q, [("again0000001", "http://a.example/again")])  # connections made
    CountingConnection.writes = 0
    assert enqueue_if_absent(q, [("second000001", "http://a.example/second")]) == [True]
    assert CountingConnection.writes == 2  # the carried look-up, then the script
