"""The durable layer's metrics, read in a fixed number of round trips whatever the number of tasks.

The transition scripts count as they go (``_common.lua``): lifetime counters in ``stats``, and two
histograms in ``hist`` — the wait of a task from becoming ready to its claim, and its runtime from
claim to completion, by task name — as one HINCRBY per observation on a bucket of a fixed grid. This
module holds that grid (it must match ``hist_bucket`` in ``_common.lua``; a test checks both) and reads
everything else a scrape needs: counts per state, the oldest waiting task, the worker heartbeats.

Three round trips: the fixed keys, then each priority band's length and head (bands are bounded by
the priorities in use, not by tasks) and the first due buckets of the refetch index (bounded), then
the records at those heads.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import redis

from celery_ha.redisio.cluster import is_cluster_client
from celery_ha.state.host_queues import host_queue_heads
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import decode_head
from celery_ha.state.refetch_index import add_bucket_reads, add_pending_reads, pending_of
from celery_ha.state.shards import namespace_keys

#: Bucket upper bounds per decade, in tenths of a ms (``HIST_STEPS`` in ``_common.lua``).
STEPS = (10, 12, 15, 18, 20, 25, 30, 36, 40, 50, 60, 75)
DECADES = 10
#: Buckets 0..119 have a finite bound; bucket 120 holds everything above 7.5e9 ms (87 days).
OVERFLOW = len(STEPS) * DECADES
BUCKETS = OVERFLOW + 1
#: The histogram kinds the scripts count ('w' / 'r' in the field names).
KINDS = {"w": "wait", "r": "runtime"}

#: Lifetime counters of ``stats`` -> the event name metrics use (``died`` is the script's name).
EVENTS = {
    "enqueued": "enqueued", "duplicates": "duplicate", "claimed": "claimed", "completed": "completed",
    "failed": "failed", "retried": "retried", "reclaimed": "reclaimed", "released": "released",
    "redriven": "redriven", "died": "dead", "redispatched": "redispatched", "recrawled": "recrawled",
    "cancelled": "cancelled", "unchanged": "unchanged", "refetched": "refetched",
}
#: How many ids at the head of each band are read to find the oldest waiting one: reclaimed tasks go
#: to the front of their band, so the oldest one is the first id pushed at the back, a few places in.
HEAD = 16
#: The host gate's zones of hosts with queued tasks (``celery_ha_hosts{zone}``), and hwait's score of
#: a host parked until an event (SLOT in _hosts.lua).
HOST_ZONES = ("eligible", "waiting", "parked")
PARKED = 9e15
#: Hosts whose queue heads are read for the oldest waiting task (from each end of hwait, and the
#: front of hready): every host while at most 3 x this many have queued tasks; beyond that the hosts
#: most likely to hold it (parked or blocked longest, due next, served least recently).
HOST_SAMPLE = 50


def bucket_bound_ms(k: int) -> float:
    """Upper bound (inclusive, ms) of bucket ``k``; infinite for the overflow bucket."""
    if k >= OVERFLOW:
        return math.inf
    return STEPS[k % len(STEPS)] * 10 ** (k // len(STEPS)) / 10


_BOUNDS = [bucket_bound_ms(k) for k in range(OVERFLOW)]


def bucket_index(ms: float) -> int:
    """The bucket of a duration in whole ms: the Python twin of ``hist_bucket`` in ``_common.lua``."""
    return bisect.bisect_left(_BOUNDS, max(0, int(ms)))


@dataclass
class Histogram:
    """Counts per bucket of one task name and kind."""

    counts: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self, bounds_seconds: list[float]) -> list[tuple[float, int]]:
        """Prometheus buckets: (le in seconds, observations <= le) for each bound, then +Inf.
        Exact for bounds on the grid (every default bound is)."""
        out = []
        for le in bounds_seconds:
            limit = bisect.bisect_right(_BOUNDS, le * 1000 + 1e-9)
            out.append((le, sum(self.counts[:limit])))
        out.append((math.inf, self.count))
        return out

    def estimated_sum_seconds(self) -> float:
        """Sum of the observations, each taken at its bucket's middle (the scripts keep one counter per
        observation, not its exact value): within 15 % per observation, closer on many."""
        total = 0.0
        for k, n in enumerate(self.counts):
            if n:
                low = _BOUNDS[k - 1] if k else 0.0
                high = _BOUNDS[k] if k < OVERFLOW else _BOUNDS[-1]
                total += n * (low + high) / 2
        return total / 1000

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile in seconds, interpolated inside its bucket; None without observations."""
        total = self.count
        if not total:
            return None
        rank = q * total
        seen = 0
        for k, n in enumerate(self.counts):
            if n and seen + n >= rank:
                low = _BOUNDS[k - 1] if k else 0.0
                high = _BOUNDS[k] if k < OVERFLOW else _BOUNDS[-1]
                return (low + (high - low) * max(0.0, rank - seen) / n) / 1000
            seen += n
        return _BOUNDS[-1] / 1000

    def merge(self, other: Histogram) -> Histogram:
        return Histogram([a + b for a, b in zip(self.counts, other.counts, strict=True)])


def parse_histograms(fields: dict[str, str]) -> dict[str, dict[str, Histogram]]:
    """``hist`` hash fields (``<w|r>:<bucket>:<task>``) -> {'wait'|'runtime': {task: Histogram}}."""
    out: dict[str, dict[str, Histogram]] = {name: {} for name in KINDS.values()}
    for name, value in fields.items():
        kind, _, rest = name.partition(":")
        bucket, _, task = rest.partition(":")
        if kind not in KINDS or not bucket.isdigit() or int(bucket) >= BUCKETS:
            continue
        hist = out[KINDS[kind]].setdefault(task, Histogram())
        hist.counts[int(bucket)] += int(value)
    return out


@dataclass
class QueueMetrics:
    """What one read of a namespace found (times in ms of the Redis clock)."""

    namespace: str
    now_ms: int
    states: dict[str, int]
    counters: dict[str, int]
    items: int
    histograms: dict[str, dict[str, Histogram]]
    workers: list[tuple[str, int]]  # (node:pid, last heartbeat ms), every registered one
    oldest_ready_ms: int | None  # when the longest-waiting queued task became ready
    oldest_dispatched_ms: int | None  # when the oldest dispatched, unclaimed task was sent
    completed_history: int = 0
    # Hosts of the host gate with queued tasks: eligible now, waiting for a time (pacing, a block),
    # parked until an event (a free slot, a claim, more budget). Three O(1) reads per shard.
    hosts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HOST_ZONES, 0))
    # Completed (or dead) tasks waiting for a scheduled refetch (state/schedules.py): all (exact), and
    # those due now (exact while at most 64 record buckets per shard are due: refetch_index.py).
    refetch: dict[str, int] = field(default_factory=lambda: {"waiting": 0, "due": 0})

    def alive_workers(self, max_age: float) -> list[str]:
        cutoff = self.now_ms - int(max_age * 1000)
        return [name for name, beat in self.workers if beat >= cutoff]

    def events(self) -> dict[str, int]:
        return {event: self.counters.get(field_, 0) for field_, event in EVENTS.items()}


def _ready_since(raw: str | None) -> int | None:
    """When a queued record became ready (qt, else ut, else ct: the rule of grant() in the scripts)."""
    if not raw:
        return None
    try:
        st = decode_head(raw.partition("\n")[0])
    except ValueError:
        return None
    if st.get("s") != "q":
        return None
    since = st.get("qt") or st.get("ut") or st.get("ct")
    return int(since) if since is not None else None


def read_queue_metrics(client: redis.Redis, namespace: str) -> QueueMetrics:
    """Everything :mod:`celery_ha.monitoring` shows about the task layer, in three round trips (per
    shard of a sharded namespace: counts, counters and histograms are added up)."""
    shards = namespace_keys(client, namespace)
    k = shards[0]
    if is_cluster_client(client):  # redis-py's cluster pipeline refuses TIME (it has no key to route by)
        clock, workers = client.time(), client.zrange(k.workers, 0, -1, withscores=True)
    else:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        pipe.zrange(k.workers, 0, -1, withscores=True)
        clock, workers = pipe.execute()
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    states = dict.fromkeys(("queued", "dispatched", "running", "delayed", "dead"), 0)
    counters: dict[str, int] = {}
    hist: dict[str, int] = {}
    items = history = 0
    hosts = dict.fromkeys(HOST_ZONES, 0)
    refetch = {"waiting": 0, "due": 0}
    starts: list[int] = []
    sent: list[int] = []
    for k in shards:
        part = _shard_reads(client, k, now_ms)
        for name in states:
            states[name] += part[name]
        for name, value in part["stats"].items():
            if value.lstrip("-").isdigit():
                counters[name] = counters.get(name, 0) + int(value)
        for field_, value in part["hist"].items():
            hist[field_] = hist.get(field_, 0) + int(value)
        items += part["items"]
        history += part["history"]
        for zone in HOST_ZONES:
            hosts[zone] += part["hosts"][zone]
        for kind in refetch:
            refetch[kind] += part["refetch"][kind]
        starts += part["starts"]
        sent += part["first_sent"]
    states["completed"] = counters.get("completed", 0)
    return QueueMetrics(
        namespace=namespace,
        now_ms=now_ms,
        states={name: states[name] for name in ("queued", "dispatched", "running", "delayed", "completed",
                                                 "dead")},
        counters=counters,
        items=items,
        histograms=parse_histograms({f: str(v) for f, v in hist.items()}),
        workers=[(name, int(score)) for name, score in workers],
        oldest_ready_ms=min(starts) if starts else None,
        oldest_dispatched_ms=min(sent) if sent else None,
        completed_history=history,
        hosts=hosts,
        refetch=refetch,
    )


def _shard_reads(client: redis.Redis, k: QueueKeys, now_ms: int) -> dict[str, Any]:
    """One shard's counts, counters, histogram buckets and oldest waiting tasks (two round trips)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(k.ready_bands, 0, -1)
    for key in (k.inflight, k.running, k.delayed, k.dead, k.completed):
        pipe.zcard(key)
    pipe.hgetall(k.stats)
    pipe.hgetall(k.hist)
    pipe.hlen(k.items)
    pipe.zrange(k.inflight, 0, 0, withscores=True)
    pipe.hget(k.host_config, "nq")
    pipe.zcard(k.hosts_ready)
    pipe.zcard(k.hosts_wait)
    pipe.zcount(k.hosts_wait, PARKED, "+inf")
    add_pending_reads(pipe, k, now_ms)  # the refetch index (state/refetch_index.py): 4 reads
    (bands, dispatched, running, delayed, dead, history, stats, hist, items, first_sent, gated, eligible,
     waiting, parked, *refetch_reads) = pipe.execute()
    # queued in host queues (the host gate), less the ready bands' stale entries (see state/counts.py)
    queued = int(gated or 0) - int(stats.pop("rstale", 0))
    heads: list[str] = []
    due_buckets = refetch_reads[-1]
    bucket_hashes: list[dict[str, str]] = []
    if bands or due_buckets:
        pipe = client.pipeline(transaction=False)
        for band in bands:
            pipe.llen(k.ready_list(band))
            pipe.lrange(k.ready_list(band), 0, HEAD - 1)
        add_bucket_reads(pipe, k, due_buckets)
        replies = pipe.execute()
        bucket_hashes = replies[2 * len(bands):]
        replies = replies[:2 * len(bands)]
        queued += sum(replies[0::2])
        heads = [tid for ids in replies[1::2] for tid in ids]
    refetch = pending_of(stats.pop("refetch_waiting", 0), refetch_reads, bucket_hashes, now_ms)
    if gated and int(gated) > 0:
        heads += _host_heads(client, k)
    starts = [s for s in map(_ready_since, read_records(client, k, heads) if heads else []) if s is not None]
    return {"queued": queued, "dispatched": dispatched, "running": running, "delayed": delayed, "dead": dead,
            "history": history, "stats": stats, "hist": hist, "items": int(items), "starts": starts,
            "first_sent": [int(first_sent[0][1])] if first_sent else [],
            "hosts": {"eligible": int(eligible), "waiting": int(waiting) - int(parked),
                      "parked": int(parked)},
            "refetch": refetch}


def _host_heads(client: redis.Redis, k: QueueKeys) -> list[str]:
    """The first ids of the host gate's queues (tasks of gated hosts wait there, not in a band), of
    the hosts :data:`HOST_SAMPLE` picks (two round trips)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(k.hosts_ready, 0, HOST_SAMPLE - 1)
    pipe.zrange(k.hosts_wait, 0, HOST_SAMPLE - 1)
    pipe.zrange(k.hosts_wait, -HOST_SAMPLE, -1)
    hosts = list(dict.fromkeys(h for part in pipe.execute() for h in part))
    if not hosts:
        return []
    return host_queue_heads(client, k, hosts, HEAD // 4)
