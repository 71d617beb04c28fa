"""What a scheduled finished URL costs in Redis, by key kind (issue 30 item 2: ≤ 120 B, as a queued task).

One redis-server of its own (free loopback port, no persistence, ``hash-max-listpack-value 256`` as
README "Limits" asks). Per size N: N URLs of ~60 characters over 1,000 hosts of one task under a weekly
schedule are enqueued, then drained through ``claim_next`` + ``complete_and_claim`` (the real
completion path: each completion schedules the next run and keeps the record); ``used_memory`` per URL
before (queued) and after (waiting for the scheduled run), and ``MEMORY USAGE`` summed per key kind
(``t`` the record buckets, ``rfb`` the refetch index, ``d`` remembered ids, ``refetch`` the index of
earlier releases).

    python benchmarks/scheduled_memory_bench.py --sizes 200000,1000000 --task fetch_page --task page
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, find_redis_server, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402


def url(i: int) -> str:
    return f"https://shop-{i % 1000:03d}.example.com/catalog/items/{i:010d}?ref=list"


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def run(r: redis.Redis, n: int, task: str) -> dict[str, Any]:
    r.flushall()
    q = TaskQueue(r, "sched", history_max=1000)
    q.set_schedule(task, every="1w")
    base = used(r)
    for start in range(0, n, 10_000):
        q.enqueue_many([url(i) for i in range(start, min(n, start + 10_000))], task=task)
    queued = (used(r) - base) / n
    lease, done = q.claim_next("bench:1"), 0
    while lease is not None:
        done += 1
        lease = q.complete_and_claim(lease)
    assert done == n, f"completed {done} of {n}"
    parts: collections.Counter[str] = collections.Counter()
    for key in r.scan_iter(count=5000):
        name = key.split("}:", 1)[-1]
        parts[name.split(":")[0]] += r.memory_usage(key, samples=0) or 0
    return {"n": n, "task": task, "bytes_per_queued_task": round(queued, 1),
            "bytes_per_scheduled_finished_url": round((used(r) - base) / n, 1),
            "by_kind": {k: round(v / n, 1) for k, v in parts.most_common() if v / n >= 0.05},
            "waiting": q.refetch_pending()["waiting"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="200000", help="comma-separated N (default 200000)")
    ap.add_argument("--task", action="append",
                    help="task name (repeatable; default fetch_page, which a record leaves out)")
    ap.add_argument("--redis-server", default=None, help="redis-server binary (default: the one found)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    server = RedisProcess(free_port(), binary=args.redis_server or find_redis_server()).start()
    try:
        r = redis.Redis(port=server.port, decode_responses=True)
        r.config_set("hash-max-listpack-value", 256)
        version = r.info("server")["redis_version"]
        results = []
        for n in (int(x) for x in args.sizes.split(",")):
            for task in args.task or ["fetch_page"]:
                out = run(r, n, task)
                out["redis"] = version
                print(json.dumps(out), flush=True)
                results.append(out)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
