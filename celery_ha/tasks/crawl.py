"""``crawl_list``: the paginated list crawl of the seed article, made resumable and exactly-once.

The list URL answers ``?page=N`` with JSON ``{"items": [...], "next": ...}``. The crawl stops at an
empty page, at ``"next": null`` or at ``meta["max_pages"]``. Every list entry is emitted (keyed by
its ``id``, else its ``url``, else a hash) and, with ``meta["follow"]`` (default true), one
``fetch_page`` task is queued for its ``url``. Every ``CELERY_HA_CHECKPOINT_EVERY`` items (50) the
position — page and index within it — is committed together with the buffered items, so a crash
resumes at the last checkpoint and the re-done items are ignored by the keyed sink.

An item's ``url`` may be relative ("/case/7"): it is resolved against the list page it came from. One
that still is not an absolute http(s) URL (``mailto:``, 8 KiB long) is skipped — logged, and counted
as ``skipped`` in the checkpoint — and the crawl goes on: a retry would meet the same item at the
same position again, so raising would end the whole crawl dead on one bad entry.

``meta``: ``start_page`` (1), ``max_pages``, ``follow`` (true), ``child_task`` ("fetch_page"),
``page_param`` ("page"), ``checkpoint_every`` (overrides the setting).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.validation import check_url
from celery_ha.integration import DurableContext, PermanentError, durable_task

log = logging.getLogger(__name__)


def page_url(url: str, page: int, param: str = "page") -> str:
    """``url`` with its ``page`` query parameter set to ``page``."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != param]
    query.append((param, str(page)))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def _key(item: dict[str, Any]) -> str | None:
    for field in ("id", "url"):
        if item.get(field) not in (None, ""):
            return f"{field}:{item[field]}"
    return None


@durable_task(name="crawl_list")
def crawl_list(ctx: DurableContext) -> None:
    meta = ctx.meta or {}
    every = int(meta.get("checkpoint_every") or ctx.settings.checkpoint_every)
    follow = bool(meta.get("follow", True))
    child = str(meta.get("child_task", "fetch_page"))
    param = str(meta.get("page_param", "page"))
    max_pages = meta.get("max_pages")
    ck = ctx.checkpoint or {}
    page = int(ck.get("page", meta.get("start_page", 1)))
    skip = int(ck.get("index", 0))
    processed = int(ck.get("processed", 0))
    skipped = int(ck.get("skipped", 0))

    while max_pages is None or page <= int(max_pages):
        listed = page_url(ctx.url, page, param)
        response = ctx.fetch(listed)
        base = str(getattr(response, "url", "") or listed)  # after redirects: where the page is
        data = response.json()
        if not isinstance(data, dict):
            raise PermanentError(f"page {page} of {ctx.url} is not a JSON object")
        items = data.get("items") or []
        if not items:
            break
        for index in range(skip, len(items)):
            item = items[index]
            if not isinstance(item, dict):
                item = {"value": item}
            ctx.emit(item, key=_key(item))
            if follow and isinstance(item.get("url"), str):
                raw = item["url"].strip()
                target = urljoin(base, raw) if raw else ""  # "" would resolve to the list page itself
                try:
                    check_url(target)
                except InvalidInput as exc:
                    skipped += 1
                    log.warning("crawl_list %s page %d item %d: not followed: %s", mask_url(ctx.url),
                                page, index, exc)
                else:
                    ctx.enqueue(target, task=child)
            processed += 1
            if processed % every == 0:
                last = index + 1 >= len(items)
                ctx.save_checkpoint({"page": page + 1 if last else page, "index": 0 if last else index + 1,
                                     "processed": processed, "skipped": skipped})
        skip = 0
        if "next" in data and not data["next"]:
            break
        page += 1
    ctx.save_checkpoint({"page": page, "index": 0, "processed": processed, "skipped": skipped,
                         "done": True})
