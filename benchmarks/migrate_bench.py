"""``celery-ha migrate`` at scale (issue 30 item 4): how fast a namespace moves into one of another
shard count, against enqueueing the same tasks in the same run (the baseline: a migration is worth
it only while it costs about what filling the namespace again would).

    python benchmarks/migrate_bench.py --tasks 1000000                   # ungated, 1 -> 4 shards
    python benchmarks/migrate_bench.py --tasks 1000000 --gated --from-shards 2 --to-shards 4

On one redis-server (the one on PATH unless ``--redis-server``), no persistence, slow log at 10 ms:

1. enqueue N tasks (~60-character URLs, 1,000 hosts; ``--gated``: host gate on) with
   ``enqueue_many``'s default batches, and finish ``--finished`` of them (remembered URLs, the sink's
   items, the bounded history);
2. migrate into a new namespace (``state/migrate.Migration``, what the command runs);
3. report enqueue tasks/s, migration tasks/s and their ratio, the script calls over 10 ms during the
   migration (slow log: other clients wait behind each), and that the target holds every task.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from celery_ha.state.migrate import Migration  # noqa: E402

SLOW_US = 10_000


def url(i: int) -> str:
    """A ~60-character URL: 1,000 hosts, one path per task."""
    return f"https://shop-{i % 1000}.example.com/catalogue/item/{i:09d}?ref=list"


def run(r: redis.Redis, args: argparse.Namespace) -> dict[str, Any]:
    src = TaskQueue(r, "src", shards=args.from_shards, host_gate=args.gated, lease_ttl=3600)
    t0 = time.perf_counter()
    for start in range(0, args.tasks, 10_000):
        src.enqueue_many([url(i) for i in range(start, min(start + 10_000, args.tasks))])
    enqueue_s = time.perf_counter() - t0
    for _ in range(args.finished):
        lease = src.claim_next("w")
        src.commit(lease, [(lease.url, {"url": lease.url})])
        src.complete(lease)
    before = src.stats()
    r.slowlog_reset()
    t0 = time.perf_counter()
    report = Migration(r, "src", "dst", args.to_shards).run()
    migrate_s = time.perf_counter() - t0
    slow = r.slowlog_get(100_000)
    after = TaskQueue(r, "dst", shards=args.to_shards, host_gate=args.gated).stats()
    return {
        "tasks": args.tasks, "gated": args.gated,
        "from_shards": args.from_shards, "to_shards": args.to_shards,
        "enqueue_per_s": round(args.tasks / enqueue_s), "migrate_per_s": round(args.tasks / migrate_s),
        "migrate_s": round(migrate_s, 1), "ratio_migrate_to_enqueue": round(enqueue_s / migrate_s, 2),
        "slow_calls_over_10ms": len(slow),
        "max_call_ms": max((e["duration"] for e in slow), default=0) / 1000,
        "slow_commands": sorted({str(e["command"])[:40] for e in slow})[:10],
        "queued_before_after": [before["queued"], after["queued"]],
        "remembered_before_after": [before["remembered"], after["remembered"]],
        "report": report.as_dict(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--finished", type=int, default=2_000, help="tasks finished before the migration")
    ap.add_argument("--gated", action="store_true", help="host gate on (1,000 hosts)")
    ap.add_argument("--from-shards", type=int, default=1)
    ap.add_argument("--to-shards", type=int, default=4)
    ap.add_argument("--redis-server", help="the redis-server binary (default: the one on PATH)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    binary = args.redis_server or shutil.which("redis-server") or ""
    srv = RedisProcess(port=free_port(), binary=binary, extra_args=[
        "--slowlog-log-slower-than", str(SLOW_US), "--slowlog-max-len", "100000"]).start()
    try:
        r = redis.Redis(host=srv.host, port=srv.port, decode_responses=True)
        out = {"redis": r.info("server")["redis_version"], "load_at_start": os.getloadavg()[0],
               **run(r, args), "load_at_end": os.getloadavg()[0]}
        print(json.dumps(out, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
