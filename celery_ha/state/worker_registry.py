"""The worker registry: which pool processes are alive and which tasks they hold.

Each pool child heartbeats ``node:pid`` into the ``workers`` sorted set with the Redis clock as
score. Alive = beat within ``max_age`` seconds. The tasks a worker holds are read from the running
leases themselves (the lease records the holder), so the registry can never disagree with them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from celery_ha.redisio.clock import redis_now_ms
from celery_ha.redisio.cluster import is_cluster_client
from celery_ha.redisio.scripts import eval_script
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import TaskInfo
from celery_ha.state.shards import namespace_keys

_SCRIPTS_DIR = Path(__file__).parent


def split_worker(name: str) -> tuple[str, int | None]:
    """``"node:pid"`` -> (node, pid); pid is None when the name carries none."""
    node, _, pid = name.rpartition(":")
    return (node, int(pid)) if pid.isdigit() and node else (name, None)


def quiet_after(heartbeat_interval: float) -> float:
    """Seconds without any heartbeat of a namespace that mean its processes could not reach Redis
    (every live pool process beats every ``heartbeat_interval``)."""
    return max(2.0, 3 * heartbeat_interval)


def heartbeat(client: redis.Redis, namespace: str, worker: str, silence_after: float = 0.0) -> int:
    """Record that ``worker`` is alive now (Redis time); returns that time in ms.

    With ``silence_after`` (seconds), a beat that ends a silence of the whole namespace longer than
    that records it (see :func:`quiet_window`)."""
    keys = QueueKeys(namespace)
    return int(eval_script(client, _SCRIPTS_DIR, "heartbeat", [keys.workers, keys.meta],
                           [worker, int(silence_after * 1000)]))


def quiet_window(client: redis.Redis, namespace: str, silence_after: float) -> tuple[int, int] | None:
    """The last stretch (ms, Redis clock) in which no process of the namespace reached Redis: the
    one going on now when the newest heartbeat is older than ``silence_after``, else the last one
    a heartbeat recorded; None when there was none (or no process ever beat).

    A lease that expired inside it expired because the platform was down, not because its task
    killed its worker: the reclaim sweep hands it back without counting a stall."""
    keys = QueueKeys(namespace)
    pipe = client.pipeline(transaction=False)
    pipe.zrevrange(keys.workers, 0, 0, withscores=True)
    pipe.hmget(keys.meta, ["quiet_from", "quiet_to"])
    newest, (quiet_from, quiet_to) = pipe.execute()
    if not newest:
        return None
    now = redis_now_ms(client)
    last_beat = int(newest[0][1])
    if now - last_beat > silence_after * 1000:
        return last_beat, now
    if quiet_from and quiet_to:
        return int(float(quiet_from)), int(float(quiet_to))
    return None


def newest_silent_beat(client: redis.Redis, namespace: str, since_ms: int, silent_after: float,
                       now_ms: int | None = None) -> int | None:
    """The last beat (ms, Redis clock) of the newest pool process that fell silent after
    ``since_ms``: its last beat turned older than ``silent_after`` seconds since then. None when no
    process did. A process that stopped cleanly unregistered itself, so what is found died (or is
    stopped). ``now_ms``: the Redis time to judge at (default: read now)."""
    now = redis_now_ms(client) if now_ms is None else now_ms
    silent_ms = int(silent_after * 1000)
    newest = client.zrevrangebyscore(QueueKeys(namespace).workers, now - silent_ms,
                                     f"({since_ms - silent_ms}", start=0, num=1, withscores=True)
    return int(newest[0][1]) if newest else None


def unregister(client: redis.Redis, namespace: str, *workers: str) -> None:
    if workers:
        client.zrem(QueueKeys(namespace).workers, *workers)


def prune(client: redis.Redis, namespace: str, older_than: float) -> int:
    """Drop entries that have not beaten for ``older_than`` seconds."""
    cutoff = redis_now_ms(client) - int(older_than * 1000)
    return int(client.zremrangebyscore(QueueKeys(namespace).workers, "-inf", cutoff))


def alive_count(client: redis.Redis, namespace: str, max_age: float) -> int:
    """How many pool processes beat within ``max_age`` seconds (= total worker concurrency)."""
    cutoff = redis_now_ms(client) - int(max_age * 1000)
    return int(client.zcount(QueueKeys(namespace).workers, cutoff, "+inf"))


def register_task_names(client: redis.Redis, namespace: str, node: str, names: list[str]) -> None:
    """Record which task names the worker ``node`` can run (its main process, at start-up)."""
    client.hset(QueueKeys(namespace).task_names, node, json.dumps(sorted(names)))


def register_node_info(client: redis.Redis, namespace: str, node: str, info: dict[str, str]) -> None:
    """Record a worker node's start-up report (which patches are on, how refills are published), so
    ``celery-ha workers`` shows it beside the node's processes."""
    client.hset(QueueKeys(namespace).node_info, node, json.dumps({k: v[:2000] for k, v in info.items()}))


def node_infos(client: redis.Redis, namespace: str, nodes: list[str]) -> dict[str, dict[str, str]]:
    """The start-up reports of ``nodes`` (those that wrote one)."""
    if not nodes:
        return {}
    raws = client.hmget(QueueKeys(namespace).node_info, nodes)
    return {node: json.loads(raw) for node, raw in zip(nodes, raws, strict=True) if raw}


def known_task_names(client: redis.Redis, namespace: str, max_age: float) -> set[str] | None:
    """The task names the live workers of ``namespace`` registered, or None when no live worker did
    (enqueueing ahead of a deployment is fine). A node counts as live while one of its pool processes
    beat within ``max_age`` seconds. One round trip (two on a Redis Cluster, whose pipelines take no
    TIME): the registry's entries are few (one per pool process, one per node), so both are read whole.
    ``enqueue`` calls it too (``state/enqueue_ops.py``)."""
    keys = QueueKeys(namespace)
    cluster = is_cluster_client(client)
    pipe = client.pipeline(transaction=False)
    if not cluster:
        pipe.time()
    pipe.zrange(keys.workers, 0, -1, withscores=True)
    pipe.hgetall(keys.task_names)
    replies = pipe.execute()
    sec, usec = client.time() if cluster else replies.pop(0)
    beats, registered = replies
    cutoff = int(sec) * 1000 + int(usec) // 1000 - int(max_age * 1000)
    live = {split_worker(_text(name))[0] for name, at in beats if at >= cutoff}
    names = [json.loads(raw) for node, raw in registered.items() if _text(node) in live and raw]
    return set().union(*names) if names else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def running_by_worker(client: redis.Redis, namespace: str, limit: int = 10_000) -> dict[str, list[str]]:
    """Running task ids grouped by the lease holder recorded in each task."""
    out: dict[str, list[str]] = defaultdict(list)
    for keys in namespace_keys(client, namespace):  # every shard of a sharded namespace
        ids = client.zrange(keys.running, 0, limit - 1)
        if not ids:
            continue
        for tid, raw in zip(ids, read_records(client, keys, ids), strict=True):
            if not raw:
                continue
            info = TaskInfo.parse(tid, raw)
            if info.state == "running" and info.worker:
                out[info.worker].append(tid)
    return dict(out)


def list_workers(client: redis.Redis, namespace: str = "default", max_age: float | None = None
                 ) -> list[dict[str, Any]]:
    """Alive workers (pool processes) with the task ids they hold, busiest node first.

    ``max_age`` defaults to the lease TTL: a process that has not beaten for that long has lost
    its leases anyway. Each entry: ``name`` (``node:pid``), ``node``, ``pid``, ``last_seen``
    (epoch seconds, Redis clock), ``age`` (seconds), ``tasks``, and the node's start-up report:
    ``patches`` and ``dispatch`` (None when its worker wrote none).
    """
    if max_age is None:
        from celery_ha.base.settings import Settings

        try:
            max_age = Settings.from_env().lease_ttl
        except Exception:  # a bad environment must not break a read-only listing
            max_age = 30.0
    now = redis_now_ms(client)
    members = client.zrangebyscore(QueueKeys(namespace).workers, now - int(max_age * 1000), "+inf",
                                   withscores=True)
    held = running_by_worker(client, namespace)
    reports = node_infos(client, namespace, sorted({split_worker(name)[0] for name, _ in members}))
    out = []
    for name, score in members:
        node, pid = split_worker(name)
        report = reports.get(node, {})
        out.append({
            "name": name,
            "node": node,
            "pid": pid,
            "last_seen": score / 1000.0,
            "age": max(0.0, (now - score) / 1000.0),
            "tasks": sorted(held.get(name, [])),
            "patches": report.get("patches"),
            "dispatch": report.get("dispatch"),
        })
    out.sort(key=lambda w: (w["node"], w["name"]))
    return out
