"""``sitemap``: ingest a site's sitemaps from a worker, resumably, so a crawl can re-read them on a
schedule.

The task's URL is a sitemap, a sitemap index, a robots.txt or a site root (its robots.txt
``Sitemap:`` lines); its pages are queued as ``meta["child_task"]`` tasks exactly as
``celery-ha enqueue --sitemap`` queues them (``celery_ha.fetch.sitemap_ingest``: streamed, batched,
filtered, and a page whose task finished is skipped unless its ``lastmod`` is newer). After every
queued batch the reading position is checkpointed (fenced), so a crash resumes after the last
complete batch instead of reading every document again: documents before the position are not
fetched, and the re-read of the document it stopped in skips what was queued. (The position is a
path of document indexes: if the site's robots.txt or index changed between the crash and the resume,
it is applied to the new listing; pages it then misses are queued by the next scheduled run.)

Re-reading on a schedule: enqueue it with a recrawl window, e.g. daily from cron or beat,
``celery-ha enqueue https://shop.example/robots.txt --task sitemap --recrawl-after 1d``; each run then
queues only the new pages and those whose lastmod moved.

``meta``: ``child_task`` ("fetch_page"), ``priority`` (0), ``child_meta`` (a JSON object stored with
every page task), ``include`` / ``exclude`` (lists of globs), ``recrawl_after`` (the pages' recrawl
window, default ``CELERY_HA_DEDUP_TTL``), ``max_attempts``, ``batch_size`` (1000), ``max_documents``
(1000), ``max_depth`` (3).

Errors: a document that cannot be fetched (network, 5xx, 429) is retried with backoff, from the
checkpoint; a 404, an unreadable document (malformed, too large, DTD) or a bad ``meta`` field (which
every retry would meet again) fails the task for good.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_ha.base.errors import InvalidInput
from celery_ha.fetch.sitemap import SitemapLimits, SitemapReader
from celery_ha.fetch.sitemap_ingest import IngestCounts, SitemapIngest, UrlFilter
from celery_ha.integration import DurableContext, PermanentError, durable_task
from celery_ha.integration.core.services import services

log = logging.getLogger(__name__)


def _globs(meta: dict[str, Any], name: str) -> list[str]:
    value = meta.get(name) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise PermanentError(f"meta[{name!r}] must be a list of globs")
    return value


@durable_task(name="sitemap")
def sitemap(ctx: DurableContext) -> None:
    meta = ctx.meta or {}
    ck = ctx.checkpoint or {}
    resume = ck.get("position")
    before = ck.get("counts") if isinstance(ck.get("counts"), dict) else {}

    def total(counts: IngestCounts) -> dict[str, int]:
        """This run's counts over every attempt (the checkpoint carries the earlier attempts')."""
        return {k: v + int(before.get(k, 0)) for k, v in counts.as_dict().items()}

    def saved(position: list[int], counts: IngestCounts) -> None:
        # Everything up to `position` is queued (enqueue_many returned): checkpoint it, fenced. A
        # holder that lost its lease stops here instead of reading on.
        ctx.save_checkpoint({"position": position, "counts": total(counts)})

    child_meta = meta.get("child_meta")
    reader: SitemapReader | None = None
    try:
        # Every meta field is read in here: a bad one ("max_depth": "x") fails the task at once,
        # where a retry would only meet it again.
        reader = SitemapReader(SitemapLimits(max_documents=int(meta.get("max_documents", 1000)),
                                             max_depth=int(meta.get("max_depth", 3))))
        ingest = SitemapIngest(
            services().queue, task=str(meta.get("child_task") or "fetch_page"),
            priority=int(meta.get("priority", 0)),
            meta=child_meta if isinstance(child_meta, dict) else None,
            max_attempts=meta.get("max_attempts"), recrawl_after=meta.get("recrawl_after"),
            url_filter=UrlFilter(_globs(meta, "include"), _globs(meta, "exclude")),
            batch_size=int(meta.get("batch_size", 1000)), reader=reader, on_batch=saved)
    except BaseException as exc:
        if reader is not None:
            reader.close()
        if isinstance(exc, (InvalidInput, ValueError, TypeError)):
            raise PermanentError(f"bad meta for the sitemap task: {exc}") from None
        raise
    try:
        counts = ingest.run([ctx.url], resume=resume if isinstance(resume, list) else None)
    finally:
        reader.close()
    log.info("sitemap %s: %s (documents read by this attempt: %d, skipped: %s)", ctx.url,
             total(counts), counts.documents, reader.skipped_documents[:5])
