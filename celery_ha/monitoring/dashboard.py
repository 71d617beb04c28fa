"""The JSON behind the dashboard page and ``/api/stats``, read from Redis on every request.

``/api/stats`` has exactly the keys of ``celery-ha stats --json``. ``/api/dashboard`` adds what the page
draws: progress, wait and runtime percentiles (from the scripts' histograms), completions over the
last minutes (from the completed history and the dead set, both scored by time), live workers with
the leases they hold, the newest dead letters with their reasons, and the proxy table. Every string
of both documents (URLs, errors, and the pause, ban and block reasons operators type) is masked
before it leaves the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from celery_ha.base.masking import mask_url
from celery_ha.proxy import ProxyPool
from celery_ha.proxy.metrics import read_pool_metrics
from celery_ha.redisio.memory_policy import eviction_policy, eviction_warning
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.metrics import Histogram, read_queue_metrics
from celery_ha.state.pause import paused
from celery_ha.state.worker_registry import list_workers

#: Completions over the last SPAN seconds, in buckets of BUCKET seconds.
SPAN, BUCKET = 600, 15
DEAD_SHOWN = 50
PROXIES_SHOWN = 500
QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Reader:
    """What the dashboard reads through: one namespace's queue and pool on one client."""

    client: redis.Redis
    queue: TaskQueue
    pool: ProxyPool
    worker_max_age: float

    @property
    def namespace(self) -> str:
        return self.queue.namespace


def stats_snapshot(reader: Reader) -> dict[str, Any]:
    """The document of ``celery-ha stats --json``: namespace, queue stats, pause, pool stats, warnings
    (tests/monitoring/test_web.py compares both documents)."""
    warning = eviction_warning(eviction_policy(reader.client))
    data = {"namespace": reader.namespace, **reader.queue.stats(),
            "paused": paused(reader.client, reader.namespace), "proxies": reader.pool.stats(),
            "warnings": [warning] if warning else []}
    gate = reader.queue.hosts
    if gate.enabled() or reader.client.exists(reader.queue.keys.hosts):
        # Queued tasks of the host gate by why they wait: blocked host, host not yet eligible
        # (paced, at its concurrency or budget), eligible host (reads every host: O(hosts)).
        data["hosts"] = gate.waiting()
    return masked(data)


def masked(doc: Any) -> Any:
    """``doc`` with every string (keys too) passed through mask_url. Pause, ban and block reasons are
    free text an operator typed and may hold a URL with its password: Redis keeps them as typed, the
    web shows them masked like every other text. mask_url is idempotent, so masking twice is harmless."""
    if isinstance(doc, str):
        return mask_url(doc)
    if isinstance(doc, dict):
        return {masked(k): masked(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [masked(v) for v in doc]
    return doc


def _percentiles(hist: Histogram) -> dict[str, Any]:
    out: dict[str, Any] = {"count": hist.count}
    for q in QUANTILES:
        value = hist.quantile(q)
        out[f"p{round(q * 100)}"] = None if value is None else round(value, 4)
    return out


def latency(histograms: dict[str, dict[str, Histogram]]) -> dict[str, Any]:
    """Percentiles of wait and runtime, overall and per task name."""
    out: dict[str, Any] = {"by_task": []}
    names = sorted(set(histograms["wait"]) | set(histograms["runtime"]))
    for kind in ("wait", "runtime"):
        total = Histogram()
        for hist in histograms[kind].values():
            total = total.merge(hist)
        out[kind] = _percentiles(total)
    for name in names:
        out["by_task"].append({"task": name, **{kind: _percentiles(histograms[kind].get(name, Histogram()))
                                                for kind in ("wait", "runtime")}})
    return out


def throughput(client: redis.Redis, shards: list[QueueKeys], now_ms: int, completed_total: int
               ) -> dict[str, Any]:
    """Completions and deaths per BUCKET seconds over the last SPAN seconds, summed over the
    namespace's shards (one pipelined round trip).

    The completed history is bounded (``history_max``, per shard): when it was trimmed, the buckets
    older than its first record are not covered and ``covered_since`` says from when the counts are
    complete.
    """
    end = now_ms - now_ms % (BUCKET * 1000) + BUCKET * 1000
    starts = [end - (i + 1) * BUCKET * 1000 for i in reversed(range(SPAN // BUCKET))]
    pipe = client.pipeline(transaction=False)
    for k in shards:
        for start in starts:
            pipe.zcount(k.completed, start, f"({start + BUCKET * 1000}")
            pipe.zcount(k.dead, start * 1000, f"({(start + BUCKET * 1000) * 1000}")
        pipe.zrange(k.completed, 0, 0, withscores=True)
        pipe.zcard(k.completed)
    replies = pipe.execute()
    per_shard = 2 * len(starts) + 2
    completed = [0] * len(starts)
    dead = [0] * len(starts)
    firsts: list[float] = []
    held = 0
    for n in range(len(shards)):
        *counts, first, shard_held = replies[n * per_shard:(n + 1) * per_shard]
        for i in range(len(starts)):
            completed[i] += counts[2 * i]
            dead[i] += counts[2 * i + 1]
        if first:
            firsts.append(float(first[0][1]))
        held += shard_held
    covered = max(firsts) / 1000 if firsts and held < completed_total else None
    series = [{"t": start / 1000, "completed": completed[i], "dead": dead[i]}
              for i, start in enumerate(starts)]
    return {"bucket_seconds": BUCKET, "series": series, "covered_since": covered}


def dead_letters(reader: Reader) -> list[dict[str, Any]]:
    pipe = reader.client.pipeline(transaction=False)
    for k in reader.queue.shard_keys():
        pipe.zrevrange(k.dead, 0, DEAD_SHOWN - 1, withscores=True)
    newest = sorted((pair for shard in pipe.execute() for pair in shard), key=lambda p: -p[1])
    ids = newest[:DEAD_SHOWN]  # the newest deaths of the whole namespace
    infos = reader.queue.get_many([tid for tid, _ in ids])
    out = []
    for (tid, score), info in zip(ids, infos, strict=True):
        if info is None:
            continue
        out.append({"id": tid, "url": mask_url(info.url), "task": info.task,
                    "error": mask_url(info.error or ""), "attempts": info.attempts, "stalls": info.stalls,
                    "died_at": score / 1e6})
    return out


def workers(reader: Reader) -> list[dict[str, Any]]:
    alive = list_workers(reader.client, reader.namespace, reader.worker_max_age)
    return [{"name": w["name"], "node": w["node"], "pid": w["pid"], "age": round(w["age"], 2),
             "tasks": w["tasks"]} for w in alive]


def proxies(reader: Reader) -> list[dict[str, Any]]:
    return [info.to_dict() for info in reader.pool.list()[:PROXIES_SHOWN]]


#: Hosts of the host gate the page lists (most queued first); past HOSTS_LISTED_MAX known hosts the
#: listing (O(hosts) reads) is left to `celery-ha hosts list` and the page shows the zone counts only.
HOSTS_SHOWN = 20
HOSTS_LISTED_MAX = 2000


def hosts(reader: Reader) -> dict[str, Any]:
    """The host gate: on or off, how many hosts are known, and the busiest ones (few hosts only)."""
    gate = reader.queue.hosts
    if not gate.enabled():
        return {"enabled": False, "known": 0, "top": []}
    known = sum(int(reader.client.scard(k.hosts)) for k in reader.queue.shard_keys())
    top = ([h.as_dict() for h in gate.list(sort="queued", limit=HOSTS_SHOWN)]
           if known <= HOSTS_LISTED_MAX else [])
    return {"enabled": True, "known": known, "top": top}


def dashboard(reader: Reader) -> dict[str, Any]:
    """Everything the page shows, in one document."""
    stats = stats_snapshot(reader)
    m = read_queue_metrics(reader.client, reader.namespace)
    pool = read_pool_metrics(reader.client, reader.namespace)
    done = int(stats["completed"]) + int(stats["dead"])
    pending = sum(int(stats[n]) for n in ("queued", "delayed", "dispatched", "running"))
    return masked({
        "namespace": reader.namespace,
        "now": m.now_ms / 1000,
        "stats": stats,
        "progress": {"done": done, "total": done + pending},
        "oldest_queued_seconds": (None if m.oldest_ready_ms is None
                                  else (m.now_ms - m.oldest_ready_ms) / 1000),
        "latency": latency(m.histograms),
        "throughput": throughput(reader.client, reader.queue.shard_keys(), m.now_ms,
                                 int(stats["completed"])),
        "workers": workers(reader),
        "workers_alive": len(m.alive_workers(reader.worker_max_age)),
        "dead": dead_letters(reader),
        "proxies": proxies(reader),
        "proxy_zones": pool.zones,
        "domains": [d.__dict__ for d in pool.domains],
        "hosts": hosts(reader),
        "host_zones": m.hosts,
    })
