"""The durable task of ``tests/chaos/test_migrated_source.py``: one item per run, keyed by the URL and
the lease's token, so a task that runs twice (in one namespace or in two) shows as two items."""

from __future__ import annotations

from celery_ha.integration import DurableContext, durable_task


@durable_task(name="test_migrated_item")
def migrated_item(ctx: DurableContext) -> None:
    ctx.emit({"url": ctx.url, "token": ctx.lease.token}, key=f"{ctx.url}|{ctx.lease.token}")
