"""The durable task of ``tests/chaos/test_signature_resume.py``: a list of ``meta.n`` parts fetched one
by one, one item and a checkpoint per part, signed by its items (``ctx.signature()`` without data);
each run appends its verdict to the file ``meta.log`` (the test reads it)."""

from __future__ import annotations

import json

from celery_ha.integration import DurableContext, durable_task


@durable_task(name="test_signed_parts")
def signed_parts(ctx: DurableContext) -> None:
    n = int(ctx.meta["n"])
    start = int((ctx.checkpoint or {}).get("i", 0))
    for i in range(start, n):
        ctx.fetch(f"{ctx.url}/{i}", conditional=False)
        ctx.emit({"part": i, "text": "never changes"}, key=f"{ctx.url}#{i}")
        ctx.save_checkpoint({"i": i + 1})
    changed = ctx.signature()
    with open(ctx.meta["log"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"attempt": ctx.attempt, "from": start, "changed": changed}) + "\n")
