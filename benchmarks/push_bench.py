"""What a completion and its refill message cost: the script's own push vs a publish from Python.

Per durable task a pool process ends with the completion script (items, completion, window refill)
and then one Celery message for the task the refill dispatched. This bench runs that pair from one
thread on a real Redis (state in db 0, broker in db 1, as ``e2e_bench.py``), in alternating blocks,
medians:

- ``publish``: ``complete_and_dispatch`` then ``publish_ids`` with a held producer (how a pool
  process sends the refill when the script cannot push it);
- ``script push``: ``complete_and_push`` with the :class:`ListPush` of
  :func:`celery_ha.integration.dispatch.script_push.script_push` (the script pushes the message itself).

Reported per task: the thread's CPU (``time.thread_time``), its wall time, the Redis server's CPU
(``/proc`` of its pid) and round trips (``total_reads_processed``). Every block claims and completes
tasks with one item each, as the e2e page task does.

    python benchmarks/push_bench.py                    # 12 rounds of 400 tasks per variant
    python benchmarks/push_bench.py --rounds 20 --tasks 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.e2e_bench import cpu_seconds  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402

NS = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=400, help="tasks per variant and round")
    parser.add_argument("--redis-server", help="redis-server binary (default: the one tests use)")
    args = parser.parse_args()
    extra = {"binary": args.redis_server} if args.redis_server else {}
    folder = Path(tempfile.mkdtemp(prefix="push-bench-"))
    server = RedisProcess(port=free_port(), data_dir=folder, **extra).start()
    base = server.url.rsplit("/", 1)[0]
    os.environ.update(CELERY_HA_REDIS_URL=f"{base}/0", CELERY_BROKER_URL=f"{base}/1", CELERY_HA_NAMESPACE=NS)
    from celery_ha.base.settings import Settings
    from celery_ha.celery_app import app
    from celery_ha.integration.core.queues import broker_queue
    from celery_ha.integration.core.services import Services
    from celery_ha.integration.dispatch.publisher import HeldProducer, publish_ids
    from celery_ha.integration.dispatch.pump import celery_priority, message_id
    from celery_ha.integration.dispatch.script_push import script_push
    from celery_ha.redisio.client import redis_client
    from celery_ha.state import TaskQueue

    settings = Settings.from_env()
    client = redis_client(settings.redis_url or "")
    q = TaskQueue(client, NS, lease_ttl=60)
    rt = Services(settings=settings, redis_url=str(settings.redis_url), client=client, queue=q)
    push = script_push(app, rt)
    assert push is not None, "the script push is off here"
    queue = broker_queue(NS)
    held = HeldProducer()
    producer = held.get(app)
    declare = held.declare(queue)
    state = redis.Redis.from_url(f"{base}/0")
    broker = redis.Redis.from_url(f"{base}/1")
    redis_pid = int(state.info("server")["process_id"])

    def publish(lease: Any) -> None:
        _, sent = q.complete_and_dispatch(lease, [("k" + lease.task_id, {"v": 1})], window=1)
        for d in sent or []:
            publish_ids(app, d.task, [d.task_id], queue=queue, priority=celery_priority(d.priority),
                        message_id=message_id(d.task_id), producer=producer, declare=declare)

    def pushed(lease: Any) -> None:
        done = q.complete_and_push(lease, [("k" + lease.task_id, {"v": 1})], window=1, push=push)
        assert not done.to_send and done.push_error is None

    variants = {"publish": publish, "script push": pushed}
    measured: dict[str, dict[str, list[float]]] = {name: {"cpu": [], "wall": [], "redis": [], "reads": []}
                                                   for name in variants}
    try:
        for round_no in range(args.rounds + 1):  # the first round warms up
            for name, finish in variants.items():
                state.flushall()
                ids = q.enqueue_many([f"https://example.com/p/{i}" for i in range(args.tasks + 1)],
                                     task="bench_page")
                q.dispatch(1)
                leases = []
                reads0 = int(state.info("stats")["total_reads_processed"])
                redis0, cpu0, wall0 = cpu_seconds(redis_pid), time.thread_time(), time.perf_counter()
                for tid in ids[:args.tasks]:
                    lease = q.claim(tid, "w")
                    finish(lease)
                    leases.append(lease)
                wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
                redis_cpu = cpu_seconds(redis_pid) - redis0
                reads = int(state.info("stats")["total_reads_processed"]) - reads0
                assert sum(broker.llen(k) for k in set(push.keys)) == args.tasks  # one message a task
                if round_no:
                    for key, value in (("cpu", cpu), ("wall", wall), ("redis", redis_cpu), ("reads", reads)):
                        measured[name][key].append(value / args.tasks * (1 if key == "reads" else 1e6))
    finally:
        held.release()
        server.stop()
    print(f"claim + completion + refill message per task, medians of {args.rounds} rounds of {args.tasks}:")
    base_figures = {key: statistics.median(values) for key, values in measured["publish"].items()}
    for name, figures in measured.items():
        line = []
        for key, unit in (("cpu", "us client CPU"), ("wall", "us wall"), ("redis", "us Redis CPU"),
                          ("reads", "round trips")):
            median = statistics.median(figures[key])
            line.append(f"{median:7.1f} {unit} ({median / base_figures[key]:.2f}x)")
        print(f"  {name:12} " + ", ".join(line))


if __name__ == "__main__":
    main()
