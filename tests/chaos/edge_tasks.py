"""Durable tasks of the crash edge-case tests (``test_batch_time_limit.py``), imported by the workers
through ``CELERY_HA_EXTRA_IMPORTS=tests.chaos.edge_tasks``.

Each run records itself in the state Redis, outside celery-ha's own keys (``<namespace>:runs:<id>``:
one ``pid start end`` entry per run, the end written when the function returns), so a test sees every
run of an id and when it ran, also a run whose completion was refused."""

from __future__ import annotations

import os
import time

import redis

from celery_ha.integration import DurableContext, durable_task

_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["CELERY_HA_REDIS_URL"])
    return _client


def runs_key(namespace: str, task_id: str) -> str:
    return f"{namespace}:runs:{task_id}"


@durable_task(name="edge_timed")
def timed(ctx: DurableContext) -> None:
    """``meta.hang``: on its first run, loop past every time limit, swallowing the soft limit's
    exception (as crawl code that catches Exception does); otherwise sleep ``meta.sleep`` seconds.
    Each run is recorded."""
    r, key = _redis(), runs_key(os.environ["CELERY_HA_NAMESPACE"], ctx.task_id)
    r.rpush(key, f"{os.getpid()} start {time.time():.3f}")
    if ctx.meta.get("hang") and r.set(f"{key}:hung", 1, nx=True):
        while True:
            try:
                time.sleep(0.05)
            except Exception:  # the point of this task
                pass
    deadline = time.monotonic() + float(ctx.meta.get("sleep", 0))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    r.rpush(key, f"{os.getpid()} end {time.time():.3f}")
