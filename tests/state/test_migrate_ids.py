"""The ids tasks take when a namespace moves to another shard count (``Migration.candidates``), in
the corner cases of the host gate: one URL queued under two host keys, an id whose holder is renamed
away, a task queued while the gate was off. Every task arrives once, on the shard it must sit on, and
the target's enqueue of its URL finds it (dedup stays exact)."""

from __future__ import annotations

import itertools

import redis

from celery_ha.state import TaskQueue
from celery_ha.state.enqueue_args import on_host_shard
from celery_ha.state.ids import task_id_for
from celery_ha.state.migrate import Migration
from celery_ha.state.shards import shard_of
from tests.support.invariants import check_invariants

T = "fetch_page"
KEYS = [f"k{j}" for j in range(40)]


def test_one_url_under_two_host_keys_stays_two_tasks_on_one_shard(redis_url: str, r: redis.Redis) -> None:
    """Both tasks' best id in a 1-shard target is the URL's plain digest: the second takes its next."""
    url = "http://u1.example/p"
    plain = task_id_for(T, url)
    x, y = next((x, y) for x, y in itertools.permutations(KEYS, 2)
                if len({shard_of(x, 3), shard_of(y, 3), shard_of(plain, 3)}) == 3)
    src = TaskQueue.from_url(redis_url, "two", shards=3, host_gate=True, default_task=T)
    ids = src.enqueue_many([{"url": url, "host": x}, {"url": url, "host": y}])
    assert len(set(ids)) == 2 and plain not in ids
    report = Migration(src.client, "two", "two1", 1).run()
    assert report.tasks == {"queued": 2} and report.present == 0 and report.renamed == 2
    dst = TaskQueue.from_url(redis_url, "two1", host_gate=True, default_task=T)
    assert {lease.task.host for lease in iter(lambda: dst.claim_next("w"), None)} == {x, y}
    check_invariants(r, dst)


def test_an_id_whose_holder_is_renamed_away_goes_to_the_task_the_target_gives_it(
        redis_url: str, r: redis.Redis) -> None:
    """A (host x) holds the plain id on 2 shards and must leave it on 3; B (host y) is where the plain
    id lands on 3 shards, so the target's enqueue of (url, y) computes it: B must get it."""
    for i in range(10_000):
        url = f"http://v{i}.example/p"
        plain = task_id_for(T, url)
        found = [(x, y) for x, y in itertools.permutations(KEYS, 2)
                 if shard_of(plain, 2) == shard_of(x, 2) != shard_of(y, 2)
                 and shard_of(plain, 3) != shard_of(x, 3) and shard_of(plain, 3) == shard_of(y, 3)]
        if found:
            x, y = found[0]
            break
    src = TaskQueue.from_url(redis_url, "ra", shards=2, host_gate=True, default_task=T)
    a, b = src.enqueue_many([{"url": url, "host": x}, {"url": url, "host": y}])
    assert a == plain != b
    Migration(src.client, "ra", "ra3", 3).run()
    dst = TaskQueue.from_url(redis_url, "ra3", shards=3, host_gate=True, default_task=T)
    assert dst.enqueue_many_with_status([{"url": url, "host": y}, {"url": url, "host": x}]) == [
        (plain, False), (on_host_shard(plain, x, True, T, url, 3), False)]
    assert dst.stats()["queued"] == 2
    check_invariants(r, dst)


def test_a_task_queued_while_the_gate_was_off_is_found_when_it_is_on_again(
        redis_url: str, r: redis.Redis) -> None:
    """Gate on, off (the process still places the id; the record has no host key), then a target
    whose processes run gated: the task takes the id their enqueue gives its URL."""
    for i in range(10_000):
        url, host = f"http://z{i}.example/p", f"z{i}.example"
        plain = task_id_for(T, url)
        if len({plain, *(on_host_shard(plain, host, True, T, url, n) for n in (2, 3))}) == 3:
            break
    src = TaskQueue.from_url(redis_url, "oo", shards=2, host_gate=True, default_task=T)
    src.enqueue_many(["http://other.example/x"])
    src.hosts.switch(False)
    assert src.enqueue_many([url]) == [on_host_shard(plain, host, True, T, url, 2)]
    Migration(src.client, "oo", "oo3", 3).run()
    dst = TaskQueue.from_url(redis_url, "oo3", shards=3, host_gate=True, default_task=T)
    (tid, new), = dst.enqueue_many_with_status([url])
    assert tid == on_host_shard(plain, host, True, T, url, 3) and new is False
    assert dst.stats()["queued"] == 2
