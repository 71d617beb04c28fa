"""Enqueue under ids fixed earlier, idempotently: :func:`enqueue_if_absent`.

A caller that hands out a task id before the task reaches Redis (Django's transactional outbox
returns it inside the database transaction) must later create the task under exactly that id, and
may have to send it twice without knowing whether the first send arrived. The rows are validated
like any enqueue; only their ids are the caller's.

A finished dedup task is present to a replay, unless the caller says when the request was made: a
request made past the recrawl window of the task's last run starts a new run (as an enqueue would),
while a replay of a request whose run finished after it stays a no-op (enqueue_if_absent.lua).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import MAX_NAME_CHARS, check_text, iter_many, shown
from celery_ha.state.carried import ancestor_ids, carried_times, count_duplicates
from celery_ha.state.done_times import HOUR_MS
from celery_ha.state.enqueue_args import SCRIPT_BATCH, Row, grouped
from celery_ha.state.operator_ops import expiry_ms
from celery_ha.state.sharded import by_shard

if TYPE_CHECKING:
    from celery_ha.state.taskqueue import TaskQueue

#: Tasks a relay (the Django outbox) hands to one replay at most; the replay sends them in script
#: calls of ``SCRIPT_BATCH`` rows (one round trip each), so no call keeps Redis busy long.
REPLAY_BATCH = 1000
#: A task to replay: ``(id, spec)``, or ``(id, spec, requested_at)`` with the request's time (epoch
#: seconds, or None when unknown).
Replayed = tuple[str, str | Mapping[str, Any]] | tuple[str, str | Mapping[str, Any], float | None]


def enqueue_if_absent(queue: TaskQueue, tasks: Iterable[Replayed], *,
                      recrawl_after: float | str | None = None) -> list[bool]:
    """Create each ``(id, spec)`` of ``queue`` under that id unless a task with it is present:
    replaying an enqueue whose id was fixed earlier (``task_ids``) queues it once, with dedup or
    without. Specs are validated first, as ``enqueue_many`` validates them (InvalidInput, nothing
    written); one round trip per ``SCRIPT_BATCH`` tasks (per shard of a sharded namespace: each
    id goes to its own shard). Returns True where this call created the task (or a new run of it).

    A finished dedup id counts as present, however long ago it finished, unless the task comes as
    ``(id, spec, requested_at)``: when the request was made (epoch seconds on the requester's clock;
    Redis takes the earlier of it and its own). Then a task that finished at least ``recrawl_after``
    (default the queue's ``dedup_ttl``; None there: never) before that time is queued again as a new
    run, as ``enqueue`` would queue it; one that finished later is the run of this very request (an
    earlier send of it arrived), and stays as it is. A remembered id's completion hour counts as
    its end here (enqueue counts its start): a replay never starts a second run.

    A module function beside the queue rather than a method: it is the outbox's door, not part of the
    everyday API, and it uses the queue's own spec rules and script set.
    """
    window = expiry_ms(queue.dedup_ttl if recrawl_after is None else recrawl_after, "recrawl_after")
    rows, computed, asked = replay_rows(tasks, queue)
    if rows:
        queue._register_once()
    ancestors = queue.ancestors(rows)  # with the URL rules' check (before any write)
    # A namespace migrated from one whose dedup ids meant something else (state/carried.py): a request
    # made before the migration names its dedup task by the id an ancestor gave it, and the task the
    # URL has here, live or remembered, goes by the id this namespace gives it.
    for row, own in zip(rows, computed, strict=True):
        if row[2] == "1" and row[0] != own and any(row[0] in ancestor_ids(row, a) for a in ancestors):
            row[0] = own
    present = _carried(queue, rows, asked, window)
    flags: list[bool] = []
    for at in range(0, len(rows), SCRIPT_BATCH):
        sent = [i for i in range(at, min(at + SCRIPT_BATCH, len(rows))) if i not in present]
        got: dict[int, bool] = {}
        for shard, positions in by_shard([rows[i][0] for i in sent], queue.shard_count).items():
            part = [sent[p] for p in positions]
            times = [-1 if asked[i] is None else asked[i] for i in part] if any(
                asked[i] is not None for i in part) else []
            reply = queue._run("enqueue_if_absent", window, len(times), *times,
                               *grouped([rows[i] for i in part]), shard=shard)
            got.update(zip(part, created_flags(reply), strict=True))
        flags += [got.get(i, False) for i in range(at, min(at + SCRIPT_BATCH, len(rows)))]
    return flags


def _carried(queue: TaskQueue, rows: list[Row], asked: list[int | None], window: int) -> set[int]:
    """Rows whose URL an ancestor of a migration finished (``state/carried.py``): present, as the
    script's own remembered ids are (the end of the completion hour against the request time, else
    for good), and counted as duplicates; the others are sent to the script."""
    if not queue._carries or not any(row[2] == "1" for row in rows):
        return set()
    now_ms, times = carried_times(queue.client, queue.shard_keys(), queue._carries, rows)
    found = set()
    for i, at in enumerate(times):
        if at is None:
            continue
        when = asked[i]
        if window < 0 or when is None or at + HOUR_MS - 1 > min(when, now_ms) - window:
            found.add(i)
    if found:
        count_duplicates(queue.client, queue.shard_keys(), [rows[i][0] for i in found])
    return found


def replay_rows(tasks: Iterable[Replayed], queue: TaskQueue) -> tuple[list[Row], list[str], list[int | None]]:
    """Validate ``(id, spec[, requested_at])`` tasks and return their rows (specs checked by the
    queue's rules, as ``enqueue_many`` checks them) carrying the given ids, with the ids an enqueue
    would give them and each request's time in ms (None when not given); InvalidInput for a bad
    task, id, spec or time."""
    ids: list[str] = []
    specs: list[str | Mapping[str, Any]] = []
    asked: list[int | None] = []
    for pair in iter_many("tasks ((id, spec) pairs or (id, spec, requested_at) triples)", tasks):
        if not isinstance(pair, (tuple, list)) or len(pair) not in (2, 3):
            raise InvalidInput(f"each task must be an (id, spec) pair or an (id, spec, requested_at) "
                               f"triple, got {type(pair).__name__}")
        ids.append(check_text("task id", pair[0], MAX_NAME_CHARS))
        specs.append(pair[1])
        asked.append(_requested_ms(pair[2] if len(pair) == 3 else None))
    rows = queue._rows(specs, None, 0, True, queue.hosts.mode())  # host keys under the mode in force
    computed = [row[0] for row in rows]
    for row, task_id in zip(rows, ids, strict=True):
        row[0] = task_id
    return rows, computed, asked


def _requested_ms(value: Any) -> int | None:
    """A request's time (epoch seconds, None) in whole ms for the script."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise InvalidInput(f"requested_at must be epoch seconds (a finite number >= 0) or None, "
                           f"got {shown(value)}")
    return int(value * 1000)


def created_flags(codes: Any) -> list[bool]:
    """enqueue_if_absent.lua's reply ('1' created, '0' present, one per task) as booleans."""
    text = codes.decode() if isinstance(codes, bytes) else str(codes)
    return [code == "1" for code in text]
