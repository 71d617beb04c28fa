"""Durable tasks used only by the Celery integration tests (the worker imports this module through
``CELERY_HA_EXTRA_IMPORTS=tests.support.celery_tasks``)."""

from __future__ import annotations

import os
import signal
import time

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


@durable_task(name="test_stubborn")
def stubborn(ctx: DurableContext) -> None:
    """Fetch, then run past every time limit, swallowing what is raised in it (crawl code often
    catches Exception, and with it the soft limit's SoftTimeLimitExceeded)."""
    ctx.fetch(ctx.url)
    while True:
        try:
            time.sleep(0.05)
        except Exception:  # the point of this task
            pass


@durable_task(name="test_marker")
def marker(ctx: DurableContext) -> None:
    """Fetch (slowly), then emit an item keyed by the lease token: a stale holder's write would show
    up as a second key."""
    ctx.fetch(ctx.url)
    ctx.emit({"token": ctx.lease.token, "pid": os.getpid()}, key=f"run-{ctx.lease.token}")


@durable_task(name="test_pid")
def pid(ctx: DurableContext) -> None:
    """Fetch, then emit the pool process's pid keyed by the task: which process ran each task."""
    ctx.fetch(ctx.url)
    ctx.emit({"pid": os.getpid()}, key=ctx.task_id)


@durable_task(name="test_die_once")
def die_once(ctx: DurableContext) -> None:
    """Killed (SIGKILL of its own pool process) on its first attempt; completes on the next, after
    queueing one child task (``meta.child``), whose trace continues this attempt's."""
    if ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.meta.get("child"):
        ctx.enqueue(ctx.meta["child"], task="test_marker")
    ctx.emit({"attempt": ctx.attempt}, key=ctx.task_id)


@durable_task(name="test_noop")
def noop(ctx: DurableContext) -> None:
    """Does nothing: the child task of ingestion tests, where only being queued and finished matters."""


@durable_task(name="test_fetch_then_fail")
def fetch_then_fail(ctx: DurableContext) -> None:
    """Fetch the task's own page and emit it; the first attempt then fails (after its fetch), so the
    validator that fetch saw must not be kept for the retry."""
    response = ctx.fetch(ctx.url)
    ctx.emit({"url": ctx.url, "body": response.text, "changed": ctx.changed}, key=ctx.url)
    if ctx.attempt == 1:
        raise RuntimeError("failed after the fetch")


@durable_task(name="test_list")
def list_page(ctx: DurableContext) -> None:
    """A list page read on a fixed schedule: fetched unconditionally, no items."""
    ctx.fetch(ctx.url, conditional=False)


@durable_task(name="test_pages_by_params")
def pages_by_params(ctx: DurableContext) -> None:
    """A list read through ``params``: its first page, then ``?page=2`` of the same URL (which is not
    the task's own page: its validators must neither be sent nor kept for it)."""
    first = ctx.fetch(ctx.url)
    second = ctx.fetch(ctx.url, params={"page": "2"})
    ctx.emit({"first": first.status_code, "second": second.status_code}, key=ctx.url)
