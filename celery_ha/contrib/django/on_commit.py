"""``enqueue_on_commit`` and ``enqueue_many_on_commit``: queue tasks when the transaction commits.

The call validates the request and writes it to the outbox table in the caller's transaction, and
returns the task id at once. Only when that transaction commits is the request pushed to Redis (a
rollback, or a rolled-back savepoint, takes the rows and the push with it); outside a transaction
the push happens at once. A push that cannot reach Redis leaves the rows for the relay, so a
committed request is never lost. Bad input raises here, inside the transaction, and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from django.db import router, transaction

from celery_ha.base.errors import InvalidInput
from celery_ha.base.tracing import capture
from celery_ha.base.validation import iter_many
from celery_ha.contrib.django.models import OutboxEntry
from celery_ha.contrib.django.outbox import Pending, push_after_commit, requested_at
from celery_ha.contrib.django.runtime import runtime


def _resolved(spec: str | Mapping[str, Any], task: str | None, priority: int, dedup: bool,
              default_task: str, trace: str | None) -> dict[str, Any]:
    """The spec with the call's defaults filled in: the task name and dedup fix the id now, so a
    later push (after a settings change, in another process) cannot give the task another id."""
    if isinstance(spec, str):
        spec = {"url": spec}
    elif not isinstance(spec, Mapping):
        raise InvalidInput(f"each task must be a URL or a dict, got {type(spec).__name__}")
    out = {key: value for key, value in spec.items() if value is not None}
    out["task"] = spec.get("task") or task or default_task
    out["priority"] = priority if spec.get("priority") is None else spec["priority"]
    out["dedup"] = dedup if spec.get("dedup") is None else bool(spec["dedup"])
    if "trace" not in out and trace:
        out["trace"] = trace  # the view's trace: the push runs later, in another thread
    return out


def enqueue_many_on_commit(specs: Iterable[str | Mapping[str, Any]], *, task: str | None = None,
                           priority: int = 0, dedup: bool = True, using: str | None = None) -> list[str]:
    """Queue many tasks when the transaction of ``using`` commits; returns their ids now.

    Each spec is a URL or a dict with the keyword arguments of ``enqueue_on_commit`` (``url``,
    ``task``, ``priority``, ``meta``, ``dedup``, ``max_attempts``, ``max_stalls``). Every spec is
    validated before anything is written: InvalidInput (a ``ValueError``) names the bad one.
    """
    queue = runtime().queue()
    trace = capture()  # the calling view's span, if tracing is on
    resolved = [_resolved(spec, task, priority, dedup, queue.default_task, trace)
                for spec in iter_many("tasks (URLs or dicts)", specs)]
    if not resolved:
        return []
    ids = queue.task_ids(resolved)  # every rule of enqueue_many, no Redis involved
    texts = [json.dumps(spec, ensure_ascii=False, separators=(",", ":")) for spec in resolved]
    alias = using or router.db_for_write(OutboxEntry)
    entries = [OutboxEntry(namespace=queue.namespace, task_id=tid, spec=text)
               for tid, text in zip(ids, texts, strict=True)]
    OutboxEntry.objects.using(alias).bulk_create(entries)
    rows = [Pending(entry.pk, entry.namespace, entry.task_id, spec, requested_at(entry.created_at))
            for entry, spec in zip(entries, resolved, strict=True)]
    transaction.on_commit(partial(push_after_commit, alias, rows), using=alias)
    return ids


def enqueue_on_commit(url: str, task: str | None = None, priority: int = 0,
                      meta: Mapping[str, Any] | None = None, dedup: bool = True,
                      max_attempts: int | None = None, using: str | None = None) -> str:
    """Queue one task when the transaction of ``using`` (default: the default database) commits, or
    at once outside a transaction; returns its id now. A duplicate (same task + canonical URL, with
    dedup) gets the existing task's id. Nothing is queued if the transaction rolls back."""
    spec = {"url": url, "task": task, "priority": priority, "meta": meta, "dedup": dedup,
            "max_attempts": max_attempts}
    return enqueue_many_on_commit([spec], using=using)[0]
