"""Sitemap ingestion: the page URLs of :class:`~celery_ha.fetch.sitemap.SitemapReader` filtered,
checked against what already finished, and queued in batches.

Why batches: a sitemap of 50,000 URLs is never held at once — the reader yields entries as it parses
and this module holds one batch (``batch_size``, 1000) before queueing it with one
``enqueue_many_with_status`` per batch (script calls of at most ``SCRIPT_BATCH`` rows each, so a
batch never keeps Redis busy in one long call). A document that turns out malformed half-way stops the
ingestion: the batches already queued stay queued, the unfinished batch is dropped (nothing
half-written beyond complete batches), and running it again is harmless (dedup).

Why ``lastmod`` is read against the remembered ids: a URL whose task already finished is a duplicate
for enqueue unless its recrawl window passed. A sitemap says per URL when the page last changed, so
per batch the completion times of its URLs with a lastmod are read (``state/done_times.py``, one round
trip; exact while the history holds the task's record, else the start of its completion hour, so a
lastmod within the hour of the crawl counts as newer): a URL whose lastmod is newer than its
completion is queued again at once (a recrawl window of 0 for that group); one whose lastmod is not
newer is skipped as unchanged, unless the call's recrawl window (``recrawl_after``, default
``CELERY_HA_DEDUP_TTL``) has passed since it finished, in which case it is queued again by age as any
enqueue would. URLs without a lastmod follow the usual dedup rules.

Filters are globs (``fnmatch``, case-sensitive, the same as ``recrawl --match``) on the page URL:
with includes a URL must match one of them; a URL matching an exclude is dropped.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.urls import simple_canonical_url
from celery_ha.base.validation import check_url, parse_duration
from celery_ha.fetch.sitemap import SitemapEntry, SitemapReader
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue
from celery_ha.state.done_times import finished_at
from celery_ha.state.enqueue_args import SCRIPT_BATCH


@dataclass
class IngestCounts:
    """What one ingestion did, by page URL (only complete batches are counted)."""

    seen: int = 0  # page entries read and handled
    new: int = 0  # queued: new tasks and new runs of finished ones
    changed: int = 0  # of ``new``: finished before, queued again because lastmod is newer
    duplicates: int = 0  # already queued, running, or finished within the recrawl window
    unchanged: int = 0  # finished, and lastmod not newer than the completion: skipped
    filtered: int = 0  # dropped by --include / --exclude
    invalid: int = 0  # not an absolute http(s) URL (or longer than 8 KiB)
    documents: int = 0  # sitemap documents fetched (robots.txt and indexes included)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class UrlFilter:
    """Include / exclude globs on a URL (``*``, ``?``, ``[...]``; case-sensitive)."""

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        for pattern in (*self.include, *self.exclude):
            if not isinstance(pattern, str) or not pattern:
                raise InvalidInput(f"a URL filter must be a non-empty glob, got {pattern!r}")

    def __call__(self, url: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(url, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(url, p) for p in self.exclude)


def _valid(url: str) -> bool:
    if simple_canonical_url(url) is not None:
        return True
    try:
        check_url(url)
    except InvalidInput:
        return False
    return True


#: Called after every queued batch with the position of its last entry and the counts so far.
OnBatch = Callable[[list[int], IngestCounts], None]


class SitemapIngest:
    """Queue the page URLs of sitemaps for ``task``: see the module docstring.

    ``spec`` fields (priority, meta, dedup, max_attempts) apply to every queued task.
    ``recrawl_after``: the call's recrawl window (None = the queue's ``dedup_ttl``).
    """

    def __init__(self, queue: TaskQueue, *, task: str | None = None, priority: int = 0,
                 meta: Mapping[str, Any] | None = None, dedup: bool = True, max_attempts: int | None = None,
                 recrawl_after: float | str | None = None, url_filter: UrlFilter | None = None,
                 batch_size: int = 1000, reader: SitemapReader | None = None,
                 on_batch: OnBatch | None = None) -> None:
        self.queue = queue
        self.task = task or queue.default_task
        self.base = {"task": self.task, "priority": priority, "meta": dict(meta) if meta else None,
                     "dedup": dedup, "max_attempts": max_attempts}
        # Validate the shared fields now (task name, priority, meta size): a bad one must fail before
        # the first document is fetched, not at the first batch.
        queue.task_ids([{"url": "http://example.com/", **self.base}])
        self.dedup = dedup
        self.recrawl_after = recrawl_after
        window = queue.dedup_ttl if recrawl_after is None else parse_duration(recrawl_after, "recrawl_after")
        self.window_ms = None if window is None else int(window * 1000)
        self.filter = url_filter or UrlFilter()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise InvalidInput(f"batch_size must be 1..10000, got {batch_size!r}")
        self.batch_size = batch_size
        self.reader = reader or SitemapReader()
        self.on_batch = on_batch
        self.counts = IngestCounts()

    def run(self, urls: Sequence[str], resume: Sequence[int] | None = None) -> IngestCounts:
        """Read ``urls`` (sitemaps, indexes, robots.txt or site roots) and queue their pages; with
        ``resume`` (a position from ``on_batch``) start after it. Returns the counts; raises the
        reader's errors (after queueing every complete batch before the failure)."""
        batch: list[SitemapEntry] = []
        for entry in self.reader.entries(urls, resume):
            batch.append(entry)
            if len(batch) >= self.batch_size:
                self._queue(batch)
                batch = []
        if batch:
            self._queue(batch)
        self.counts.documents = self.reader.opened
        return self.counts

    # -------------------------------------------------------------- one batch
    def _queue(self, batch: list[SitemapEntry]) -> None:
        counts = self.counts
        counts.seen += len(batch)
        keep = [e for e in batch if self.filter(e.url)]
        counts.filtered += len(batch) - len(keep)
        try:
            self._send(keep)
        except InvalidInput:
            # Some URL of the batch is not a valid http(s) URL: every spec is validated before
            # anything is written, so nothing of the batch was queued. Drop the invalid ones and send
            # the rest (checking each URL alone only on this rare path: the common one parses a URL
            # once per enqueue, not once more up front).
            valid = [e for e in keep if _valid(e.url)]
            counts.invalid += len(keep) - len(valid)
            self._send(valid)
        counts.documents = self.reader.opened
        if self.on_batch is not None:
            self.on_batch(list(batch[-1].position), counts)

    def _send(self, entries: list[SitemapEntry]) -> None:
        """Queue ``entries`` (InvalidInput, with nothing written, if one URL is invalid)."""
        plain, changed, unchanged = self._split(entries)
        for group, window in ((plain, self.recrawl_after), (changed, 0)):
            if not group:
                continue
            results = self.queue.enqueue_many_with_status(
                [{"url": e.url, **self.base} for e in group], batch_size=min(self.batch_size, SCRIPT_BATCH),
                recrawl_after=window)
            made = sum(1 for _, created in results if created)
            self.counts.new += made
            self.counts.duplicates += len(results) - made
            if window == 0:
                self.counts.changed += made
        # Counted only now: a batch refused for an invalid URL is split again by the retry, which
        # must not count its unchanged pages a second time.
        self.counts.unchanged += unchanged

    def _split(self, entries: list[SitemapEntry]) -> tuple[list[SitemapEntry], list[SitemapEntry], int]:
        """(queue as usual, queue again now because lastmod is newer than the completion, how many
        are unchanged and left out)."""
        dated = [e for e in entries if e.lastmod is not None] if self.dedup else []
        if not dated:
            return entries, [], 0
        q = self.queue
        # The ids enqueue gives (InvalidInput for a bad URL, as enqueue): a sharded namespace with the
        # host gate places a task on its host's shard, which changes its id, under the key mode in
        # force (read here when it matters: task_ids itself reads nothing).
        if q.host_gate and q.shard_count > 1:
            q.hosts.mode()
        rows = q._rows([{"url": e.url, **self.base} for e in dated], None, 0, True)
        ids = [row[0] for row in rows]
        # Finished here, else (None) in an ancestor of a migration whose ids were others (carried).
        times = [at if at is not None else old for at, old in zip(
            finished_at(q.client, q.namespace, q.shard_count, ids), q.carried_finished(rows), strict=True)]
        done = dict(zip(ids, times, strict=True))
        now = redis_now_ms(q.client) if self.window_ms is not None else 0
        unchanged = 0
        verdict = {id(e): done[tid] for e, tid in zip(dated, ids, strict=True)}
        plain: list[SitemapEntry] = []
        changed: list[SitemapEntry] = []
        for entry in entries:  # in reading order: the queue's FIFO follows the sitemap
            at = verdict.get(id(entry))
            if at is None or entry.lastmod is None:
                plain.append(entry)
            elif entry.lastmod * 1000 > at:
                changed.append(entry)
            elif self.window_ms is not None and at <= now - self.window_ms:
                plain.append(entry)  # unchanged, but old enough to be re-fetched by age
            else:
                unchanged += 1
        return plain, changed, unchanged
