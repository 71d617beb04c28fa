"""How many tasks are in each state, and the lifetime counters: the reads behind ``TaskQueue.stats``.

Every count is one O(1) command (``ZCARD``/``LLEN``/``HGETALL`` of a small hash), pipelined, so a
stats call costs two round trips whatever the number of tasks. The queued count is the bands' lengths
minus their stale entries (``stats`` field ``rstale``: ids a direct claim or a cancel took out of a
band, left there for a pop to skip; see ``unready`` in ``_common.lua``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from celery_ha.state.host_queues import as_text, host_queue_ids
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import decode_state

#: Lifetime counters always present in ``stats()`` (0 until the first event), in display order.
COUNTERS = ("enqueued", "duplicates", "claimed", "failed", "retried", "reclaimed", "released",
            "redriven", "redispatched", "recrawled", "refetched", "unchanged", "items", "items_duplicate")

#: Fields of ``stats`` that hold the dedup sweeps' place (``forget_finished.lua``,
#: ``forget_carried.lua``), not counts.
SWEEP_FIELDS = ("dcur", "dpmin", "dmin", "dpkmin", "dkmin", "dkat", "ccur", "cpmin", "cmin")


def queue_stats(client: redis.Redis, k: QueueKeys) -> dict[str, int]:
    """Counts per state plus lifetime counters (see ``TaskQueue.stats``)."""
    return queue_stats_many(client, [k])[0]


def queue_stats_many(client: redis.Redis, shards: list[QueueKeys]) -> list[dict[str, int]]:
    """:func:`queue_stats` of each of ``shards``, read together: two round trips whatever their
    number (on a cluster, the pipeline's commands go to each shard's master)."""
    pipe = client.pipeline(transaction=False)
    for k in shards:
        pipe.zrange(k.ready_bands, 0, -1)
        for key in (k.inflight, k.running, k.delayed, k.dead, k.completed):
            pipe.zcard(key)
        pipe.hgetall(k.stats)
        pipe.hget(k.host_config, "nq")
    replies = pipe.execute()
    rows = [replies[i * 8:(i + 1) * 8] for i in range(len(shards))]
    pipe = client.pipeline(transaction=False)
    for k, (bands, *_) in zip(shards, rows, strict=True):
        for band in bands:
            pipe.llen(k.ready_list(band))
    lengths = iter(pipe.execute() if any(row[0] for row in rows) else [])
    return [_stats_of(row, [next(lengths) for _ in row[0]]) for row in rows]


def _stats_of(row: list[Any], band_lengths: list[int]) -> dict[str, int]:
    _bands, dispatched, running, delayed, dead, history, counters, gated = row
    # queued in host queues (the host gate) and the ready bands, less their stale entries (not queued)
    queued = int(gated or 0) - int(counters.pop("rstale", 0)) + sum(band_lengths)
    out = {"queued": queued, "dispatched": dispatched, "running": running, "delayed": delayed,
           "dead": dead, "completed_history": history}
    counters = {name: int(v) for name, v in counters.items()}
    out["completed"] = counters.pop("completed", 0)
    for name in COUNTERS:
        out[name] = counters.pop(name, 0)
    # How many finished dedup ids are remembered (_remembered.lua), not a lifetime counter; the dedup
    # sweep's cursor fields are its bookkeeping, not counts.
    out["remembered"] = counters.pop("remembered", 0)
    for name in SWEEP_FIELDS:
        counters.pop(name, None)
    out.update(counters)
    out.pop("died", None)
    return out


def live_band_ids(client: redis.Redis, k: QueueKeys, band: str, ids: list[str],
                  seen: set[str] | None = None) -> list[str]:
    """The live entries among ``ids`` read from ``band``: each id whose record is queued in that band
    (not gated), once (its first entry: the one a pop hands out; ``seen`` carries the ids met in
    earlier pages); the rest are stale entries a pop skips (``pop_ready`` in ``_common.lua``)."""
    return _live_ids(client, k, ids, seen, lambda st: "h" not in st and st.get("p", "0") == str(band))


def ready_ids(client: redis.Redis, k: QueueKeys) -> list[str]:
    """Every queued id in claim order (for tests and tooling; O(queued)); then the ids queued in host
    queues, host by host (the gate decides their order when they are handed out)."""
    out: list[str] = []
    for band in client.zrange(k.ready_bands, 0, -1):
        band = as_text(band)
        out.extend(live_band_ids(client, k, band, client.lrange(k.ready_list(band), 0, -1)))
    for host in sorted(as_text(h) for h in client.smembers(k.hosts)):
        ids = host_queue_ids(client, k, host)
        out.extend(live_host_ids(client, k, host, ids))
    return out


def live_host_ids(client: redis.Redis, k: QueueKeys, host: str, ids: list[str]) -> list[str]:
    """The live entries among ``ids`` read from ``host``'s queue: each id whose record is queued for
    that host, once (stale list entries are skipped by the pop, ``host_pop`` in ``_hosts.lua``)."""
    return _live_ids(client, k, ids, None, lambda st: st.get("h") == host)


def _live_ids(client: redis.Redis, k: QueueKeys, ids: list[str], seen: set[str] | None,
              here: Callable[[dict[str, str]], bool]) -> list[str]:
    """Each id among ``ids`` whose record is queued where ``here`` says, once (its first entry)."""
    seen = set() if seen is None else seen
    out: list[str] = []
    for tid, raw in zip(ids, read_records(client, k, ids) if ids else [], strict=True):
        if tid in seen or not raw:
            continue
        st = decode_state(as_text(raw))
        if st.get("s") == "q" and here(st):
            seen.add(tid)
            out.append(tid)
    return out
