"""Durable tasks of the host-gate chaos runs (``test_host_slots_after_kill``, ``test_zombie_other_host``);
the workers import this module through ``CELERY_HA_EXTRA_IMPORTS``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery_ha.integration import DurableContext, durable_task


@durable_task(name="test_slow_page")
def slow_page(ctx: DurableContext) -> None:
    """GET the task's own page with the timeout ``meta.timeout`` ([connect, read] seconds), so how
    long a request may be in flight is known, and keep it."""
    connect, read = ctx.meta["timeout"]
    ctx.fetch(ctx.url, timeout=(float(connect), float(read)), conditional=False)
    ctx.emit({"url": ctx.url, "attempt": ctx.attempt}, key=ctx.url)


@durable_task(name="test_two_hosts")
def two_hosts(ctx: DurableContext) -> None:
    """GET the task's own page, then (on the first attempt after ``meta.pause`` seconds, the moment a
    test stops the process in: the file ``meta.pausing`` says it has begun) a page of another host,
    ``meta.other``, that names the lease's token: the other site's log then tells which run's request
    reached it."""
    ctx.fetch(ctx.url, conditional=False)
    if ctx.attempt == 1:
        Path(ctx.meta["pausing"]).write_text(str(os.getpid()))
        end = time.monotonic() + float(ctx.meta["pause"])
        while time.monotonic() < end:
            pass  # busy, not asleep: woken from a SIGSTOP, this thread holds the GIL and goes on at once,
            # ahead of the lease keeper's renewal (which would only make the zombie's next check fail)
    ctx.fetch(f"{ctx.meta['other']}?token={ctx.lease.token}", conditional=False)
    ctx.emit({"url": ctx.url, "token": ctx.lease.token}, key=ctx.url)


@durable_task(name="test_other_hosts")
def other_hosts(ctx: DurableContext) -> None:
    """GET each of ``meta.others`` (pages of hosts other than the task's own), in order."""
    for url in ctx.meta["others"]:
        ctx.fetch(url, conditional=False)
    ctx.emit({"url": ctx.url, "fetched": len(ctx.meta["others"])}, key=ctx.url)
