"""Enqueue under ids fixed earlier, idempotently: :func:`enqueue_if_absent`.

A caller that hands out a task id before the task reaches Redis (Django's transactional outbox
returns it inside the database transaction) must later create the task under exactly that id, and
may have to send it twice without knowing whether the first send arrived. The rows are validated
like any enqueue; only their ids are the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import MAX_NAME_CHARS, check_text, iter_many
from celery_ha.state.carried import ancestor_ids
from celery_ha.state.enqueue_args import Row, grouped
from celery_ha.state.sharded import by_shard

if TYPE_CHECKING:
    from celery_ha.state.taskqueue import TaskQueue

#: Tasks per script call of a replay (a relay sends batches of this size at most).
REPLAY_BATCH = 1000


def enqueue_if_absent(queue: TaskQueue, tasks: Iterable[tuple[str, str | Mapping[str, Any]]]) -> list[bool]:
    """Create each ``(id, spec)`` of ``queue`` under that id unless a task with it is present (a
    finished dedup id counts): replaying an enqueue whose id was fixed earlier (``task_ids``) queues
    it once, with dedup or without. Specs are validated first, as ``enqueue_many`` validates them
    (InvalidInput, nothing written); one round trip per :data:`REPLAY_BATCH` tasks (per shard of a
    sharded namespace: each id goes to its own shard). Returns True
    where this call created the task.

    A module function beside the queue rather than a method: it is the outbox's door, not part of the
    everyday API, and it uses the queue's own spec rules and script set.
    """
    rows, computed = replay_rows(tasks, queue)
    if rows:
        queue._register_once()
    ancestors = queue.ancestors(rows)  # with the URL rules' check (before any write)
    # A namespace migrated from one whose dedup ids meant something else (state/carried.py): a request
    # made before the migration names its dedup task by the id an ancestor gave it, and the task the
    # URL has here, live or remembered, goes by the id this namespace gives it.
    for row, own in zip(rows, computed, strict=True):
        if row[2] == "1" and row[0] != own and any(row[0] in ancestor_ids(row, a) for a in ancestors):
            row[0] = own
    present = queue._carried(rows, -1)  # finished in an ancestor of a migration: a replay never recrawls
    flags: list[bool] = []
    for at in range(0, len(rows), REPLAY_BATCH):
        batch = [rows[i] for i in range(at, min(at + REPLAY_BATCH, len(rows))) if i not in present]
        got = [False] * len(batch)
        for shard, positions in by_shard([row[0] for row in batch], queue.shard_count).items():
            reply = queue._run("enqueue_if_absent", *grouped([batch[p] for p in positions]), shard=shard)
            for p, flag in zip(positions, created_flags(reply), strict=True):
                got[p] = flag
        sent = iter(got)
        flags += [False if i in present else next(sent) for i in range(at, min(at + REPLAY_BATCH, len(rows)))]
    return flags


def replay_rows(tasks: Iterable[tuple[str, str | Mapping[str, Any]]], queue: TaskQueue
                ) -> tuple[list[Row], list[str]]:
    """Validate ``(id, spec)`` pairs and return their rows (specs checked by the queue's rules, as
    ``enqueue_many`` checks them) carrying the given ids, with the ids an enqueue would give them;
    InvalidInput for a bad pair, id or spec."""
    ids: list[str] = []
    specs: list[str | Mapping[str, Any]] = []
    for pair in iter_many("tasks ((id, spec) pairs)", tasks):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidInput(f"each task must be an (id, spec) pair, got {type(pair).__name__}")
        ids.append(check_text("task id", pair[0], MAX_NAME_CHARS))
        specs.append(pair[1])
    rows = queue._rows(specs, None, 0, True, queue.hosts.mode())  # host keys under the mode in force
    computed = [row[0] for row in rows]
    for row, task_id in zip(rows, ids, strict=True):
        row[0] = task_id
    return rows, computed


def created_flags(codes: Any) -> list[bool]:
    """enqueue_if_absent.lua's reply ('1' created, '0' present, one per task) as booleans."""
    text = codes.decode() if isinstance(codes, bytes) else str(codes)
    return [code == "1" for code in text]
