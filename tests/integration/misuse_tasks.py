"""Tasks of the misuse tests (``test_task_api_misuse.py``), imported by their workers through
``CELERY_HA_EXTRA_IMPORTS=tests.support.celery_tasks,tests.integration.misuse_tasks``."""

from __future__ import annotations

import datetime
import os

from celery import shared_task

from celery_ha.integration import DurableContext, durable_task
from celery_ha.redisio.client import redis_client

#: The state Redis list where :func:`plain` records each run (its argument), per namespace.
PLAIN_RUNS = "misuse-plain-runs:{namespace}"


@shared_task(name="misuse_plain")
def plain(arg: str) -> str:
    """A plain Celery task (no ``@durable_task``), as a team's existing task is: records each run."""
    client = redis_client(os.environ["CELERY_HA_REDIS_URL"])
    client.rpush(PLAIN_RUNS.format(namespace=os.environ["CELERY_HA_NAMESPACE"]), arg)
    return arg


@durable_task(name="misuse_emit_list")
def emit_list(ctx: DurableContext) -> None:
    ctx.emit(["not", "a", "dict"])  # type: ignore[arg-type]


@durable_task(name="misuse_emit_datetime")
def emit_datetime(ctx: DurableContext) -> None:
    ctx.emit({"url": ctx.url, "at": datetime.datetime.now()})


@durable_task(name="misuse_checkpoint_set")
def checkpoint_set(ctx: DurableContext) -> None:
    ctx.save_checkpoint({"seen": {1, 2}})
