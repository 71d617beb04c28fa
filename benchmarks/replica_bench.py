"""What ``CELERY_HA_MIN_REPLICAS`` costs: task lifecycles per second with and without WAIT.

Starts a master and one replica (real redis-server processes on loopback), then runs the standalone
lifecycle (``claim_next`` once, then ``complete_and_claim`` per task) over the same number of tasks
with ``min_replicas=0`` (asynchronous replication) and ``min_replicas=1`` (each transition waits
until the replica holds it), alternating rounds, one thread and 4 processes. Ratios are in the same
run, so the machine's speed cancels out.

    python benchmarks/replica_bench.py [--tasks 4000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_ha import TaskQueue
from celery_ha.runtime.redis_process import RedisProcess, free_port


def _drain(url: str, namespace: str, min_replicas: int, worker: str) -> int:
    client = redis.Redis.from_url(url, decode_responses=True)
    q = TaskQueue(client, namespace, min_replicas=min_replicas, replica_timeout=1.0)
    done = 0
    lease = q.claim_next(worker)
    while lease is not None:
        lease = q.complete_and_claim(lease)
        done += 1
    return done


def _run(url: str, tasks: int, min_replicas: int, procs: int, tag: str) -> float:
    client = redis.Redis.from_url(url, decode_responses=True)
    namespace = f"bench-{tag}"
    TaskQueue(client, namespace).enqueue_many([f"https://example.com/{tag}/{n}" for n in range(tasks)])
    started = time.perf_counter()
    if procs == 1:
        done = _drain(url, namespace, min_replicas, "w0")
    else:
        with mp.get_context("fork").Pool(procs) as pool:
            done = sum(pool.starmap(_drain, [(url, namespace, min_replicas, f"w{i}") for i in range(procs)]))
    elapsed = time.perf_counter() - started
    assert done == tasks, (done, tasks)
    return tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    master = RedisProcess(port=free_port(), data_dir=tmp / "m").start()
    replica = RedisProcess(port=free_port(), data_dir=tmp / "r",
                           extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        probe = redis.Redis(port=replica.port)
        deadline = time.monotonic() + 10
        while probe.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise SystemExit("the replica did not sync")
            time.sleep(0.05)
        version = redis.Redis(port=master.port).info()["redis_version"]
        print(f"Redis {version}, 1 replica on loopback, {args.tasks} tasks per run, {args.rounds} rounds")
        print("| workers | async tasks/s | WAIT 1 tasks/s | WAIT / async |")
        print("|---:|---:|---:|---:|")
        for procs in (1, 4):
            fast, waited = [], []
            for rnd in range(args.rounds):
                fast.append(_run(master.url, args.tasks, 0, procs, f"a{procs}{rnd}"))
                waited.append(_run(master.url, args.tasks, 1, procs, f"w{procs}{rnd}"))
            a, w = statistics.median(fast), statistics.median(waited)
            kind = "thread" if procs == 1 else "processes"
            print(f"| {procs} {kind} | {a:,.0f} | {w:,.0f} | {w / a:.2f} |")
    finally:
        replica.stop()
        master.stop()


if __name__ == "__main__":
    main()
