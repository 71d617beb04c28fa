"""Durable tasks used only by the Celery integration tests (the worker imports this module through
``CELERY_HA_EXTRA_IMPORTS=tests.support.celery_tasks``)."""

from __future__ import annotations

import os
import signal

from celery_ha.integration import DurableContext, durable_task


@durable_task(name="test_steps")
def steps(ctx: DurableContext) -> None:
    """``meta.n`` steps; each GETs ``<url>/<i>`` (observable in the site log), emits one item and
    checkpoints, so a re-run resumes exactly after the last finished step."""
    n = int(ctx.meta["n"])
    start = int((ctx.checkpoint or {}).get("i", 0))
    for i in range(start, n):
        ctx.fetch(f"{ctx.url}/{i}")
        ctx.emit({"task": ctx.task_id, "i": i, "attempt": ctx.attempt}, key=f"{ctx.task_id}:{i}")
        ctx.save_checkpoint({"i": i + 1})


@durable_task(name="test_suicide")
def suicide(ctx: DurableContext) -> None:
    """A poison pill: kills its own pool process every time it runs."""
    ctx.fetch(ctx.url)
    os.kill(os.getpid(), signal.SIGKILL)


@durable_task(name="test_marker")
def marker(ctx: DurableContext) -> None:
    """Fetch (slowly), then emit an item keyed by the lease token: a stale holder's write would show
    up as a second key."""
    ctx.fetch(ctx.url)
    ctx.emit({"token": ctx.lease.token, "pid": os.getpid()}, key=f"run-{ctx.lease.token}")
