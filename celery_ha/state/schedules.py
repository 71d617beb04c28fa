"""Refetch schedules: a finished task runs again when its time comes, set once in Redis for everyone.

A schedule belongs to a task name (``crawl_list`` daily, ``fetch_page`` weekly), to a host (every task
of ``news.example`` hourly), or to both (``fetch_page`` on ``news.example``); the most specific one
applies. Schedules live in Redis, not in the processes, so every worker, beat and CLI agree: each shard
holds a copy (its scripts may read only keys of their own slot), written by :meth:`set_schedule`.

What happens (``_refetch.lua``): at each completion the script looks up the task's schedule and, if it
has one, keeps the interval in the record and the completed record itself (the history's trim no longer
deletes it: it is what queues the run again, at its completion time plus the interval), and indexes it
by its record bucket in the shard's refetch index (``rfb``: per bucket of 16-32 records, a lower bound
of their due times; ``state/refetch_index.py``). The maintenance sweep calls :meth:`refetch_due`,
which reads the due buckets and queues their due runs (bounded per call) at the back of their band or
through their host's queue, so the host gate paces refetches like any other work, however old the
completion. A waiting dedup task's id is not remembered apart (``_remembered.lua``): its record is the
dedup memory while it waits.

A scheduled run that dies for a reason that may pass — its attempts spent on retryable errors (a site
down for a while), or its stalls past ``max_stalls`` — keeps its next regular run: it stays in
``dead`` (listed, counted, redrivable) and waits for its run one interval after its death, as a
completion without a verdict would schedule it (the schedule in force: an unset one, or ``every=0``,
ends it); when due, :meth:`refetch_due` queues it as a new run (out of ``dead``, attempts and stalls
reset, its last error kept as the previous one). A permanent failure (a 404/410, a robots.txt refusal,
``PermanentError``: a failure without retry) and a cancel end the schedule, as a redrive replaces the
waiting run by the redriven one: a task waits exactly while its record is completed or dead and
keeps its interval (a final failure clears it).

Adaptive schedules follow Nutch's AdaptiveFetchSchedule: the run's output verdict — ``ctx.signature``
(a digest of the page, or of the emitted items) compared with the previous run's, or a 304 to a
conditional request — multiplies the interval by 1.4 when unchanged and by 0.8 when changed, within
[min, max]. A run without a verdict keeps the interval.

Memory: a scheduled task keeps its record while it waits (~170 B with a 60-character URL), plus a few
bytes of the index per record; an unscheduled finished URL is only a dedup id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import check_host_key
from celery_ha.base.validation import check_int, check_task_name, parse_duration
from celery_ha.redisio.scripts import eval_script
from celery_ha.state.keys import QueueKeys
from celery_ha.state.refetch_index import pending, waiting_ids

#: Shortest interval a schedule may have (seconds).
MIN_INTERVAL = 1.0
#: An adaptive schedule's bounds when not given: a quarter of the interval, and eight times it.
ADAPT_LOW, ADAPT_HIGH = 0.25, 8.0
_HERE = Path(__file__).parent
HOSTS_FLAG = "_h"  # present in the sched hash while any host entry exists (_refetch.lua reads it)


@dataclass(frozen=True)
class Schedule:
    """One refetch schedule: for ``task`` (None: every task), on ``host`` (None: every host)."""

    task: str | None
    host: str | None
    every: float  # seconds; 0 = never refetch (an exception to a broader schedule)
    min_every: float
    max_every: float
    adaptive: bool

    @property
    def field(self) -> str:
        return schedule_field(self.task, self.host)

    def encoded(self) -> str:
        return f"{int(self.every)}|{int(self.min_every)}|{int(self.max_every)}|{int(self.adaptive)}"

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task, "host": self.host, "every": self.every, "min_every": self.min_every,
                "max_every": self.max_every, "adaptive": self.adaptive}


def schedule_field(task: str | None, host: str | None) -> str:
    """The ``sched`` hash field of a schedule (must match schedule_of() in _refetch.lua)."""
    if task is not None and host is not None:
        return f"t:{task}@{host}"
    if task is not None:
        return f"t:{task}"
    if host is not None:
        return f"h:{host}"
    raise InvalidInput("a schedule needs a task name, a host, or both")


def _parse(field: str, value: str) -> Schedule | None:
    kind, _, rest = field.partition(":")
    parts = value.split("|")
    if kind not in ("t", "h") or len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    task, host = (rest.partition("@")[0], rest.partition("@")[2] or None) if kind == "t" else (None, rest)
    every, low, high, adapt = parts
    return Schedule(task, host, float(every), float(low), float(high), adapt == "1")


def make_schedule(task: str | None, host: str | None, every: float | str, min_every: float | str | None,
                  max_every: float | str | None, adaptive: bool) -> Schedule:
    """A checked schedule: durations as seconds or "15m", "1d", "2w"; bounds defaulted (see module)."""
    task = None if task is None else check_task_name(task)
    host = None if host is None else check_host_key(host)
    schedule_field(task, host)
    seconds = parse_duration(every, "every")
    if seconds == 0:
        return Schedule(task, host, 0.0, 0.0, 0.0, False)
    if seconds < MIN_INTERVAL:
        raise InvalidInput(f"every must be at least {MIN_INTERVAL:g} seconds (or 0: never), got {every!r}")
    low = parse_duration(min_every, "min_every") if min_every is not None else (
        max(MIN_INTERVAL, seconds * ADAPT_LOW) if adaptive else seconds)
    high = parse_duration(max_every, "max_every") if max_every is not None else (
        seconds * ADAPT_HIGH if adaptive else seconds)
    if not (MIN_INTERVAL <= low <= seconds <= high):
        raise InvalidInput(f"a schedule needs {MIN_INTERVAL:g} s <= min_every <= every <= max_every, got "
                           f"min {low:g} s, every {seconds:g} s, max {high:g} s")
    if not adaptive and (low, high) != (seconds, seconds):
        raise InvalidInput("min_every and max_every bound an adaptive schedule: add adaptive=True")
    return Schedule(task, host, round(seconds), round(low), round(high), bool(adaptive))


class ScheduleOps:
    """Schedules and scheduled runs; a mixin of :class:`TaskQueue` (which provides the attributes)."""

    shard_count: int
    client: Any
    _shards: list[QueueKeys]
    _run: Callable[..., Any]
    _ensure_layout: Callable[[], None]

    def set_schedule(self, task: str | None = None, host: str | None = None, *, every: float | str,
                     min_every: float | str | None = None, max_every: float | str | None = None,
                     adaptive: bool = False) -> Schedule:
        """Refetch tasks named ``task`` (and/or on ``host``) ``every`` seconds (or "1d", "1w") after
        each completion; ``adaptive`` moves the interval within [min_every, max_every] by whether the
        output changed. ``every=0`` means never (an exception to a broader schedule). Applies from
        each task's next completion; returns the stored schedule."""
        schedule = make_schedule(task, host, every, min_every, max_every, adaptive)
        self._ensure_layout()  # a copy on each shard of the namespace's layout, not of this process's
        pipe = self.client.pipeline(transaction=False)
        for keys in self._shards:
            pipe.hset(keys.schedules, schedule.field, schedule.encoded())
            if schedule.host is not None:
                pipe.hset(keys.schedules, HOSTS_FLAG, "1")
        pipe.execute()
        return schedule

    def unset_schedule(self, task: str | None = None, host: str | None = None) -> bool:
        """Remove a schedule (tasks already waiting for a run keep it; later completions do not
        schedule one). Returns whether it existed."""
        task = None if task is None else check_task_name(task)
        host = None if host is None else check_host_key(host)
        field = schedule_field(task, host)
        self._ensure_layout()
        existed = False
        for keys in self._shards:  # one script per shard: a host schedule set meanwhile keeps its flag
            existed = bool(eval_script(self.client, _HERE, "schedule_unset", [keys.schedules],
                                       [field, HOSTS_FLAG])) or existed
        return existed

    def schedules(self) -> list[Schedule]:
        """Every schedule (from the first shard: each holds the same copy), task ones first."""
        self._ensure_layout()
        raw = self.client.hgetall(self._shards[0].schedules)
        out = [s for f, v in raw.items() if f != HOSTS_FLAG and (s := _parse(f, v)) is not None]
        return sorted(out, key=lambda s: (s.task is None, s.task or "", s.host or ""))

    def refetch_due(self, limit: int = 250, max_calls: int = 40) -> int:
        """Queue the scheduled runs whose time came (the sweep calls it): at most ``limit`` per script
        call, which reads due record buckets until ``limit`` * 4 records were looked at (short calls:
        other clients wait behind each), and ``max_calls`` calls per shard. Returns how many were
        queued."""
        limit = check_int("limit", limit, 1, 10_000)
        calls = check_int("max_calls", max_calls, 1, 1_000_000)
        total = 0
        for shard in range(self.shard_count):
            for _ in range(calls):
                queued, _dropped, more = (int(x) for x in self._run("refetch_due", limit, shard=shard))
                total += queued
                if not more:
                    break
        return total

    def refetch_pending(self) -> dict[str, int]:
        """How many runs wait for their time (``waiting``, dead scheduled tasks' included: exact) and
        how many are due now (``due``: exact while at most 64 record buckets per shard are due, else
        an estimate, see ``state/refetch_index.py``)."""
        self._ensure_layout()
        return pending(self.client, self._shards)

    def refetch_ids(self) -> Iterator[str]:
        """Ids of every task waiting for a scheduled run, read in pages of record buckets (the recrawl
        verb's selections read them with the completed history)."""
        self._ensure_layout()
        for keys in self._shards:
            yield from waiting_ids(self.client, keys)
