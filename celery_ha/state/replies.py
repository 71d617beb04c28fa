"""What the task-state scripts answer, and what each answer means to the Python caller.

A script that refuses a transition changes nothing and answers a negative integer, a refusal code.
The codes are defined once for the scripts, in ``_replies.lua``; :class:`Refusal` mirrors them (a test
checks that the two lists agree). No success reply is a negative integer, so telling a refusal apart
costs one type check and no extra round trip. :func:`raise_for` is the one place a code becomes an
exception; the success decoders below turn a lease or a dispatch batch into its record.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any, NoReturn, TypeGuard

from celery_ha.base.errors import LeaseLost, TaskNotFound
from celery_ha.state.records import Dispatched, Lease, TaskInfo


class Refusal(IntEnum):
    """Why a script refused a transition (same values as the ``R_*`` constants of _replies.lua)."""

    UNKNOWN = -1
    WAITING = -2
    STALE_TOKEN = -3
    OTHER_WORKER = -4
    RUNNING = -5
    DELAYED = -6
    COMPLETED = -7
    DEAD = -8
    EMPTY = -9


#: Each refusal as the clause an error message ends with.
REASONS: dict[int, str] = {
    Refusal.UNKNOWN: "the task does not exist (never enqueued, or finished and trimmed from history)",
    Refusal.WAITING: "the task waits for a new claim (its lease expired and was reclaimed, or was released)",
    Refusal.STALE_TOKEN: "a newer claim holds the task",
    Refusal.OTHER_WORKER: "another worker holds the task",
    Refusal.RUNNING: "the task is already running",
    Refusal.DELAYED: "the task failed and waits for its retry",
    Refusal.COMPLETED: "the task is completed",
    Refusal.DEAD: "the task is dead",
    Refusal.EMPTY: "no queued task could be claimed",
}


def refused(reply: object) -> TypeGuard[int]:
    """True when ``reply`` is a refusal code rather than a script's success reply."""
    return type(reply) is int and reply < 0


def reason(code: int) -> str:
    """The reason a refusal code stands for (a code this version does not know is named as such)."""
    return REASONS.get(code) or f"refused with unknown code {code}"


def raise_for(code: int, task_id: str, token: int | None = None, *, namespace: str | None = None) -> NoReturn:
    """Raise the error a refused transition means to its caller.

    Under a lease (``token`` given) every refusal is :class:`LeaseLost`, whatever the cause: the
    holder must stop touching the task, and the message says why. Without a lease only an unknown id
    is an error, :class:`TaskNotFound`; the other refusals are answers the caller turns into None or 0
    (a claim of a running task, a release of a task no longer held), so raising for one is a bug.
    """
    if token is not None:
        why = reason(code)
        raise LeaseLost(f"lease on task {task_id} (token {token}) is lost: {why}", code=int(code), reason=why)
    if code == Refusal.UNKNOWN:
        raise TaskNotFound(f"no task {task_id!r} in namespace {namespace!r}")
    raise ValueError(f"refusal {code} of task {task_id!r} ({reason(code)}) is no error without a lease")


def lease_from(reply: Any, worker: str) -> Lease | None:
    """The Lease a claim reply ``{id, token, expiry_ms, record, checkpoint|false}`` grants, or None
    for a refusal (the task is not claimable now, or nothing is queued)."""
    if refused(reply):
        return None
    tid, token, expiry, raw, ckpt = reply
    return Lease(task_id=tid, token=int(token), worker=worker, expires_at=int(expiry) / 1000.0,
                 task=TaskInfo.parse(tid, raw), checkpoint=json.loads(ckpt) if ckpt else None)


def dispatched_from(flat: list[Any]) -> list[Dispatched]:
    """dispatch.lua's flat ``id, task, priority, resent`` quadruples as records."""
    return [Dispatched(flat[i], flat[i + 1], int(flat[i + 2]), bool(int(flat[i + 3])))
            for i in range(0, len(flat), 4)]
