"""Pushing outbox rows to Redis: right after their commit, and later by the relay.

Both paths push with ``enqueue_if_absent`` under the id the caller got back, then delete the rows.
Whatever happens between the push and the delete (a lost reply, a crash, a second relay racing the
first), a row pushed again finds its id present and changes nothing: a request is queued once, with
dedup or without. A push that fails leaves the rows where they are; nothing here ever raises into
the request that committed (the transaction is already committed: the request must not fail now).

Every push carries when the request was made: the row's ``created_at``. A dedup task that finished
at least the dedup TTL before it is queued again, as ``enqueue`` would queue it (the first push of a
new request must not count as a replay of the last one); a task that finished after it ran for this
very request, so a push repeated after its run stays a no-op. ``created_at`` is the web process's
clock, not Redis's (the system's clock): the row is written in the transaction, before Redis is
reached, and must be when Redis does not answer. Redis takes the earlier of the two, so a web clock
running ahead changes nothing for a first push (one running behind delays a recrawl by its lag); a
replay stays a no-op as long as the web clock is not ahead of Redis's by more than the dedup TTL
(hours or days in practice: keep the clocks synced).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import TimeoutError as PushTimeout
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from django.db import DatabaseError, connections
from django.db.models import F

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.contrib.django.models import OutboxEntry
from celery_ha.contrib.django.runtime import runtime
from celery_ha.state.replay import REPLAY_BATCH, enqueue_if_absent

log = logging.getLogger(__name__)

#: Errors that mean "Redis did not take the push" (unreachable, too slow, full, read-only): the rows
#: stay for the relay.
REDIS_FAILED = (redis.RedisError, OSError)
#: Most rows one relay run moves (it runs again at the next beat).
RELAY_MAX_ROWS = 100_000
_ERROR_CHARS = 500


@dataclass(frozen=True)
class Pending:
    """One outbox row, as pushed: what ``enqueue_if_absent`` needs plus the row's key. ``requested_at``
    is when the request was made (epoch seconds, the row's ``created_at``); None pushes it as a pure
    replay (a finished dedup task stays finished, however long ago)."""

    pk: Any
    namespace: str
    task_id: str
    spec: dict[str, Any]
    requested_at: float | None = None

    @classmethod
    def of(cls, entry: OutboxEntry) -> Pending:
        return cls(entry.pk, entry.namespace, entry.task_id, json.loads(entry.spec),
                   requested_at(entry.created_at))


def requested_at(created: datetime | None) -> float | None:
    """A row's ``created_at`` as epoch seconds. A naive one (``USE_TZ = False``) is the local time
    ``timezone.now()`` gave, which ``timestamp()`` reads back as such."""
    return None if created is None else created.timestamp()


@dataclass
class RelayReport:
    """What one relay run did."""

    pushed: int = 0  # rows pushed and deleted
    created: int = 0  # of those, tasks created now (the others were present: an earlier push arrived)
    invalid: int = 0  # rows refused by validation (kept, with the reason in last_error)
    left: int = 0  # rows still in the outbox after the run
    error: str | None = None  # why the run stopped early (Redis unreachable, full …), masked
    databases: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"pushed": self.pushed, "created": self.created, "invalid": self.invalid, "left": self.left,
                "error": self.error, "databases": self.databases}


def _short(exc: BaseException) -> str:
    return mask_url(f"{type(exc).__name__}: {exc}")[:_ERROR_CHARS]


def push(rows: Sequence[Pending]) -> list[bool]:
    """Push ``rows`` (grouped by namespace, in batches); True per row whose task this call created.
    Raises the Redis error (nothing after it was pushed), InvalidInput for a row refused, or
    ConfigurationError when this process may not write the namespace (its shard count differs)."""
    by_namespace: dict[str, list[int]] = defaultdict(list)
    for at, row in enumerate(rows):
        by_namespace[row.namespace].append(at)
    created = [False] * len(rows)
    rt = runtime()
    for namespace, positions in by_namespace.items():
        queue = rt.queue(namespace)
        for start in range(0, len(positions), REPLAY_BATCH):
            part = positions[start:start + REPLAY_BATCH]
            flags = enqueue_if_absent(queue, [(rows[i].task_id, rows[i].spec, rows[i].requested_at)
                                              for i in part])
            for i, flag in zip(part, flags, strict=True):
                created[i] = flag
    return created


def _delete(using: str, pks: Iterable[Any]) -> None:
    pks = list(pks)
    for start in range(0, len(pks), REPLAY_BATCH):
        OutboxEntry.objects.using(using).filter(pk__in=pks[start:start + REPLAY_BATCH]).delete()


def push_after_commit(using: str, rows: Sequence[Pending]) -> None:
    """The on-commit step of ``enqueue_on_commit``: push (waiting ``PUSH_TIMEOUT`` at most), then
    delete. Never raises: the transaction is committed, the request must not fail now."""
    rt = runtime()
    if not rt.breaker.allows():
        log.info("celery-ha: Redis failed a moment ago; %d committed request(s) wait in the outbox for "
                 "the relay", len(rows))
        return
    try:
        rt.pushers().submit(push, rows).result(timeout=rt.config.push_timeout)
    except PushTimeout:
        rt.breaker.trip()  # the push goes on in its thread; a late success is relayed harmlessly
        log.warning("celery-ha: Redis did not answer within %gs; %d committed request(s) stay in the "
                    "outbox until the relay pushes them", rt.config.push_timeout, len(rows))
        return
    except REDIS_FAILED as exc:
        rt.breaker.trip()
        log.warning("celery-ha: Redis did not take %d committed request(s) (%s); they stay in the outbox "
                    "until the relay pushes them", len(rows), _short(exc))
        return
    except Exception as exc:
        log.error("celery-ha: pushing %d committed request(s) failed (%s); they stay in the outbox",
                  len(rows), _short(exc))
        return
    try:
        _delete(using, (row.pk for row in rows))
    except DatabaseError as exc:  # pushed: a relay pushes them again harmlessly, then deletes them
        log.warning("celery-ha: could not delete %d pushed outbox row(s) (%s); the relay will", len(rows),
                    _short(exc))


def outbox_databases(using: str | None = None) -> list[str]:
    """The databases to relay from: ``using``, else every one that holds the outbox table."""
    if using is not None:
        return [using]
    found = []
    for alias in connections:
        try:
            if OutboxEntry._meta.db_table in connections[alias].introspection.table_names():
                found.append(alias)
        except DatabaseError as exc:
            log.warning("celery-ha: database %r not relayed: %s", alias, _short(exc))
    return found


def _mark(using: str, pks: Iterable[Any], error: str) -> None:
    """Record a failed push on the rows (shown by the admin's outbox page)."""
    OutboxEntry.objects.using(using).filter(pk__in=list(pks)).update(attempts=F("attempts") + 1,
                                                                     last_error=error[:_ERROR_CHARS])


def _relay_batch(using: str, entries: list[OutboxEntry], report: RelayReport, skipped: set[Any]) -> None:
    """Push one batch; a row refused by validation is kept aside with its reason, the rest go on.

    Only ``InvalidInput`` (bad data: that row's fault) marks a row. Any other refusal, such as a
    ``ConfigurationError`` (this process's shard count differs from the namespace's), is the
    process's: every row would meet it, so it propagates and stops the run with the rows untouched,
    to be pushed once the configuration is fixed."""
    rows: list[Pending] = []
    for entry in entries:
        try:
            rows.append(Pending.of(entry))
        except ValueError as exc:
            skipped.add(entry.pk)
            report.invalid += 1
            _mark(using, [entry.pk], f"unreadable outbox row: {exc}")
    try:
        flags = push(rows)
    except InvalidInput:
        flags = []
        for row in rows:  # find the bad ones; the good ones are pushed one by one
            try:
                flags += push([row])
            except InvalidInput as exc:
                skipped.add(row.pk)
                report.invalid += 1
                _mark(using, [row.pk], _short(exc))
        rows = [row for row in rows if row.pk not in skipped]
    _delete(using, (row.pk for row in rows))
    report.pushed += len(rows)
    report.created += sum(flags)


def relay(using: str | None = None, batch: int = 500, max_rows: int = RELAY_MAX_ROWS) -> RelayReport:
    """Push every row left in the outbox (oldest first) and delete it; idempotent, so it is safe to
    run while requests push their own rows, and from several processes at once. Stops at the first
    sign that Redis does not take pushes (``report.error``), counting the attempt on the rows it tried.
    A refusal that is no row's fault (``ConfigurationError``: see :func:`_relay_batch`) is raised,
    the rows left as they were."""
    report = RelayReport()
    for alias in outbox_databases(using):
        report.databases.append(alias)
        skipped: set[Any] = set()
        while report.pushed + report.invalid < max_rows:
            entries = list(OutboxEntry.objects.using(alias).exclude(pk__in=skipped)
                           .order_by("created_at", "id")[:batch])
            if not entries:
                break
            try:
                _relay_batch(alias, entries, report, skipped)
            except REDIS_FAILED as exc:
                report.error = _short(exc)
                _mark(alias, (e.pk for e in entries), report.error)
                break
        if report.error:
            break
    report.left = sum(OutboxEntry.objects.using(alias).count() for alias in report.databases)
    if report.pushed or report.error:
        log.info("celery-ha outbox relay: %d pushed (%d created), %d left%s", report.pushed, report.created,
                 report.left, f"; stopped: {report.error}" if report.error else "")
    return report
