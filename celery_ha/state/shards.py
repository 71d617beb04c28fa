"""Sharded namespaces (``CELERY_HA_SHARDS=N``): one namespace's tasks spread over N hash tags.

Every key of a namespace lives under one ``{hash tag}``, so in one Redis Cluster slot, on one node.
With N shards the per-task structures (records, ready bands, leases, delayed, dead, history, dedup,
checkpoints, counters, histograms, the item sink) exist once per shard, each under its own tag, so N
slots on up to N nodes share the memory and the CPU. Shard 0 is the namespace's own tag: with N = 1
the layout is exactly the unsharded one. The proxy pool, the worker registry, the task-name
registry, the locks and the ``meta`` hash (pause flag, sweep stamps, the shard count itself) stay
under the namespace's own tag.

* The shard of a task is a function of its id (CRC-32 of the id, modulo N): claim, renew, commit,
  complete, fail, release and cancel go straight to it, and a dedup id (task name + canonical URL)
  always lands on the same shard, so dedup stays exact.
* The tags of shards 1..N-1 are ``<namespace>~<i>.<k>`` ('~' never occurs in a namespace, so no other
  namespace can own them), with the smallest k that puts the tag's slot just after
  ``slot(namespace) + i × 16384 / N``: the shards' slots are evenly spaced around the slot ring, so a
  cluster whose masters hold equal contiguous slot ranges (what ``redis-cli --cluster create`` makes)
  gets one shard per master when N is the number of masters. Other layouts place them as CLUSTER
  SLOTS says.
* The count is recorded in the namespace's ``meta`` hash (field ``shards``; absent = 1). A client
  configured with another count on a namespace that holds tasks is refused (ConfigurationError):
  its tasks would hide in shards it does not read. An empty namespace takes the new count.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

import redis
from redis.crc import key_slot

from celery_ha.base.errors import ConfigurationError
from celery_ha.redisio.cluster import is_cluster_client, keys_in_slot, slot_owner
from celery_ha.state.counts import queue_stats_many
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import record_count

SLOTS = 16384
META_FIELD = "shards"
MAX_SHARDS = 256


@cache
def shard_tags(namespace: str, count: int) -> tuple[str, ...]:
    """The hash tag of each shard of ``namespace`` (shard 0 = the namespace itself)."""
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigurationError(f"CELERY_HA_SHARDS must be 1..{MAX_SHARDS}, got {count}")
    base = key_slot(namespace.encode())
    width = max(16, min(64, SLOTS // count))  # how far past its target a shard's slot may fall
    tags = [namespace]
    for i in range(1, count):
        target = (base + i * SLOTS // count) % SLOTS
        k = 0
        while (key_slot(f"{namespace}~{i}.{k}".encode()) - target) % SLOTS >= width:
            k += 1
        tags.append(f"{namespace}~{i}.{k}")
    return tuple(tags)


def shard_of(task_id: str, count: int) -> int:
    """The shard that holds ``task_id`` among ``count``."""
    return 0 if count == 1 else zlib.crc32(task_id.encode("utf-8")) % count


def shard_keys(namespace: str, count: int) -> list[QueueKeys]:
    """The keys of every shard, shard 0 first (its keys are the namespace's unsharded keys)."""
    tags = shard_tags(namespace, count)
    return [QueueKeys(namespace, None if i == 0 else tag) for i, tag in enumerate(tags)]


def stored_count(client: redis.Redis, namespace: str) -> int:
    """The shard count the namespace was written with (1 when never recorded)."""
    raw = client.hget(QueueKeys(namespace).meta, META_FIELD)
    return int(raw) if raw else 1


def namespace_keys(client: redis.Redis, namespace: str) -> list[QueueKeys]:
    """The keys of every shard of ``namespace`` as it is stored: for readers that are handed only a
    client and a namespace (the sink, listings, the worker registry, purge)."""
    return shard_keys(namespace, stored_count(client, namespace))


def _holds_tasks(client: redis.Redis, keys: list[QueueKeys]) -> bool:
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hlen(k.tasks)  # records of earlier releases
        pipe.hget(k.record_geometry, "n")  # records in buckets (_records.lua)
        pipe.hlen(k.items)
    return any(int(n or 0) for n in pipe.execute())


def check_count(client: redis.Redis, namespace: str, count: int) -> None:
    """Refuse ``count`` shards on a namespace stored with another count that still holds tasks or
    items; record ``count`` on an empty one (nothing to move). One read when the counts agree."""
    stored = stored_count(client, namespace)
    if stored == count:
        return
    if _holds_tasks(client, shard_keys(namespace, stored)):
        raise ConfigurationError(
            f"namespace {namespace!r} holds tasks in {stored} shard(s); CELERY_HA_SHARDS={count} would "
            f"not see them. Keep CELERY_HA_SHARDS={stored}, or drain it (export, then "
            f"`celery-ha purge`) before changing the shard count")
    meta = QueueKeys(namespace).meta
    if count == 1:
        client.hdel(meta, META_FIELD)
    else:
        client.hset(meta, META_FIELD, count)


@dataclass(frozen=True)
class ShardInfo:
    """Where one shard of a namespace lives and what it holds (``celery-ha shards``)."""

    index: int
    tag: str  # its hash tag: every key of the shard is ``cha:{tag}:...``
    slot: int  # the Redis Cluster slot of the tag (also on a single Redis: where it would go)
    node: str | None  # ``host:port`` of the master serving the slot; None on a single Redis
    keys_in_slot: int | None  # every key of the slot on that master (other tags may share it)
    records: int
    queued: int
    running: int
    delayed: int
    dead: int
    remembered: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def shard_table(client: redis.Redis, namespace: str) -> list[ShardInfo]:
    """Every shard of ``namespace`` as it is stored (the recorded count), shard 0 first: its tag,
    slot, master and counts. A few O(1) reads per shard."""
    keys = namespace_keys(client, namespace)
    tags = shard_tags(namespace, len(keys))
    cluster = is_cluster_client(client)
    out = []
    for index, (tag, k, counts) in enumerate(zip(tags, keys, queue_stats_many(client, keys), strict=True)):
        slot = key_slot(tag.encode())
        out.append(ShardInfo(
            index=index, tag=tag, slot=slot, node=slot_owner(client, slot) if cluster else None,
            keys_in_slot=keys_in_slot(client, slot) if cluster else None, records=record_count(client, k),
            queued=counts["queued"], running=counts["running"], delayed=counts["delayed"],
            dead=counts["dead"], remembered=counts["remembered"]))
    return out
