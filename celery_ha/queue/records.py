"""What the queue hands back: task snapshots and leases."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

#: Internal one-letter state codes (kept short: they are stored once per task) -> public names.
STATE_NAMES = {
    "q": "queued",
    "d": "dispatched",
    "r": "running",
    "w": "delayed",
    "c": "completed",
    "x": "dead",
}


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task record."""

    id: str
    url: str
    task: str
    state: str
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

    @property
    def attempt(self) -> int:
        """The 1-based number of the current (or next) attempt: failures + stalls + 1."""
        return self.attempts + self.stalls + 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, task_id: str, raw: str) -> TaskInfo:
        head, _, body = raw.partition("\n")
        st = json.loads(head)
        payload = json.loads(body) if body else {}

        def secs(key: str) -> float | None:
            v = st.get(key)
            return None if v is None else float(v) / 1000.0

        return cls(
            id=task_id,
            url=payload.get("u", ""),
            task=st.get("n", ""),
            state=STATE_NAMES.get(st.get("s", ""), st.get("s", "")),
            priority=int(st.get("p", 0)),
            meta=payload.get("m", {}),
            attempts=int(st.get("a", 0)),
            stalls=int(st.get("st", 0)),
            max_attempts=int(st.get("ma", 3)),
            max_stalls=int(st.get("ms", 3)),
            token=int(st.get("k", 0)),
            worker=st.get("w"),
            error=st.get("e"),
            previous_error=st.get("pe"),
            created_at=secs("ct"),
            updated_at=secs("ut"),
            due_at=secs("due"),
            dedup=bool(st.get("dd")),
        )


@dataclass
class Lease:
    """Proof of a claim. Every write under it is checked against ``token`` (fencing)."""

    task_id: str
    token: int
    worker: str
    expires_at: float  # seconds since the epoch, Redis clock; updated by renew()
    task: TaskInfo
    checkpoint: dict[str, Any] | None = None

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
