"""Sharded namespaces benchmark: ``CELERY_HA_SHARDS=1`` vs ``4`` on one Redis, and N=3 on a cluster.

    python benchmarks/shard_bench.py            # full run (~1-2 min on 2 cores)
    python benchmarks/shard_bench.py --quick    # short run
    python benchmarks/shard_bench.py --json out.json
    python benchmarks/shard_bench.py --counts 1,16 --no-cluster   # what pre-sharding costs one Redis

On one redis-server (``/usr/bin/redis-server`` when it is a Redis 7, else as ``queue_bench.py`` picks
it), for shards=1 and shards=4 in alternating rounds after one warm-up round each (rates: the best round,
the one least slowed by other load on a shared machine, with the median beside it; memory: median):

* enqueue: ``enqueue_many`` of 1,000-task batches, tasks per second (one round trip per shard a batch
  touches);
* lifecycle: one thread, ``claim_next`` then ``complete_and_claim`` chained (one round trip per task),
  tasks per second;
* memory: ``used_memory`` delta over the empty database (scripts loaded) per queued task;
* reads that visit every shard, from the client (median of 20, ms): ``stats()``, and a pump tick
  whose window is already full (``dispatch(8)`` after 8 were dispatched: it reads every shard's
  dispatched count).

On a 3-master Redis Cluster (``redis-cli --cluster create``, no replicas): 300,000 tasks queued in a
namespace with shards=3, then ``used_memory`` of each master above its empty baseline.
The tasks are those of ``queue_bench.py`` (``https://example.com/case/<n>``, task ``detail_page``,
meta ``{"start_page": 1}``), so the memory figures compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.queue_bench import META, TASK, default_redis_server, url_of  # noqa: E402
from celery_ha.redisio.client import redis_client  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port, redis_version  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from tests.support.redis_cluster import RedisClusterGroup, cluster_binaries  # noqa: E402


def specs(start: int, n: int) -> list[dict[str, Any]]:
    return [{"url": url_of(i), "meta": META} for i in range(start, start + n)]


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def one_round(r: redis.Redis, shards: int, n_enqueue: int, n_life: int, n_mem: int) -> dict[str, float]:
    """Enqueue rate, lifecycle rate and bytes per queued task for one shard count, on a flushed db."""
    out: dict[str, float] = {}
    r.flushall()
    q = TaskQueue(r, f"sb{shards}", shards=shards, lease_ttl=3600)
    q.enqueue_many(specs(10**8, 10), task=TASK)  # loads the scripts (FLUSHALL keeps them)
    r.flushall()
    q = TaskQueue(r, f"sb{shards}", shards=shards, lease_ttl=3600)
    base = used(r)
    t0 = time.perf_counter()
    for start in range(0, n_enqueue, 1000):
        q.enqueue_many(specs(start, min(1000, n_enqueue - start)), task=TASK)
    out["enqueue_per_s"] = n_enqueue / (time.perf_counter() - t0)
    out["bytes_per_queued"] = (used(r) - base) / n_enqueue if n_enqueue >= n_mem else float("nan")
    done = 0
    t0 = time.perf_counter()
    lease = q.claim_next("bench")
    while lease is not None and done < n_life:
        done += 1
        lease = q.complete_and_claim(lease) if done < n_life else (q.complete(lease), None)[1]
    out["lifecycle_per_s"] = done / (time.perf_counter() - t0)
    out["stats_ms"] = _median_ms(q.stats)
    q.dispatch(8)
    out["full_window_pump_ms"] = _median_ms(lambda: q.dispatch(8))
    return out


def _median_ms(call: Any, times: int = 20) -> float:
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def single_redis(rounds: int, n_enqueue: int, n_life: int, counts: tuple[int, int] = (1, 4)
                 ) -> dict[str, Any]:
    found = cluster_binaries()  # the system's Redis 7 when present (PATH may name a 6.2 shim first)
    binary = found[0] if found else default_redis_server()
    folder = Path(tempfile.mkdtemp(prefix="shard-bench-"))
    server = RedisProcess(port=free_port(), data_dir=folder, binary=binary)
    server.start()
    try:
        r = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
        a, b = counts
        figures: dict[int, list[dict[str, float]]] = {a: [], b: []}
        for shards in (a, b):  # warm-up, not counted (first-touch allocations, CPU frequency)
            one_round(r, shards, n_enqueue // 4, n_life // 4, n_mem=n_enqueue)
        for n in range(rounds):
            for shards in ((a, b) if n % 2 == 0 else (b, a)):
                figures[shards].append(one_round(r, shards, n_enqueue, n_life, n_mem=n_enqueue))
        med = {shards: {key: statistics.median(f[key] for f in rows) for key in rows[0]}
               for shards, rows in figures.items()}
        # Rates: the best round (the one least slowed by other load on a shared machine); memory: median.
        best = {shards: {key: (max if key.endswith("_per_s") else statistics.median)(f[key] for f in rows)
                         for key in rows[0]} for shards, rows in figures.items()}
        return {"redis": ".".join(map(str, redis_version(binary) or ())), "rounds": rounds, "counts": counts,
                "enqueue_tasks": n_enqueue, "lifecycle_tasks": n_life, "best": best, "median": med,
                "raw": figures}
    finally:
        server.stop()


def cluster_memory(n_tasks: int) -> dict[str, Any] | None:
    binaries = cluster_binaries()
    if binaries is None:
        return None
    group = RedisClusterGroup(Path(tempfile.mkdtemp(prefix="shard-bench-cluster-")), *binaries).start()
    try:
        q = TaskQueue(redis_client(group.url), "clbench", shards=3, lease_ttl=3600)
        q.enqueue_many(specs(10**8, 3), task=TASK)  # scripts on every master
        group.flush()
        nodes = [group.node_client(n) for n in range(len(group.nodes))]
        base = [used(node) for node in nodes]
        t0 = time.perf_counter()
        for start in range(0, n_tasks, 1000):
            q.enqueue_many(specs(start, min(1000, n_tasks - start)), task=TASK)
        elapsed = time.perf_counter() - t0
        grown = [used(node) - b for node, b in zip(nodes, base, strict=True)]
        tasks = [int(node.dbsize()) for node in nodes]
        return {"tasks": n_tasks, "enqueue_per_s": n_tasks / elapsed, "used_memory_delta_per_node": grown,
                "keys_per_node": tasks, "bytes_per_task": sum(grown) / n_tasks,
                "stats_queued": q.stats()["queued"]}
    finally:
        group.stop()


def render(single: dict[str, Any], cluster: dict[str, Any] | None) -> str:
    a, b = single["counts"]
    m1, m4 = single["best"][a], single["best"][b]
    d1, d4 = single["median"][a], single["median"][b]
    def rate(label: str, key: str) -> str:
        return (f"| {label} | {m1[key]:,.0f} ({d1[key]:,.0f}) | {m4[key]:,.0f} ({d4[key]:,.0f}) | "
                f"{m4[key] / m1[key]:.2f} ({d4[key] / d1[key]:.2f}) |")

    def ms(label: str, key: str) -> str:
        return f"| {label} | {d1[key]:.2f} | {d4[key]:.2f} | {d4[key] / d1[key]:.2f} |"

    rows = [
        f"| figure: best round (median) | shards={a} | shards={b} | {b} / {a} |",
        "|---|---:|---:|---:|",
        rate("enqueue_many, tasks/s", "enqueue_per_s"),
        rate("lifecycle (complete_and_claim, 1 thread), tasks/s", "lifecycle_per_s"),
        f"| used_memory per queued task, bytes (median) | {m1['bytes_per_queued']:.0f} | "
        f"{m4['bytes_per_queued']:.0f} | {m4['bytes_per_queued'] / m1['bytes_per_queued']:.2f} |",
        ms("stats(), ms (median of the rounds' medians)", "stats_ms"),
        ms("pump tick with a full window, ms (median of the rounds' medians)", "full_window_pump_ms"),
    ]
    text = "\n".join(rows) + (f"\n\nRedis {single['redis']}, best (median) of {single['rounds']} rounds "
                              f"per count ({single['enqueue_tasks']:,} tasks enqueued, "
                              f"{single['lifecycle_tasks']:,} lifecycles per round).\n")
    if cluster:
        per_node = ", ".join(f"{b / 2**20:.1f} MiB" for b in cluster["used_memory_delta_per_node"])
        text += (f"\nCluster, 3 masters, shards=3, {cluster['tasks']:,} queued tasks: used_memory grew by "
                 f"{per_node} ({cluster['bytes_per_task']:.0f} B per task overall; keys per master "
                 f"{cluster['keys_per_node']}); enqueue_many {cluster['enqueue_per_s']:,.0f} tasks/s.\n")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run")
    ap.add_argument("--json", metavar="FILE", help="also write every raw figure to FILE")
    ap.add_argument("--counts", default="1,4", metavar="A,B",
                    help="the two shard counts compared on one Redis")
    ap.add_argument("--no-cluster", action="store_true", help="skip the 3-master cluster's memory run")
    args = ap.parse_args(argv)
    counts = tuple(int(c) for c in args.counts.split(","))
    if len(counts) != 2:
        ap.error("--counts takes two shard counts, e.g. 1,16")
    rounds, n_enqueue, n_life, n_cluster = (3, 20_000, 5_000, 30_000) if args.quick else (9, 50_000, 10_000,
                                                                                           300_000)
    single = single_redis(rounds, n_enqueue, n_life, counts)  # type: ignore[arg-type]
    cluster = None if args.no_cluster else cluster_memory(n_cluster)
    print(render(single, cluster))
    if args.json:
        Path(args.json).write_text(json.dumps({"single": single, "cluster": cluster}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
