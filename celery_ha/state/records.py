"""What the queue hands back: task snapshots and leases."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, NamedTuple


class TaskState(str, Enum):
    """The public name of a task's state.

    A ``str``: ``info.state == "queued"`` holds, and a state prints, formats and JSON-encodes as the
    bare name, so callers that compare, log or export plain strings keep working.
    """

    QUEUED = "queued"  # in its priority band, waiting for the pump or a standalone claim
    DISPATCHED = "dispatched"  # a broker message was sent for it, not yet claimed
    RUNNING = "running"  # leased to a worker
    DELAYED = "delayed"  # failed, waiting for its retry
    COMPLETED = "completed"
    DEAD = "dead"  # failed for good (attempts or stalls exhausted); redrive() revives it

    __str__ = str.__str__
    __format__ = str.__format__


#: Internal one-letter state codes (kept short: they are stored once per task) -> public names.
STATE_NAMES: dict[str, TaskState] = {
    "q": TaskState.QUEUED,
    "d": TaskState.DISPATCHED,
    "r": TaskState.RUNNING,
    "w": TaskState.DELAYED,
    "c": TaskState.COMPLETED,
    "x": TaskState.DEAD,
}


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task record."""

    id: str
    url: str
    task: str
    state: str  # a TaskState (a str) for every known state code
    priority: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0  # failed attempts so far
    stalls: int = 0  # leases that expired or whose holder died
    max_attempts: int = 3
    max_stalls: int = 3
    token: int = 0  # fencing token of the latest claim
    worker: str | None = None
    error: str | None = None
    previous_error: str | None = None
    created_at: float | None = None  # seconds since the epoch, Redis clock
    updated_at: float | None = None
    due_at: float | None = None
    dedup: bool = False
    #: The W3C trace context of the code that queued it (``base/tracing.py``), when it had one.
    trace: str | None = None
    host: str | None = None  # its host key while the host gate holds it (state/hosts.py), else None
    #: Its refetch schedule's state (state/schedules.py): the interval in force (seconds) and the
    #: signature of the last run's output, when it has them.
    refetch_every: float | None = None
    signature: str | None = None

    @property
    def attempt(self) -> int:
        """The 1-based number of the current (or next) attempt: failures + stalls + 1."""
        return self.attempts + self.stalls + 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, task_id: str, raw: str) -> TaskInfo:
        """Build a snapshot from a stored record. On every claim's path, so it fills the instance's
        dict in one step (a frozen dataclass's __init__ would set each of its 18 fields through
        object.__setattr__, about half of the cost)."""
        head, _, body = raw.partition("\n")
        st = _loads(head)
        # A payload of the URL alone is the bare URL; a JSON payload starts with '{' (_common.lua).
        payload = _loads(body) if body[:1] == "{" else {"u": body} if body else _EMPTY
        get = st.get
        ct, ut, due = get("ct"), get("ut"), get("due")
        info = object.__new__(cls)
        info.__dict__.update(
            id=task_id,
            url=payload.get("u", ""),
            task=get("n", DEFAULT_TASK),
            state=STATE_NAMES.get(get("s", ""), get("s", "")),
            priority=int(get("p", 0)),
            meta=payload.get("m") or {},
            attempts=int(get("a", 0)),
            stalls=int(get("st", 0)),
            max_attempts=int(get("ma", 3)),
            max_stalls=int(get("ms", 3)),
            token=int(get("k", 0)),
            worker=get("w"),
            error=get("e"),
            previous_error=get("pe"),
            created_at=None if ct is None else float(ct) / 1000.0,
            updated_at=None if ut is None else float(ut) / 1000.0,
            due_at=None if due is None else float(due) / 1000.0,
            dedup=bool(get("dd")),
            trace=payload.get("t"),
            host=get("h"),
            refetch_every=None if get("iv") is None else int(get("iv")) / 1000.0,
            signature=get("sg"),
        )
        return info


_loads = json.JSONDecoder().decode
_EMPTY: dict[str, Any] = {}
#: The task name a record leaves out (DEFAULT_TASK of _common.lua).
DEFAULT_TASK = "fetch_page"


@dataclass
class Lease:
    """Proof of a claim. Every write under it is checked against ``token`` (fencing)."""

    task_id: str
    token: int
    worker: str
    expires_at: float  # seconds since the epoch, Redis clock; updated by renew()
    task: TaskInfo
    checkpoint: dict[str, Any] | None = None
    #: The run's output verdict, handed to the completion for the refetch schedule: "" none, "="
    #: unchanged (a 304), else the signature of its output (``ctx.signature``).
    verdict: str = ""

    @property
    def url(self) -> str:
        return self.task.url

    @property
    def meta(self) -> dict[str, Any]:
        return self.task.meta


class Dispatched(NamedTuple):
    """One task the pump moved to ``dispatched``: send it one broker message."""

    task_id: str
    task: str
    priority: int
    resent: bool  # dispatched before and never claimed: its first message may still be waiting
