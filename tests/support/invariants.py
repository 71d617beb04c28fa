"""Check DESIGN §2's invariants directly on Redis state (used by unit, stateful and chaos tests)."""

from __future__ import annotations

from collections import Counter

import redis

from celery_ha.state import TaskQueue
from celery_ha.state.counts import live_band_ids, live_host_ids
from celery_ha.state.done_times import count_remembered, remembered
from celery_ha.state.host_queues import host_queue_ids
from celery_ha.state.hosts import SLOT
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import all_records, bucket_count
from celery_ha.state.records import TaskInfo, decode_head, decode_state
from celery_ha.state.refetch_index import waiting_due

#: state code -> the structure that must hold the id
_STRUCTURE_OF = {"q": "ready", "d": "inflight", "r": "running", "w": "delayed", "x": "dead", "c": "completed"}


def _records(r: redis.Redis, k: QueueKeys) -> dict[str, str]:
    """Every record of the shard; an id held twice (in a bucket and in the hash of earlier releases,
    or in two buckets) breaks the layout's invariant: a record lives in exactly one place."""
    pairs = list(all_records(r, k))
    held = Counter(tid for tid, _ in pairs)
    twice = {tid: n for tid, n in held.items() if n > 1}
    assert not twice, f"records held in more than one place: {twice}"
    return dict(pairs)


def stale_entries(r: redis.Redis, q: TaskQueue) -> int:
    """How many entries of the ready lists are stale (not the live entry of a task queued in that band)."""
    k = q.keys
    stale = 0
    for key in r.scan_iter(match=k.ready_list("*"), count=1000):
        ids = r.lrange(key, 0, -1)
        stale += len(ids) - len(live_band_ids(r, k, key[len(k.ready_list("")):], ids))
    return stale


def membership(r: redis.Redis, q: TaskQueue) -> dict[str, list[str]]:
    """Every state structure's ids (the live entries of the ready lists flattened in claim order, then
    the host gate's queues)."""
    k = q.keys
    out = {"ready": []}  # type: dict[str, list[str]]
    for band in r.zrange(k.ready_bands, 0, -1):
        out["ready"].extend(live_band_ids(r, k, band, r.lrange(k.ready_list(band), 0, -1)))
    for host in sorted(r.smembers(k.hosts)):
        out["ready"].extend(live_host_ids(r, k, host, host_queue_ids(r, k, host)))
    for name, key in (("inflight", k.inflight), ("running", k.running), ("delayed", k.delayed),
                      ("dead", k.dead), ("completed", k.completed)):
        out[name] = r.zrange(key, 0, -1)
    return out


def check_invariants(r: redis.Redis, q: TaskQueue) -> dict[str, str]:
    """Assert that every task is in exactly one structure, the one its record names; return id->state."""
    where = membership(r, q)
    seen: Counter[str] = Counter()
    location: dict[str, str] = {}
    for name, ids in where.items():
        for tid in ids:
            seen[tid] += 1
            location[tid] = name
    doubled = {tid: n for tid, n in seen.items() if n > 1}
    assert not doubled, f"ids in more than one place: {doubled}"
    states: dict[str, str] = {}
    # A completed task waiting for a scheduled run keeps its record after the history let it go.
    scheduled = set().union(*(check_refetch_index(r, shard) for shard in q._shards))
    for tid, raw in _records(r, q.keys).items():
        st = decode_head(raw.partition("\n")[0])
        expected = _STRUCTURE_OF[st["s"]]
        if st["s"] == "c" and tid in scheduled and tid not in location:
            expected = None
        assert location.get(tid) == expected, f"{tid} is {st['s']!r} but sits in {location.get(tid)!r}"
        states[tid] = st["s"]
    orphans = set(location) - set(states)
    assert not orphans, f"ids without a record: {orphans}"
    # Every non-empty band is indexed (an emptied band may stay indexed until the next pop).
    indexed = set(r.zrange(q.keys.ready_bands, 0, -1))
    for key in r.scan_iter(match=q.keys.ready_list("*"), count=1000):
        band = key[len(q.keys.ready_list("")):]
        assert band in indexed, f"band {band} holds tasks but is not indexed"
    # The stale entries a direct claim or a cancel left in the bands are exactly the ones counted.
    counted = int(r.hget(q.keys.stats, "rstale") or 0)
    assert stale_entries(r, q) == counted, f"{stale_entries(r, q)} stale band entries, {counted} counted"
    # The count of remembered (finished dedup) ids is the buckets' (the sorted set before them aside).
    in_buckets = count_remembered(r, q.keys) - int(r.zcard(q.keys.done))
    assert int(r.hget(q.keys.stats, "remembered") or 0) == in_buckets, f"{in_buckets} ids in the buckets"
    check_hosts(r, q)
    return states


def waiting_records(r: redis.Redis, k: QueueKeys) -> dict[str, tuple[int, int | None, bool]]:
    """Every record of shard ``k`` that waits for a scheduled run (completed or dead, with its
    interval: ``_refetch.lua``): id -> (its due time in ms, its record bucket (None for the hash of
    earlier releases), whether it is a dedup task)."""
    out: dict[str, tuple[int, int | None, bool]] = {}
    pages = [(i, r.hgetall(k.record_bucket(i)).items()) for i in range(bucket_count(r, k))]
    for i, pairs in [*pages, (None, r.hscan_iter(k.tasks, count=500))]:
        for tid, raw in pairs:
            info = TaskInfo.parse(tid, raw)
            due = waiting_due(info)
            if due is not None:
                out[tid] = (due, i, info.dedup)
    return out


def check_refetch_index(r: redis.Redis, k: QueueKeys) -> set[str]:
    """The refetch index agrees with the records (``_refetch.lua``): every waiting record's bucket is
    indexed at or below its due time, unless the index of earlier releases holds its id; that index
    holds only waiting records; stats ``refetch_waiting`` counts exactly the waiting records the
    earlier index does not; a waiting dedup task's id is not remembered apart (its record is the
    dedup memory), unless the earlier index holds it. Returns the waiting ids."""
    waiting = waiting_records(r, k)
    legacy = set(r.zrange(k.refetch, 0, -1))
    index = {int(b): score for b, score in r.zrange(k.refetch_buckets, 0, -1, withscores=True)}
    assert legacy <= set(waiting), f"in the earlier refetch index, waiting for none: {legacy - set(waiting)}"
    for tid, (due, bucket, dedup) in waiting.items():
        if tid in legacy:
            continue
        assert bucket is not None, f"{tid} waits in the hash of earlier releases, unindexed"
        assert bucket in index and index[bucket] <= due, \
            f"{tid} (due {due}) unindexed: bucket {bucket} scores {index.get(bucket)}"
        assert not (dedup and remembered(r, k, tid)), f"{tid} waits for a scheduled run and is remembered too"
    counted = int(r.hget(k.stats, "refetch_waiting") or 0)
    indexed = set(waiting) - legacy
    assert counted == len(indexed), f"refetch_waiting {counted}, {len(indexed)} records wait"
    return set(waiting)


def _limit(hs: dict[str, str], defaults: dict[str, str], field: str, default: float) -> float:
    """A host's limit as _hosts.lua's hnum reads it: its override, else the namespace default."""
    value = hs.get(field) or defaults.get(field)
    try:
        return float(value) if value else default
    except ValueError:
        return default


def waits_for_an_event(hs: dict[str, str], defaults: dict[str, str]) -> bool:
    """Whether the host's limits keep it out until an event (_hosts.lua's host_due returning SLOT):
    its budget used up, its concurrency full, or a paced host's message still unclaimed."""
    budget = _limit(hs, defaults, "bg", -1)
    if budget >= 0 and float(hs.get("u") or 0) >= budget:
        return True
    concurrency = _limit(hs, defaults, "cc", 0)
    if concurrency > 0 and float(hs.get("a") or 0) >= concurrency:
        return True
    spacing = max(_limit(hs, defaults, "iv", 0), _limit(hs, defaults, "dl", 0), float(hs.get("cd") or 0))
    return float(hs.get("d") or 0) > 0 and spacing > 0


def check_hosts(r: redis.Redis, q: TaskQueue) -> None:
    """The host gate's books agree with the records: each host's queue holds exactly its queued
    tasks, its active / dispatched counts are its tasks dispatched or running / dispatched, the
    queued total is the sum of the queues, a host with queued tasks is filed in exactly one of the
    two indexes (none without), a host filed as eligible is eligible, and a host parked after all
    times (SLOT: it waits for an event, a freed slot, a claim, more budget) still waits for one: one
    whose limits allow it now has no event to come and would never be served again (a leak)."""
    k = q.keys
    queued: dict[str, set[str]] = {}
    active: Counter[str] = Counter()
    dispatched: Counter[str] = Counter()
    for tid, raw in _records(r, k).items():
        st = decode_state(raw)
        host = st.get("h")
        if host is None:
            continue
        if st["s"] == "q":
            queued.setdefault(host, set()).add(tid)
        elif st["s"] in ("d", "r"):
            active[host] += 1
            dispatched[host] += st["s"] == "d"
    hosts = r.smembers(k.hosts)
    assert set(queued) <= hosts, f"queued hosts unknown to the gate: {set(queued) - hosts}"
    ready = set(r.zrange(k.hosts_ready, 0, -1))
    waiting = dict(r.zrange(k.hosts_wait, 0, -1, withscores=True))
    defaults = r.hgetall(k.host_config)
    assert not ready & set(waiting), f"hosts filed twice: {ready & set(waiting)}"
    total = 0
    infos = {i.host: i for i in q.hosts.list()} if hosts else {}
    for host in hosts:
        entries = host_queue_ids(r, k, host)  # stale entries included (a pop skips them)
        in_queue = set(live_host_ids(r, k, host, entries))
        total += len(in_queue)
        assert in_queue == queued.get(host, set()), f"host {host}: queue {in_queue} vs {queued.get(host)}"
        hs = r.hgetall(k.host_state(host))
        assert int(hs.get("a", 0)) == active[host], f"host {host}: active {hs.get('a')} vs {active[host]}"
        assert int(hs.get("d", 0)) == dispatched[host], f"host {host}: dispatched {hs.get('d')}"
        filed = (host in ready) + (host in waiting)
        assert filed == (1 if entries else 0), f"host {host} ({len(entries)} entries) filed {filed} times"
        if host in ready:
            assert infos[host].state == "ready", f"host {host} is filed eligible but is {infos[host].state}"
        if waiting.get(host) == SLOT:
            assert waits_for_an_event(hs, defaults), f"host {host} is parked for an event it no longer needs"
    assert int(r.hget(k.host_config, "nq") or 0) == total, "the gated queued count drifted"
