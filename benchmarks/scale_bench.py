"""Tens of millions of URLs (issue 30, item 6): what one Redis pays per queued task and per remembered
URL, and whether the lifecycle and the scripts stay flat as the backlog grows; side by side with
scrapy-redis's structures in the same run, on the same server.

One redis-server of its own (free loopback port, no persistence). For each ``--sizes`` N, on an empty
server:

1. **Enqueue** N URLs (~60 characters, 1,000 hosts) through ``TaskQueue.enqueue_many`` (its default
   batch, or ``--enqueue-batch``; dedup on, host gate off): tasks/s, Redis ``used_memory`` per queued
   task (``INFO memory`` before and after), and the enqueue script calls over 10 ms (``SLOWLOG``,
   threshold 10 ms) against the number of calls (``INFO commandstats``).
2. **Lifecycles at depth**: ``--lifecycles`` claim_next + complete pairs on that backlog, timed one by
   one from the client (median, p99), with Redis CPU per lifecycle from the ``used_cpu_user`` +
   ``used_cpu_sys`` delta and from the scripts' own ``usec`` in ``INFO commandstats``; the script calls
   over 10 ms while draining.
   Then 20 tasks still queued at the back of their band are claimed by id (what a Celery message for a
   queued, not dispatched, task does): latency and slow calls. Then the operator's reads at that
   depth (``stats``, pages of ``tasks --state``, ``dead list``, ``get_many``, an ``export`` of the
   1,000 items of 1,000 more completions, and with ``--gated`` ``hosts list``), median of 5.
3. **Remembered URLs**: N finished dedup ids written as a completion writes them (the real completion
   path is timed in 2; this fills the dedup memory of N finished tasks whose records the bounded
   history already dropped: the bucket, 7-byte field and completion hour of ``_remembered.lua``, via
   ``done_times.done_slot``, pipelined), ``used_memory`` delta per URL, and the encodings of a sample
   of buckets (listpack/ziplist while under hash-max-listpack-entries). ``--check-remembered`` also
   drains a whole backlog of that size through claim_next/complete and reports the same delta
   measured for real. Beside it, the layout before (the sorted set ``done``: id -> completion ms,
   one ZADD per id), for comparison. ``--only-remembered`` runs this phase alone (10M in minutes).
4. **Baseline, scrapy-redis's structures**: the dupefilter's set (``SADD`` of the 40-hex SHA1
   fingerprint per seen URL) and the PriorityQueue (a ``ZSET`` of pickled request dicts, score =
   -priority), N each, pipelined 1,000 per round trip; bytes per entry, the rate, and the latency of
   its pop (``MULTI; ZRANGE 0 0; ZREMRANGEBYRANK 0 0; EXEC``) at depth.

    python benchmarks/scale_bench.py --sizes 100000,1000000 --json /tmp/scale.json

``--gated`` switches the host gate on before the enqueue: every task waits in its host's queue (1,000
hosts, no limits) and the lifecycles take them through the gate; ``hosts list`` joins the reads.

The machine has 2 cores shared with other sessions: run it more than once and read the medians.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from celery_ha.state.done_times import DONE_EPOCH_MS, HOUR_MS, done_bit, done_slot  # noqa: E402
from celery_ha.state.ids import task_id_for  # noqa: E402
from celery_ha.state.listing import list_tasks  # noqa: E402
from celery_ha.state.sink import iter_items  # noqa: E402

NS = "scale"
TASK = "celery_ha.crawl"
SLOW_US = 10_000  # the SLOWLOG threshold: 10 ms


def url(i: int) -> str:
    """A ~60-character URL: 1,000 hosts, one path per task."""
    return f"https://shop-{i % 1000:03d}.example.com/catalog/items/{i:010d}?ref=list"


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def script_stats(r: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of every script command (EVAL, EVALSHA, FCALL) since the last CONFIG RESETSTAT."""
    calls = usec = 0
    for name, row in r.info("commandstats").items():
        if name.split("_", 1)[-1] in ("eval", "evalsha", "fcall", "evalsha_ro", "eval_ro"):
            calls += int(row["calls"])
            usec += int(row["usec"])
    return calls, usec


def reset(r: redis.Redis) -> None:
    r.config_resetstat()
    r.slowlog_reset()


def slow(r: redis.Redis) -> dict[str, Any]:
    """Script calls over the threshold since the last reset: count and the slowest (ms)."""
    durations = [int(e["duration"]) for e in r.slowlog_get(100_000)]
    return {"over_10ms": len(durations), "max_ms": round(max(durations) / 1000, 1) if durations else 0.0}


def sched_of(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns waiting on a run queue) of redis-server's main thread so far
    (``/proc/<pid>/task/<pid>/schedstat``): whether a slow call ran or waited for a CPU."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(on_cpu), int(waiting)


def enqueue_traced(r: redis.Redis, q: TaskQueue, n: int, batch: int, pid: int) -> dict[str, Any]:
    """Enqueue n URLs one script call at a time (``batch`` rows each), reading redis-server's
    scheduler counters around every call: each call during which redis-server's main thread spent
    over 10 ms on a CPU or waiting for one is reported with both times, the client's wall time, the
    records' bucket geometry and ``used_memory``. Mostly CPU: the call was long in Redis; mostly
    waiting: redis-server was preempted (the slow log counts both)."""
    slow_calls: list[dict[str, Any]] = []
    calls = 0
    for start in range(0, n, batch):
        urls = [url(i) for i in range(start, min(n, start + batch))]
        cpu0, wait0 = sched_of(pid)
        t = time.perf_counter()
        q.enqueue_many(urls, task=TASK, batch_size=batch)
        wall = time.perf_counter() - t
        cpu1, wait1 = sched_of(pid)
        calls += 1
        if (cpu1 - cpu0 + wait1 - wait0) / 1000 > SLOW_US:
            level, split = r.hmget(q.keys.record_geometry, ["l", "s"])
            slow_calls.append({"at": start, "wall_ms": round(wall * 1000, 2),
                               "redis_cpu_ms": round((cpu1 - cpu0) / 1e6, 2),
                               "redis_waiting_ms": round((wait1 - wait0) / 1e6, 2),
                               "level": level, "split": split, "used_mb": used_memory(r) // 2**20})
    return {"calls": calls, "over_10ms_in_redis": len(slow_calls),
            "of_which_cpu_over_10ms": sum(1 for c in slow_calls if c["redis_cpu_ms"] > SLOW_US / 1000),
            "slow_calls": slow_calls}


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def bench_size(r: redis.Redis, raw: redis.Redis, n: int, lifecycles: int, check_remembered: bool,
               batch: int | None, only_remembered: bool = False, only_enqueue: bool = False,
               redis_pid: int | None = None, gated: bool = False, baselines: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "gated": gated}
    r.flushall()
    q = TaskQueue(r, NS, history_max=10_000)
    if gated:
        q.hosts.switch(True)
    if only_remembered:
        return bench_remembered(r, raw, q, n, check_remembered, out)
    base = used_memory(r)
    reset(r)
    t0 = time.perf_counter()
    chunk = 100_000
    if redis_pid is not None:
        out["traced"] = enqueue_traced(r, q, n, batch or 250, redis_pid)
        chunk = n  # done
    for start in range(0, n if redis_pid is None else 0, chunk):
        urls = [url(i) for i in range(start, min(n, start + chunk))]
        if batch:
            q.enqueue_many(urls, task=TASK, batch_size=batch)
        else:
            q.enqueue_many(urls, task=TASK)  # the library's default batch
    wall = time.perf_counter() - t0
    calls, usec = script_stats(r)
    out["enqueue"] = {"per_s": round(n / wall), "script_calls": calls,
                      "script_ms_mean": round(usec / max(calls, 1) / 1000, 2), **slow(r)}
    out["bytes_per_queued"] = round((used_memory(r) - base) / n, 1)
    print(f"  {n:,}: enqueue {out['enqueue']}, {out['bytes_per_queued']} B/queued task", flush=True)
    if only_enqueue:
        return out

    # Lifecycles at depth.
    reset(r)
    c0 = cpu(r)
    lat = []
    for _ in range(lifecycles):
        t = time.perf_counter()
        lease = q.claim_next("w1")
        assert lease is not None
        q.complete(lease)
        lat.append(time.perf_counter() - t)
    c1 = cpu(r)
    calls, usec = script_stats(r)
    out["lifecycle"] = {"median_us": round(statistics.median(lat) * 1e6),
                        "p99_us": round(pct(lat, 0.99) * 1e6),
                        "redis_cpu_us": round((c1 - c0) / lifecycles * 1e6),
                        "script_us": round(usec / lifecycles), **slow(r)}
    print(f"  {n:,}: lifecycle {out['lifecycle']}", flush=True)
    # A message claiming a task still queued (not dispatched), deep in its band: the last ones queued.
    reset(r)
    lat = []
    for i in range(n - 20, n):
        t = time.perf_counter()
        lease = q.claim(task_id_for(TASK, url(i)), "w1")
        lat.append(time.perf_counter() - t)
        assert lease is not None
        q.complete(lease)
    out["claim_queued"] = {"median_us": round(statistics.median(lat) * 1e6),
                           "max_us": round(max(lat) * 1e6), **slow(r)}
    print(f"  {n:,}: direct claim of a queued task {out['claim_queued']}", flush=True)
    out["stats_queued"] = q.stats()["queued"]
    assert out["stats_queued"] == n - lifecycles - 20, out["stats_queued"]
    out["reads_ms"] = operator_reads(q, n)
    print(f"  {n:,}: operator reads (ms, median of 5) {out['reads_ms']}", flush=True)

    if not baselines:
        r.flushall()
        return out
    bench_remembered(r, raw, q, n, check_remembered, out)

    # Baseline: scrapy-redis's structures on the same server.
    out["scrapy_redis"] = scrapy_redis(raw, n, lifecycles)
    print(f"  {n:,}: scrapy-redis {out['scrapy_redis']}", flush=True)
    r.flushall()
    return out


def operator_reads(q: TaskQueue, n: int) -> dict[str, float]:
    """What the operator's verbs cost at this depth, from the client (median of 5, ms): ``stats``,
    a first and a deep page of ``tasks --state queued`` / ``completed``, ``dead list`` with 1,000
    dead letters, a page of ``get_many``, ``export`` of 1,000 items (``celery-ha export`` reads the
    sink so), and ``hosts list`` (its first 50 by queued, as the CLI's default; gate on only)."""
    ids = [task_id_for(TASK, url(i)) for i in range(n - 1_020, n - 20)]
    for tid in ids:  # 1,000 dead letters, taken straight from the queue
        q.cancel(tid, "bench")
    for i in range(1_000):  # 1,000 more completions, each with one item for the export
        lease = q.claim_next("w1")
        assert lease is not None
        q.commit(lease, [(f"item-{i}", {"url": url(i), "title": f"page {i}", "price": i})])
        q.complete(lease)
    calls = {
        "stats": lambda: q.stats(),
        "tasks_queued_first_page": lambda: list_tasks(q, "queued", limit=50),
        "tasks_queued_page_at_half": lambda: list_tasks(q, "queued", limit=50, offset=n // 2),
        "tasks_completed_first_page": lambda: list_tasks(q, "completed", limit=50),
        "dead_list_100": lambda: q.dead(limit=100),
        "get_many_50": lambda: q.get_many(ids[:50]),
        "export_1000_items": lambda: sum(1 for _ in iter_items(q.client, NS)),
    }
    if q.hosts.enabled():
        calls["hosts_list"] = lambda: q.hosts.list(sort="queued", limit=50)
    out = {}
    for name, call in calls.items():
        samples = []
        for _ in range(5):
            t = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t) * 1000)
        out[name] = round(statistics.median(samples), 2)
    return out


def bench_remembered(r: redis.Redis, raw: redis.Redis, q: TaskQueue, n: int, check_remembered: bool,
                     out: dict[str, Any]) -> dict[str, Any]:
    """Remembered (finished, dedup-only) URLs, written as complete_task writes them; then the sorted
    set of the layout before, on the same ids."""
    r.flushall()
    base = used_memory(r)
    reset(r)
    fill_remembered(raw, q, n)
    out["bytes_per_remembered"] = round((used_memory(r) - base) / n, 1)
    out["remember_fill"] = slow(r)
    out["buckets"] = bucket_shape(raw, q)
    print(f"  {n:,}: {out['bytes_per_remembered']} B/remembered URL; buckets {out['buckets']}", flush=True)
    r.flushall()
    base = used_memory(r)
    fill_zset(r, q, n)
    out["bytes_per_remembered_zset"] = round((used_memory(r) - base) / n, 1)
    print(f"  {n:,}: {out['bytes_per_remembered_zset']} B/remembered URL in the sorted set before",
          flush=True)
    r.flushall()
    if check_remembered:
        out["remembered_real"] = drain_real(r, q, n)
        print(f"  {n:,}: drained for real: {out['remembered_real']}", flush=True)
    return out


def fill_remembered(raw: redis.Redis, q: TaskQueue, n: int) -> None:
    """The dedup memory of n finished tasks as ``remember()`` in _remembered.lua writes it: each id's
    7-byte field in its bucket, the value the completion hour; the bucket's bit in the bitmap ``dk``;
    and the count in stats."""
    hour = (int(time.time() * 1000) - DONE_EPOCH_MS) // HOUR_MS
    pipe = raw.pipeline(transaction=False)
    bits: set[int] = set()
    for i in range(n):
        tid = task_id_for(TASK, url(i))
        pipe.hset(*done_slot(q.keys.prefix, tid), hour)
        bit = done_bit(tid)
        if bit is not None and bit not in bits:
            bits.add(bit)
            pipe.setbit(q.keys.prefix + "dk", bit, 1)
        if i % 1000 == 999:
            pipe.execute()
    pipe.hincrby(q.keys.stats, "remembered", n)
    pipe.execute()


def bucket_shape(raw: redis.Redis, q: TaskQueue) -> dict[str, Any]:
    """How many buckets, their encodings (a hashtable one, past hash-max-listpack-entries, costs
    several times a listpack's) and the largest bucket's length."""
    names = list(raw.scan_iter(match=q.keys.prefix + "d:*", count=1000))
    encodings: dict[str, int] = {}
    largest = 0
    for start in range(0, len(names), 1000):
        pipe = raw.pipeline(transaction=False)
        for key in names[start:start + 1000]:
            pipe.object("encoding", key)
            pipe.hlen(key)
        replies = pipe.execute()
        for enc, length in zip(replies[::2], replies[1::2], strict=True):
            enc = enc.decode() if isinstance(enc, bytes) else str(enc)
            encodings[enc] = encodings.get(enc, 0) + 1
            largest = max(largest, int(length))
    return {"count": len(names), "encodings": encodings, "largest": largest}


FILL_LUA = """
local now = redis.call('TIME')
local ms = string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000))
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], ms, ARGV[i]) end
return #ARGV
"""


def fill_zset(r: redis.Redis, q: TaskQueue, n: int) -> None:
    """The layout before: the dedup ids in the sorted set `done` with the completion time (ms), one
    ZADD per id as complete_task did."""
    fill = r.register_script(FILL_LUA)
    chunk: list[str] = []
    for i in range(n):
        chunk.append(task_id_for(TASK, url(i)))
        if len(chunk) == 1000:
            fill(keys=[q.keys.done], args=chunk)
            chunk = []
    if chunk:
        fill(keys=[q.keys.done], args=chunk)


def drain_real(r: redis.Redis, q: TaskQueue, n: int) -> dict[str, Any]:
    """Enqueue n URLs and finish every one through claim_next/complete (history bounded at 10,000):
    what is left beyond the history's records is the dedup memory of n finished tasks."""
    r.flushall()
    q.enqueue_many([url(i) for i in range(n)], task=TASK)
    reset(r)
    while (lease := q.claim_next("w1")) is not None:
        q.complete(lease)
    drained = slow(r)
    # The bounded history still holds 10,000 completed records: forget them to leave dedup only.
    k = q.keys
    r.delete(k.tasks, k.record_geometry, *r.scan_iter(match=k.prefix + "t:*", count=1000))  # records
    r.delete(k.completed, k.hist, k.stats)
    after = used_memory(r)
    r.flushall()
    empty = used_memory(r)
    return {"bytes_per_remembered": round((after - empty) / n, 1), "drain": drained}


def scrapy_request(u: str) -> dict[str, Any]:
    """What scrapy's Request.to_dict() gives for a plain GET request (scrapy-redis pickles it)."""
    return {"url": u, "callback": "parse", "errback": None, "headers": {}, "method": "GET", "body": b"",
            "cookies": {}, "meta": {}, "encoding": "utf-8", "priority": 0, "dont_filter": False,
            "flags": [], "cb_kwargs": {}, "_class": "scrapy.http.request.Request"}


def scrapy_redis(r: redis.Redis, n: int, pops: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    r.flushall()
    base = used_memory(r)
    t0 = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.sadd("spider:dupefilter", hashlib.sha1(url(i).encode()).hexdigest())
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    out["seen_per_s"] = round(n / (time.perf_counter() - t0))
    out["bytes_per_seen"] = round((used_memory(r) - base) / n, 1)
    r.flushall()
    base = used_memory(r)
    t0 = time.perf_counter()
    for i in range(n):
        pipe.zadd("spider:requests", {pickle.dumps(scrapy_request(url(i)), protocol=-1): 0})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    out["queue_per_s"] = round(n / (time.perf_counter() - t0))
    out["bytes_per_queued"] = round((used_memory(r) - base) / n, 1)
    lat = []
    for _ in range(pops):
        t = time.perf_counter()
        p = r.pipeline(transaction=True)
        p.zrange("spider:requests", 0, 0)
        p.zremrangebyrank("spider:requests", 0, 0)
        got, _ = p.execute()
        assert got
        lat.append(time.perf_counter() - t)
    out["pop_median_us"] = round(statistics.median(lat) * 1e6)
    out["pop_p99_us"] = round(pct(lat, 0.99) * 1e6)
    r.flushall()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated backlog sizes")
    ap.add_argument("--lifecycles", type=int, default=20_000, help="claim+complete pairs timed per size")
    ap.add_argument("--check-remembered", action="store_true",
                    help="also drain a whole backlog of each size for real (slow: ~0.5 ms per task)")
    ap.add_argument("--enqueue-batch", type=int, help="enqueue_many's batch_size (default: its own)")
    ap.add_argument("--only-remembered", action="store_true",
                    help="measure only the memory of remembered URLs (phase 3)")
    ap.add_argument("--redis-server", help="the redis-server binary (default: the one on PATH)")
    ap.add_argument("--only-enqueue", action="store_true",
                    help="measure only the enqueue (phase 1: rate, memory, slow calls)")
    ap.add_argument("--task", default="celery_ha.crawl",
                    help="the task name of every enqueued task (default celery_ha.crawl; a record leaves out "
                         "the name fetch_page)")
    ap.add_argument("--listpack-value", type=int, default=0,
                    help="hash-max-listpack-value of its server (0: the server's default, 64): records "
                         "longer than it make their bucket an ordinary hash (README 'Limits')")
    ap.add_argument("--sched", action="store_true",
                    help="enqueue one script call at a time and report each call over 10 ms with "
                         "redis-server's CPU and run-queue time during it (Linux /proc)")
    ap.add_argument("--gated", action="store_true",
                    help="host gate on: tasks wait in their host's queue (1,000 hosts); adds `hosts list`")
    ap.add_argument("--no-baselines", action="store_true",
                    help="skip phases 3 and 4 (remembered URLs, scrapy-redis's structures)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    global TASK
    TASK = args.task
    binary = args.redis_server or shutil.which("redis-server") or ""
    srv = RedisProcess(port=free_port(), binary=binary, extra_args=["--slowlog-log-slower-than", str(SLOW_US),
                                                     "--slowlog-max-len", "100000"]).start()
    try:
        r = redis.Redis(host=srv.host, port=srv.port, decode_responses=True)
        raw = redis.Redis(host=srv.host, port=srv.port)  # pickles are bytes
        if args.listpack_value:
            r.config_set("hash-max-ziplist-value", args.listpack_value)  # its alias on 7.x
        info = r.info("server")
        results: dict[str, Any] = {"redis": info["redis_version"], "load_at_start": os.getloadavg()[0],
                                   "task": TASK,
                                   "listpack_value": int(r.config_get("hash-max-ziplist-value")
                                                         ["hash-max-ziplist-value"]),
                                   "sizes": []}
        print(f"redis {info['redis_version']} on port {srv.port}; load {os.getloadavg()}", flush=True)
        for n in (int(s) for s in args.sizes.split(",")):
            results["sizes"].append(bench_size(r, raw, n, args.lifecycles, args.check_remembered,
                                               args.enqueue_batch, args.only_remembered, args.only_enqueue,
                                               srv.proc.pid if args.sched and srv.proc else None,
                                               args.gated, not args.no_baselines))
        results["load_at_end"] = os.getloadavg()[0]
        print(json.dumps(results, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
