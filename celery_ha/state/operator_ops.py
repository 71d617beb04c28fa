"""The operator's transitions (cancel, redrive, recrawl) and dedup upkeep, as a base class of
:class:`~celery_ha.state.taskqueue.TaskQueue` (which keeps the worker's path).

Dedup remembers each finished dedup id with its completion hour, in compact buckets (``_remembered.lua``).
With a dedup TTL (the queue's ``dedup_ttl``, ``CELERY_HA_DEDUP_TTL``) a URL finished longer ago than that
is no longer a duplicate: enqueueing it again starts a new run (``enqueue.lua``), and the sweep forgets
such ids once the completed history let go of their records, so the remembered ids stay bounded by what
finished within the TTL. ``recrawl`` re-queues completed tasks on demand, whatever their age.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import redis

from celery_ha.base import tracing
from celery_ha.base.validation import MAX_ERROR_CHARS, check_int, clean_message, iter_many, parse_duration
from celery_ha.state.carried import META_FIELD as CARRY_FIELD
from celery_ha.state.carried import set_carries
from celery_ha.state.enqueue_args import MAX_BATCH, SCRIPT_BATCH
from celery_ha.state.keys import QueueKeys
from celery_ha.state.queue_reads import _task_id
from celery_ha.state.records import STATE_NAMES
from celery_ha.state.replies import Refusal, raise_for, refused
from celery_ha.state.sharded import by_shard

#: recrawl()'s answer per id, from recrawl.lua's reply characters.
RECRAWL_RESULTS = {"1": "queued", "0": "not completed", "?": "unknown"}
NEVER = -1  # the scripts' "no expiry"


def expiry_ms(seconds: float | str | None, what: str = "dedup_ttl") -> int:
    """A dedup expiry (seconds, or a duration such as "7d") in whole ms for the scripts; None -> -1."""
    return NEVER if seconds is None else int(parse_duration(seconds, what) * 1000)


class OperatorOps:
    """Cancel, redrive, recrawl and dedup upkeep of one namespace (every shard); TaskQueue provides
    the attributes."""

    client: redis.Redis
    namespace: str
    keys: QueueKeys  # shard 0's (the namespace's own tag: its meta hash)
    shard_count: int
    dedup_ttl: float | None
    _run: Callable[..., Any]
    _of: Callable[[str], int]
    get_many: Callable[..., Any]

    def _traced(self, name: str, task_ids: list[str], **attributes: Any) -> None:
        """A span per task in its own trace (``base/tracing.py``), when tracing is on: one read of the
        tasks' records, only then."""
        if not task_ids or not tracing.enabled():
            return
        for info in self.get_many(task_ids):
            if info is not None:
                tracing.task_event(name, info.trace, {"celery_ha.task_id": info.id,
                                                      "celery_ha.task": info.task,
                                                      "celery_ha.namespace": self.namespace, **attributes})

    def recrawl(self, task_ids: Iterable[str]) -> dict[str, str]:
        """Queue completed tasks again as new runs (same URL, meta and task; attempts cleared), each at
        the back of its band. Returns ``{id: "queued" | "not completed" | "unknown"}``: a task that is
        live or dead is left alone, and an id the history no longer holds is unknown (enqueue its URL
        again: with a dedup TTL it is not a duplicate once that much time passed).

        At most ``SCRIPT_BATCH`` ids per script call, as enqueue: a task queued again costs about what
        an enqueued one does, and 10,000 in one call kept every other client (claims, renewals,
        heartbeats) waiting ~0.5 s; 50 keep a call at a few ms (README "Short scripts")."""
        ids = list(dict.fromkeys(_task_id(t) for t in iter_many("task ids", task_ids)))
        results: dict[str, str] = {}
        for shard, at in by_shard(ids, self.shard_count).items():
            for start in range(0, len(at), SCRIPT_BATCH):
                part = [ids[a] for a in at[start:start + SCRIPT_BATCH]]
                codes = self._run("recrawl", *part, shard=shard)
                if isinstance(codes, bytes):
                    codes = codes.decode()
                results.update((tid, RECRAWL_RESULTS[c]) for tid, c in zip(part, codes, strict=True))
        self._traced("celery_ha.recrawl", [tid for tid in ids if results[tid] == "queued"])
        return {tid: results[tid] for tid in ids}

    def forget_finished(self, batch: int = 1_000, max_batches: int = 100) -> int:
        """Dedup upkeep, called by the maintenance sweep: forget finished ids older than the dedup
        TTL whose record has left the completed history, and move the older layouts into the buckets
        (the sorted set ``done`` with its times; the 0.1 releases' dedup set as finished now). Bounded
        per call (``max_batches`` script calls per shard, each examining at most ``batch`` ids: 1,000
        keeps a call that forgets them all at a few ms, so claims never wait long behind it; a pass
        over the buckets may span sweeps); returns how many ids were forgotten or moved."""
        batch = check_int("batch", batch, 1, MAX_BATCH)
        rounds = check_int("max_batches", max_batches, 1, 1_000_000)
        ttl = expiry_ms(self.dedup_ttl)
        total = 0
        for shard in range(self.shard_count):
            for _ in range(rounds):
                reply = self._run("forget_finished", ttl, batch, shard=shard)
                forgotten, moved, more = (int(x) for x in reply)
                total += forgotten + moved
                if not more:
                    break
        return total + self._forget_carried(ttl, batch, rounds) if ttl >= 0 else total

    def _forget_carried(self, ttl: int, batch: int, rounds: int) -> int:
        """Forget the carried ids (``state/carried.py``) older than the dedup TTL, bounded as
        :meth:`forget_finished`; once no shard carries any, drop the namespace's ``carry`` list, so
        its enqueues look nothing up any more. Nothing while a migration into it is under way (it
        may still write carried ids), nor in a namespace that carries none (one read)."""
        carry, migrating = self.client.hmget(self.keys.meta, [CARRY_FIELD, "migrating_from"])
        if not carry or migrating:
            return 0
        total, empty = 0, 0
        for shard in range(self.shard_count):
            for _ in range(rounds):
                forgotten, more, none = (int(x) for x in self._run("forget_carried", ttl, batch, shard=shard))
                total += forgotten
                if not more:
                    empty += none
                    break
        if empty == self.shard_count:
            set_carries(self.client, self.namespace, [])
        return total

    def cancel(self, task_id: str, reason: str = "by the operator") -> str | None:
        """End a task as dead with ``cancelled: <reason>`` (redrive brings it back); a running one
        stops at its holder's next fenced write. Returns the state it left, or None when it had
        already finished (completed or dead); TaskNotFound for an unknown id."""
        task_id = _task_id(task_id)
        reply = self._run("cancel", task_id, clean_message(reason, MAX_ERROR_CHARS), shard=self._of(task_id))
        if refused(reply):
            if reply == Refusal.UNKNOWN:
                raise_for(reply, task_id, namespace=self.namespace)
            return None
        left = str(STATE_NAMES[str(reply)])
        self._traced("celery_ha.cancel", [task_id], **{"celery_ha.reason": reason, "celery_ha.left": left})
        return left

    def redrive(self, task_id: str | None = None, batch: int = SCRIPT_BATCH) -> int:
        """Move one dead task (or all of them) back to the queue with attempts and stalls reset.

        Returns how many moved: for one id 1, or 0 when that task is not dead. An unknown id raises
        TaskNotFound; the script tells the cases apart, so no second lookup races the redrive. All of
        them move ``batch`` per script call: ``SCRIPT_BATCH`` by default, so no call keeps other
        clients waiting long (README "Short scripts"; 1,000 a call took tens of ms).
        """
        batch = check_int("batch", batch, 1, MAX_BATCH)
        if task_id is not None:
            task_id = _task_id(task_id)
            moved = self._run("redrive", task_id, 1, shard=self._of(task_id))
            if refused(moved):
                if moved == Refusal.UNKNOWN:
                    raise_for(moved, task_id, namespace=self.namespace)
                return 0
            self._traced("celery_ha.redrive", [task_id])
            return int(moved)
        total = 0
        named = tracing.enabled()  # the script names the tasks it moved: a span for each
        for shard in range(self.shard_count):
            while True:
                reply = self._run("redrive", "", int(batch), "1" if named else "0", shard=shard)
                if named:
                    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in reply]
                    self._traced("celery_ha.redrive", ids)
                    moved = len(ids)
                else:
                    moved = int(reply)
                total += moved
                if moved < batch:
                    break
        return total
