"""What one refill message costs its publisher: Celery's ``send_task`` as it ships vs celery-ha's publish.

A worker publishes one refill message per completed task, from the pool process that ran it, so the
client CPU of a publish is paid once per task. This bench sends messages of one task id each to a
real Redis broker from one thread and measures that thread's CPU per message (``time.thread_time``),
in alternating blocks, medians:

- ``send_task``: ``app.send_task`` with a producer kept across calls and task-sent events on (what
  the refill publish was before: the sent event is a second publish);
- ``no sent event``: the same without task-sent events (celery-ha's ``celeryconfig.py``);
- ``celery-ha``: :func:`celery_ha.integration.dispatch.publisher.publish_ids` with a
  :class:`~celery_ha.integration.dispatch.publisher.HeldProducer` (arguments' repr passed in, the queue bound
  once and passed as the declaration, no parent trail), as ``pump.send`` publishes.

    python benchmarks/publish_bench.py                 # 12 rounds of 400 messages per variant
    python benchmarks/publish_bench.py --rounds 20 --messages 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402

QUEUE = "bench.crawl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--messages", type=int, default=400, help="messages per variant and round")
    args = parser.parse_args()
    server = RedisProcess(port=free_port(), data_dir=Path(tempfile.mkdtemp(prefix="publish-bench-"))).start()
    base = server.url.rsplit("/", 1)[0]
    os.environ.update(CELERY_HA_REDIS_URL=f"{base}/0", CELERY_BROKER_URL=f"{base}/1",
                      CELERY_HA_NAMESPACE="bench")
    from celery_ha.celery_app import app
    from celery_ha.integration.dispatch.publisher import HeldProducer, publish_ids

    held = HeldProducer()
    producer = held.get(app)

    def plain(i: int) -> None:
        app.send_task("fetch_page", args=[f"id{i:09d}"], queue=QUEUE, priority=3, task_id=f"id{i:09d}.abcd",
                      producer=producer)

    def lean(i: int) -> None:
        publish_ids(app, "fetch_page", [f"id{i:09d}"], queue=QUEUE, priority=3, message_id=f"id{i:09d}.abcd",
                    producer=producer, declare=held.declare(QUEUE))

    variants: dict[str, tuple[bool, Callable[[int], None]]] = {
        "send_task (task-sent events on)": (True, plain),
        "send_task, no task-sent events": (False, plain),
        "celery-ha publish_ids": (False, lean),
    }
    measured: dict[str, list[float]] = {name: [] for name in variants}
    broker = app.connection_for_write().default_channel.client
    try:
        for round_no in range(args.rounds + 1):  # the first round warms up
            for name, (sent_events, publish) in variants.items():
                app.conf.task_send_sent_event = sent_events
                started = time.thread_time()
                for i in range(args.messages):
                    publish(i)
                cpu_us = (time.thread_time() - started) / args.messages * 1e6
                if round_no:
                    measured[name].append(cpu_us)
                broker.flushdb()
    finally:
        held.release()
        server.stop()
    reference = statistics.median(measured["send_task (task-sent events on)"])
    print(f"client CPU per message, medians of {args.rounds} rounds of {args.messages} (Redis broker):")
    for name, values in measured.items():
        median = statistics.median(values)
        print(f"  {name:34} {median:6.0f} us  ({median / reference:.2f}x)  "
              f"range {min(values):.0f}-{max(values):.0f}")


if __name__ == "__main__":
    main()
