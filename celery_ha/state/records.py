"""What the queue hands back: task snapshots and leases."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from celery_ha.state.wait_head import WAIT_MARK, decode_wait, encode_wait


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
        object.__setattr__, about half of the cost), straight from the compact head's positions."""
        head, _, body = raw.partition("\n")
        # A payload of the URL alone is the bare URL, an https one without its scheme ("//host/p");
        # a JSON payload starts with '{' (_record_codec.lua).
        first = body[:1]
        payload = (_loads(body) if first == "{" else {"u": "https:" + body} if first == "/"
                   else {"u": body} if body else _EMPTY)
        mark = head[:1]
        if mark == "{":
            return cls._parse_json(task_id, _loads(head), payload)
        if mark == WAIT_MARK:
            return cls._parse_json(task_id, decode_wait(head, payload_host(body)), payload)
        marked = mark == HOST_MARK
        f = (head[1:] if marked else head).split(HEAD_SEP)
        if len(f) < _N_FIELDS:
            f += _PADDING[len(f):]
        # The order of HEAD_FIELDS.
        s, ct, dd, n, p, h, ma, ms, ut, k, w, _qt, a, stalls, due, e, pe, _f, iv, sg = f[:_N_FIELDS]
        letter = _LETTERS.get(s)  # a dedup task's letter is upper-case (DEDUP_LETTERS)
        state, dedup = (s, bool(dd)) if letter is None else (letter[0], letter[1] or bool(dd))
        info = object.__new__(cls)
        info.__dict__.update(
            id=task_id,
            url=payload.get("u", ""),
            task=n or DEFAULT_TASK,
            state=state,
            priority=int(p) if p else 0,
            meta=payload.get("m") or {},
            attempts=int(a) if a else 0,
            stalls=int(stalls) if stalls else 0,
            max_attempts=int(ma) if ma else 3,
            max_stalls=int(ms) if ms else 3,
            token=int(k) if k else 0,
            worker=w or None,
            error=e or None,
            previous_error=pe or None,
            created_at=float(ct) / 1000.0 if ct else None,
            updated_at=float(ut) / 1000.0 if ut else None,
            due_at=float(due) / 1000.0 if due else None,
            dedup=dedup,
            trace=payload.get("t"),
            host=payload_host(body) if marked else h or None,
            refetch_every=int(iv) / 1000.0 if iv else None,
            signature=sg or None,
        )
        return info

    @classmethod
    def _parse_json(cls, task_id: str, st: dict[str, Any], payload: dict[str, Any]) -> TaskInfo:
        """The snapshot of a record whose head is JSON (earlier releases, or a value the compact
        head cannot hold), or of the state a waiting head decodes to."""
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


#: The fields of the compact state head, in their fixed order: the one source of truth with
#: HEAD_FIELDS of _record_codec.lua (tests/state/test_compact_head.py checks that the two agree). A
#: compact head is these values (strings, as the JSON head held them: timestamps in decimal ms)
#: joined by HEAD_SEP, an absent field empty, trailing empties left out; fields are only ever added
#: at the end. The dedup flag is folded into the state letter: a dedup task's (dd "1") is written
#: upper-case (DEDUP_LETTERS) with dd left empty, so a freshly queued dedup task's head is
#: "Q<1F>1733333333333"; a head with dd "1" and a lower-case letter (earlier releases) reads the same.
#: A head that starts with '{' is the JSON object of earlier releases (or of a state the compact head
#: cannot hold: a value that is empty, or holds HEAD_SEP or a newline, an unknown field, a state
#: that starts with '{' or is an upper-case letter).
HEAD_FIELDS = ("s", "ct", "dd", "n", "p", "h", "ma", "ms", "ut", "k", "w", "qt", "a", "st", "due",
               "e", "pe", "f", "iv", "sg")
HEAD_SEP = "\x1f"
#: A state's letter -> a dedup task's letter in a compact head (DD_UP of _record_codec.lua).
DEDUP_LETTERS = {"q": "Q", "d": "D", "r": "R", "w": "W", "c": "C", "x": "X"}
_UNFOLD = {up: low for low, up in DEDUP_LETTERS.items()}
#: A compact head's letter -> (public state, dedup).
_LETTERS = {**{low: (STATE_NAMES[low], False) for low in DEDUP_LETTERS},
            **{up: (STATE_NAMES[low], True) for low, up in DEDUP_LETTERS.items()}}
_N_FIELDS = len(HEAD_FIELDS)
_PADDING = [""] * _N_FIELDS


#: A compact head that starts with it leaves the host key out: it is the host its bare-URL payload
#: names (HOST_MARK and payload_host of _record_codec.lua).
HOST_MARK = "~"
_PAYLOAD_HOST = re.compile(r"(?://|[A-Za-z][A-Za-z0-9+.\-]*://)([^/?#]*)")


def payload_host(payload: str) -> str | None:
    """The host a bare-URL payload names, as written (``payload_host`` of _record_codec.lua)."""
    if payload[:1] == "{":
        return None
    match = _PAYLOAD_HOST.match(payload)
    return match.group(1) if match else None


def decode_head(head: str) -> dict[str, str]:
    """The state part of a record (its first line), compact, waiting or JSON, as the JSON head holds
    it: field -> string, the task name left out at its default, a dedup task's lower-case letter and
    dd "1" (a position past HEAD_FIELDS, a later release's, is named by its 1-based number). A head
    that leaves the host key to its payload (HOST_MARK) gives ``h`` as HOST_MARK: :func:`decode_state`
    reads the whole record and gives the host."""
    if head[:1] == "{":
        return _loads(head)
    if head[:1] == WAIT_MARK:
        return decode_wait(head, HOST_MARK)
    marked = head[:1] == HOST_MARK
    st = {HEAD_FIELDS[j] if j < _N_FIELDS else str(j + 1): value
          for j, value in enumerate((head[1:] if marked else head).split(HEAD_SEP)) if value}
    if marked:
        st["h"] = HOST_MARK
    low = _UNFOLD.get(st.get("s", ""))
    if low is not None:
        st["s"], st["dd"] = low, "1"
    return st


def decode_state(raw: str) -> dict[str, str]:
    """The state part of a whole record (head and payload), the host key given in full."""
    head, _, payload = raw.partition("\n")
    st = decode_head(head)
    if st.get("h") == HOST_MARK:
        host = payload_host(payload)
        if host:
            st["h"] = host
    return st


def encode_head(st: dict[str, str], payload: str | None = None) -> str:
    """The head ``encode()`` of _record_codec.lua writes for ``st`` (tests, tooling): the waiting head
    for a finished state with ``iv`` when it holds every value, else the same compact head when it
    can hold every field, else a JSON head (escaped as json.dumps does, not as cjson). ``payload``:
    the record's, for the waiting head's host form (without it ``h`` is written in full); the compact
    head's HOST_MARK is the unrolled way's only, which this does not write."""
    st = {k: v for k, v in st.items() if not (k == "n" and v == DEFAULT_TASK)}
    if "iv" in st and st.get("s") in ("c", "x"):
        head = encode_wait(st, None if payload is None else payload_host(payload))
        if head is not None:
            return head
    vals = [""] * _N_FIELDS
    for name, value in st.items():
        if (name not in HEAD_FIELDS or not isinstance(value, str) or not value or HEAD_SEP in value
                or "\n" in value):
            return json.dumps(st, separators=(",", ":"), ensure_ascii=False)
        vals[HEAD_FIELDS.index(name)] = value
    if vals[0][:1] in ("{", WAIT_MARK, HOST_MARK) or vals[0] in _UNFOLD:
        return json.dumps(st, separators=(",", ":"), ensure_ascii=False)
    if vals[2] == "1" and vals[0] in DEDUP_LETTERS:
        vals[0], vals[2] = DEDUP_LETTERS[vals[0]], ""
    while vals and not vals[-1]:
        vals.pop()
    return HEAD_SEP.join(vals)


_loads = json.JSONDecoder().decode
_EMPTY: dict[str, Any] = {}
#: The task name a record leaves out (DEFAULT_TASK of _record_codec.lua).
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
    #: ``time.monotonic()`` before which the lease is certainly still held: when its last grant or
    #: renewal was sent, plus its length (Redis set the expiry from its own later "now"); 0: unknown.
    #: Lets a caller skip a read of the record where it only guards against a lost lease.
    held_until: float = 0.0

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
