"""Sharded namespaces (``CELERY_HA_SHARDS``): balance, routing by id, every multi-shard read and move,
the refusal of a shard-count change, and the spread over the masters of a real cluster."""

from __future__ import annotations

import statistics

import pytest
import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.proxy import ProxyPool
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.listing import list_tasks
from celery_ha.state.namespaces import REGISTRY_KEY
from celery_ha.state.purge import purge_namespace
from celery_ha.state.replay import enqueue_if_absent
from celery_ha.state.sharded import dispatch_shards
from celery_ha.state.shards import shard_of, shard_tags
from celery_ha.state.sink import count_items, iter_items
from celery_ha.state.worker_registry import heartbeat, running_by_worker
from tests.support.polling import wait_until
from tests.support.records import has_record, record_count
from tests.support.redis_cluster import RedisClusterGroup

URLS = [f"https://example.com/page/{i}" for i in range(30_000)]


def _per_shard(r: redis.Redis, q: TaskQueue) -> list[int]:
    return [record_count(r, k) for k in q.shard_keys()]


def test_one_shard_is_exactly_the_unsharded_layout(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "one", shards=1)
    q.enqueue_many(URLS[:10])
    assert shard_tags("one", 1) == ("one",)
    assert q.keys.prefix == "cha:{one}:"
    assert all(key.startswith("cha:{one}:") for key in r.keys("*") if key != REGISTRY_KEY)
    assert r.hget(q.keys.meta, "shards") is None


def test_shard_tags_are_spread_around_the_slot_ring() -> None:
    from redis.crc import key_slot

    tags = shard_tags("crawl", 4)
    assert tags[0] == "crawl" and all(t.startswith("crawl~") for t in tags[1:])
    base = key_slot(b"crawl")
    for i, tag in enumerate(tags):
        assert 0 <= (key_slot(tag.encode()) - base - i * 4096) % 16384 < 64


def test_three_shards_share_30000_tasks_within_ten_percent(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "bal", shards=3)
    ids = q.enqueue_many(URLS)
    counts = _per_shard(r, q)
    mean = statistics.mean(counts)
    assert sum(counts) == 30_000 and all(abs(c - mean) <= 0.1 * mean for c in counts), counts
    assert q.stats()["queued"] == 30_000
    assert all(has_record(r, q.shard_keys()[shard_of(t, 3)], t) for t in ids[:100])  # routed by id


def test_enqueue_many_is_one_round_trip_per_shard(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "rt", shards=3)
    q.stats()  # the one-time layout check
    calls: list[int] = []
    original = q._run

    def counting(script: str, *args: object, **kw: object) -> object:
        calls.append(int(kw.get("shard", 0)))  # type: ignore[arg-type]
        return original(script, *args, **kw)  # type: ignore[arg-type]

    q._run = counting  # type: ignore[method-assign]
    q.enqueue_many(URLS[:900], batch_size=1000)
    assert sorted(calls) == [0, 1, 2]


def test_the_whole_lifecycle_across_shards(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "life", shards=3, backoff_base=0, backoff_cap=0)
    ids = q.enqueue_many([{"url": u, "priority": i % 3} for i, u in enumerate(URLS[:30])])
    assert q.enqueue(URLS[0]) == ids[0] and q.stats()["duplicates"] == 1  # dedup holds: same shard
    sent = q.dispatch(12)
    assert len(sent) == 12 and {shard_of(d.task_id, 3) for d in sent} == {0, 1, 2}
    assert sorted(_count_by_shard(d.task_id for d in sent)) == [4, 4, 4]  # the window shared fairly
    assert q.dispatch(12) == []  # full
    lease = q.claim(sent[0].task_id, "w1")
    assert lease is not None
    q.save_checkpoint(lease, {"page": 2})
    assert q.checkpoint(lease.task_id) == {"page": 2}
    assert q.commit(lease, [("k-1", {"v": 1})]) == 1
    q.complete(lease)
    held = [q.claim_next("w2") for _ in range(18)]  # the rest of the queue, from every shard
    assert all(h is not None for h in held) and q.claim_next("w2") is None
    assert running_by_worker(r, "life")["w2"] and len(running_by_worker(r, "life")["w2"]) == 18
    for h in held[:6]:
        assert h is not None and q.fail(h, "boom", retry=False) == "dead"
    dead = q.dead(limit=10)
    assert [d.id for d in dead] == [h.task_id for h in held[:6] if h is not None]  # death order, all shards
    assert len(q.dead(limit=2, offset=4)) == 2
    assert q.redrive() == 6 and q.stats()["dead"] == 0
    for h in held[6:9]:
        assert h is not None and q.release(h.task_id, worker="w2") == "queued"
    assert q.cancel(ids[-1]) in ("queued", "dispatched", "running")
    stats = q.stats()
    assert stats["completed"] == 1 and stats["items"] == 1 and stats["dead"] == 1
    assert len(list_tasks(q, "running", limit=100)) == stats["running"]
    assert len(list_tasks(q, "queued", limit=100)) == stats["queued"] == len(q.ready_ids())
    assert [t.id for t in list_tasks(q, "queued", limit=3, offset=2)] == q.ready_ids()[2:5]
    assert count_items(r, "life") == 1 and list(iter_items(r, "life")) == [{"v": 1}]
    assert q.get_many([ids[0], "nope", ids[1]])[1] is None
    heartbeat(r, "life", "node:1")
    ProxyPool(r, "life").add("http://127.0.0.2:8001")
    assert {"cha:{life}:workers", "cha:{life}:meta", "cha:{life}:px:av"} <= set(r.keys("cha:{life}:*"))
    assert all(key.split(":")[2] not in ("workers", "meta", "px") for key in r.keys("cha:{life~*"))


def test_reclaim_covers_every_shard(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "recl", shards=3)
    q.enqueue_many(URLS[:9])
    leases = [q.claim_next("w", ttl=0.001) for _ in range(9)]
    assert {shard_of(lease.task_id, 3) for lease in leases if lease} == {0, 1, 2}
    last = max(lease.expires_at for lease in leases if lease) * 1000
    wait_until(lambda: redis_now_ms(r) > last, timeout=5, what="the Redis clock past every lease")
    assert q.reclaim_expired() == 9 and q.stats()["queued"] == 9


def test_a_resend_never_sends_one_id_twice_in_a_call(redis_url: str, r: redis.Redis) -> None:
    """A re-send with redispatch_after 0 (what resend_dispatched asks when a worker died) lets the
    second pass of a sharded dispatch, the room a short shard left, take again the stale tasks the
    first pass re-stamped a moment before: the call still sends each id once."""
    q = TaskQueue.from_url(redis_url, "twice", shards=2)
    first = [u for u, tid in zip(URLS[:200], q.task_ids(URLS[:200]), strict=True) if shard_of(tid, 2) == 0]
    q.enqueue_many(first[:4])
    assert len(q.dispatch(4)) == 4  # shard 0: 4 dispatched, none claimed (stale from now on)
    q.enqueue_many(first[4:14])  # shard 0 fills its share; shard 1 has nothing and leaves its room

    def run(shard: int, room: int) -> object:
        reply = q._run("dispatch", room, 0, 1000, shard=shard)
        stamp = redis_now_ms(r)  # the next call comes a clock tick later: what it re-stamped is stale
        wait_until(lambda: redis_now_ms(r) > stamp + 1, timeout=5, what="the Redis clock to move")
        return reply

    sent = dispatch_shards(r, q.shard_keys(), run, window=8, start=0)
    ids = [d.task_id for d in sent]
    assert sorted(d.resent for d in sent) == [False] * 4 + [True] * 4
    assert len(ids) == len(set(ids)) == 8, ids


def test_complete_and_claim_moves_on_to_another_shard(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url, "cc", shards=3)
    q.enqueue_many(URLS[:6])
    lease = q.claim_next("w")
    done = 0
    while lease is not None:
        lease = q.complete_and_claim(lease)
        done += 1
    assert done == 6 and q.stats()["completed"] == 6


def test_a_shard_count_change_is_refused_while_the_namespace_holds_tasks(redis_url: str,
                                                                         r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "chg", shards=3)
    q.enqueue_many(URLS[:10])
    for count in (1, 4):
        other = TaskQueue.from_url(redis_url, "chg", shards=count)
        with pytest.raises(ConfigurationError, match="holds tasks in 3 shard"):
            other.stats()
    with pytest.raises(ConfigurationError):
        TaskQueue.for_settings(redis_client(redis_url), Settings(namespace="chg")).enqueue(URLS[50])
    assert q.stats()["queued"] == 10  # nothing was written by the refused clients
    assert purge_namespace(r, "chg") > 0 and r.keys("*") == []  # every shard purged, meta last
    TaskQueue.from_url(redis_url, "chg", shards=4).enqueue(URLS[0])  # empty: the new count is taken
    assert r.hget(QueueKeys("chg").meta, "shards") == "4"


def test_the_shards_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_HA_SHARDS", "3")
    assert Settings.from_env().shards == 3
    monkeypatch.setenv("CELERY_HA_SHARDS", "0")
    with pytest.raises(ConfigurationError, match="CELERY_HA_SHARDS"):
        Settings.from_env()


def test_three_shards_on_the_cluster_put_a_share_on_every_master(cluster_url: str,
                                                                 redis_cluster: RedisClusterGroup) -> None:
    q = TaskQueue.from_url(cluster_url, "spread", shards=3)
    q.enqueue_many(URLS)
    per_node = [int(redis_cluster.node_client(n).dbsize()) for n in range(len(redis_cluster.nodes))]
    assert all(n > 0 for n in per_node), per_node
    c, ports = redis_cluster.client(), [node.port for node in redis_cluster.nodes]
    tasks = [0] * len(ports)
    for k in q.shard_keys():
        owner = c.nodes_manager.get_node_from_slot(c.keyslot(k.tasks))
        tasks[ports.index(owner.port)] += record_count(c, k)
    mean = statistics.mean(tasks)
    assert all(abs(t - mean) <= 0.1 * mean for t in tasks), tasks
    lease = q.claim_next("w")
    assert lease is not None and q.stats()["running"] == 1


def _count_by_shard(ids: object) -> list[int]:
    counts = [0, 0, 0]
    for task_id in ids:  # type: ignore[attr-defined]
        counts[shard_of(task_id, 3)] += 1
    return counts


def test_a_replayed_enqueue_lands_in_the_shard_of_its_id(redis_url: str, r: redis.Redis) -> None:
    q = TaskQueue.from_url(redis_url, "replay", shards=3)
    fixed = [(f"fixed{i:07d}", URLS[i]) for i in range(12)]
    assert enqueue_if_absent(q, fixed) == [True] * 12
    assert enqueue_if_absent(q, fixed) == [False] * 12  # a second send queues nothing
    for task_id, _ in fixed:
        assert has_record(r, q.shard_keys()[shard_of(task_id, 3)], task_id)
    lease = q.claim(fixed[5][0], "w")
    assert lease is not None and lease.url == URLS[5]
