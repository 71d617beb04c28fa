"""Refetch schedules at depth (issue 31): what the sweep pays with N remembered URLs, and what a
scheduled finished URL costs in memory.

One redis-server of its own (free loopback port, no persistence). For each ``--sizes`` N, on an empty
server:
1. N URLs (~60 characters) of task ``page`` under a weekly schedule are enqueued and drained through
   ``claim_next`` + ``complete_and_claim`` (the real completion path): each completion schedules a
   run a week later and keeps the record. ``used_memory`` per scheduled finished URL (its record, its
   ``refetch`` entry, its dedup id). Then ``--plain`` N more URLs of a task without schedule, the
   same way: bytes per remembered URL without a schedule.
2. **The sweep's cost at depth**: ``refetch_due`` and ``forget_finished`` with nothing due (what
   every sweep pays), timed ``--rounds`` times (median).
3. **Due runs**: ``--due`` tasks of task ``list`` under a 1-second schedule are completed, the bench
   waits until they are due, then ``refetch_due`` queues them (its default, 250 per script call): ms per call,
   µs per run queued, and the script calls over 10 ms (``SLOWLOG``), with the N others remembered.

    python benchmarks/refetch_bench.py --sizes 100000,1000000 --json /tmp/refetch.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402

NS = "refetch"
SLOW_US = 10_000


def url(i: int, kind: str = "items") -> str:
    return f"https://shop-{i % 1000:03d}.example.com/catalog/{kind}/{i:010d}?ref=list"


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def drain(q: TaskQueue, n: int) -> float:
    """Claim and complete ``n`` queued tasks through the completion path; returns seconds."""
    started = time.perf_counter()
    lease = q.claim_next("bench:1")
    done = 0
    while lease is not None and done < n:
        done += 1
        lease = q.complete_and_claim(lease)
        if done % 100_000 == 0:
            print(f"    completed {done:,}", flush=True)
    assert done == n, f"completed {done} of {n}"
    return time.perf_counter() - started


def fill(q: TaskQueue, n: int, task: str, kind: str) -> None:
    for start in range(0, n, 10_000):
        q.enqueue_many([url(i, kind) for i in range(start, min(n, start + 10_000))], task=task)


def timed(fn: Any, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(samples), 3)


def run_size(r: redis.Redis, n: int, plain: int, due: int, rounds: int) -> dict[str, Any]:
    r.flushall()
    q = TaskQueue(r, NS, history_max=10_000)
    q.set_schedule("page", every="1w")
    q.set_schedule("list", every=1)
    out: dict[str, Any] = {"n": n}
    before = used_memory(r)
    fill(q, n, "page", "items")
    seconds = drain(q, n)
    out["lifecycle_us"] = round(seconds / n * 1e6, 1)
    out["bytes_per_scheduled_finished_url"] = round((used_memory(r) - before) / n, 1)
    if plain:
        before = used_memory(r)
        fill(q, plain, "other", "plain")
        drain(q, plain)
        out["bytes_per_plain_remembered_url"] = round((used_memory(r) - before) / plain, 1)
    assert q.refetch_pending()["waiting"] == n
    out["sweep_refetch_due_idle_ms"] = timed(lambda: q.refetch_due(), rounds)
    out["sweep_forget_finished_idle_ms"] = timed(lambda: q.forget_finished(), rounds)
    # Due runs among the N remembered ones.
    fill(q, due, "list", "lists")
    drain(q, due)
    deadline = time.monotonic() + 30
    while q.refetch_pending()["due"] < due and time.monotonic() < deadline:
        time.sleep(0.05)
    r.config_set("slowlog-log-slower-than", SLOW_US)
    r.slowlog_reset()
    calls, queued, spent = 0, 0, 0.0
    while queued < due:
        t = time.perf_counter()
        got = q.refetch_due(max_calls=1)
        spent += time.perf_counter() - t
        calls += 1
        queued += got
        assert got, "no due run queued"
    out["due_per_call_ms"] = round(spent / calls * 1000, 3)
    out["due_per_run_us"] = round(spent / queued * 1e6, 1)
    out["due_calls_over_10ms"] = sum(1 for e in r.slowlog_get(1000) if e["duration"] >= SLOW_US)
    out["due_calls"] = calls
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="Remembered URLs per run.")
    parser.add_argument("--plain", type=int, default=100_000, help="Unscheduled URLs finished too.")
    parser.add_argument("--due", type=int, default=10_000, help="Runs made due and queued.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", help="Write the results there.")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="refetch-bench-"))
    server = RedisProcess(port=free_port(), data_dir=data, binary=shutil.which("redis-server") or "",
                          extra_args=["--save", ""]).start()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        print(f"redis {r.info('server')['redis_version']}", flush=True)
        results = [run_size(r, int(n), args.plain, args.due, args.rounds) for n in args.sizes.split(",")]
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
