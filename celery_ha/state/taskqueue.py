"""The durable task layer: a fenced, lease-based task state machine in Redis.

Every transition is one Lua script (see the ``.lua`` files beside this module), so a crash at any
instant leaves each task in exactly one state structure. Leases carry a fencing token that grows with
every claim: a holder whose lease was reclaimed can no longer renew, checkpoint, commit, complete or
fail. All times come from the Redis server clock.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis

from celery_ha.base.errors import InvalidInput, LeaseLost, TaskNotFound
from celery_ha.base.settings import Settings
from celery_ha.base.validation import (
    MAX_CHECKPOINT_BYTES,
    MAX_ERROR_CHARS,
    MAX_ITEM_BYTES,
    MAX_META_BYTES,
    PRIORITY_RANGE,
    canonical_url,
    check_int,
    check_task_name,
    check_url,
    dumps_capped,
    simple_canonical_url,
)
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.scripts import ScriptSet
from celery_ha.state.keys import QueueKeys
from celery_ha.state.records import Dispatched, Lease, TaskInfo

_HERE = Path(__file__).parent
MAX_BATCH = 10_000


_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ID_LEN = 12  # ~71 bits: collision-free in practice, and 12 chars fit Redis' 16-byte allocation
# Byte -> alphanumeric character (byte mod 62), so an id is one C-level translate of 12 random or
# digest bytes. The first 8 characters are slightly likelier (5/256 vs 4/256): 5.95 bits per char.
_BYTE_TO_CHAR = bytes(ord(_ALPHABET[b % len(_ALPHABET)]) for b in range(256))


def _encode_id(raw: bytes) -> str:
    return raw[:_ID_LEN].translate(_BYTE_TO_CHAR).decode("ascii")


def _dedup_id(task: str, canonical: str) -> str:
    return _encode_id(hashlib.sha256(f"{task}\0{canonical}".encode()).digest())


def task_id_for(task: str, url: str) -> str:
    """The dedup id of (task, url): SHA-256 of the canonical URL as 12 alphanumeric chars."""
    canonical = simple_canonical_url(url)
    return _dedup_id(task, canonical_url(url) if canonical is None else canonical)


def _random_id() -> str:
    return _encode_id(secrets.token_bytes(_ID_LEN))


_SPEC_FIELDS = frozenset({"url", "task", "priority", "meta", "dedup", "max_attempts", "max_stalls"})


def _grouped(rows: list[list[Any]]) -> list[Any]:
    """ARGV of enqueue.lua: runs of consecutive rows sharing (priority, dedup, task, max_attempts,
    max_stalls) become one header ``count, priority, dedup, task, max_attempts, max_stalls`` followed by
    ``id, payload`` per row, so the common fields travel (and are encoded by Lua) once per run."""
    args: list[Any] = []
    current = None
    at = 0
    for tid, priority, dedup, task, ma, ms, body in rows:
        head = (priority, dedup, task, ma, ms)
        if head != current:
            current = head
            at = len(args)
            args += [0, priority, dedup, task, ma, ms]
        args[at] += 1
        args += (tid, body)
    return args


class TaskQueue:
    """Client of one namespace of the durable task layer.

    Safe to share between threads (redis-py pools connections). In a forked child, build a new one.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str = "default",
        *,
        lease_ttl: float = 30.0,
        max_attempts: int = 3,
        max_stalls: int = 3,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        history_max: int = 10_000,
        history_age: float = 86_400.0,
        checkpoint_cap: int = MAX_CHECKPOINT_BYTES,
        meta_cap: int = MAX_META_BYTES,
        default_task: str = Settings.default_task,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.keys = QueueKeys(namespace)
        self.lease_ttl = float(lease_ttl)
        self.max_attempts = check_int("max_attempts", max_attempts, 1, 1000)
        self.max_stalls = check_int("max_stalls", max_stalls, 0, 1000)
        self.backoff_base = float(backoff_base)
        self.backoff_cap = float(backoff_cap)
        self.history_max = int(history_max)
        self.history_age = float(history_age)
        self.checkpoint_cap = int(checkpoint_cap)
        self.meta_cap = int(meta_cap)
        self.default_task = check_task_name(default_task)
        self._scripts = ScriptSet(client, _HERE)
        k = self.keys
        self._keys = [k.tasks, k.ready_bands, k.delayed, k.inflight, k.running, k.dead, k.completed,
                      k.seen, k.checkpoints, k.stats, k.wake]

    @classmethod
    def from_url(cls, url: str, namespace: str = "default", **options: Any) -> TaskQueue:
        return cls(redis_client(url), namespace, **options)

    @classmethod
    def for_settings(cls, client: redis.Redis, settings: Settings, namespace: str | None = None) -> TaskQueue:
        """The queue of ``namespace`` (default: the settings') with the settings' lease and limits."""
        return cls(client, namespace or settings.namespace, lease_ttl=settings.lease_ttl,
                   max_attempts=settings.max_attempts, max_stalls=settings.max_stalls,
                   default_task=settings.default_task)

    def _run(self, script: str, *args: Any, keys: list[str] | None = None) -> Any:
        return getattr(self._scripts, script)(keys=keys or self._keys, args=[self.keys.prefix, *args])

    # ------------------------------------------------------------------ enqueue
    def _prepare(self, url: str, task: str, priority: int, meta: Mapping[str, Any] | None, dedup: bool,
                 max_attempts: int | None, max_stalls: int | None) -> list[Any]:
        canonical = simple_canonical_url(url)
        if canonical is None:
            check_url(url)
        check_task_name(task)
        check_int("priority", priority, *PRIORITY_RANGE)
        ma = self.max_attempts if max_attempts is None else check_int("max_attempts", max_attempts, 1, 1000)
        ms = self.max_stalls if max_stalls is None else check_int("max_stalls", max_stalls, 0, 1000)
        # The payload is the compact JSON {"u": url[, "m": meta]}, assembled from its parts (the same
        # text json.dumps gives for that dict): a simple URL needs no escaping, meta is encoded once.
        url_json = f'"{url}"' if canonical is not None else json.dumps(url, ensure_ascii=False)
        body = f'{{"u":{url_json}}}'
        if meta is not None:
            meta_json = dumps_capped("meta", meta, self.meta_cap)
            if meta:
                body = f'{{"u":{url_json},"m":{meta_json}}}'
        if dedup:
            tid = _dedup_id(task, canonical_url(url) if canonical is None else canonical)
        else:
            tid = _random_id()
        return [tid, priority, "1" if dedup else "0", task, ma, ms, body]

    def enqueue(self, url: str, task: str | None = None, priority: int = 0,
                meta: Mapping[str, Any] | None = None, dedup: bool = True,
                max_attempts: int | None = None, max_stalls: int | None = None) -> str:
        """Queue one task and return its id; a duplicate (same task + canonical URL) returns the
        existing id and counts in ``stats()['duplicates']``."""
        return self.enqueue_many([{"url": url, "task": task, "priority": priority, "meta": meta,
                                   "dedup": dedup, "max_attempts": max_attempts,
                                   "max_stalls": max_stalls}])[0]

    def enqueue_many(self, specs: Iterable[str | Mapping[str, Any]], *, task: str | None = None,
                     priority: int = 0, dedup: bool = True, batch_size: int = 1000) -> list[str]:
        """Queue many tasks, one round trip per batch. Each spec is a URL or a dict with the keyword
        arguments of :meth:`enqueue`. Every spec is validated before anything is written."""
        return [tid for tid, _ in self.enqueue_many_with_status(
            specs, task=task, priority=priority, dedup=dedup, batch_size=batch_size)]

    def enqueue_many_with_status(self, specs: Iterable[str | Mapping[str, Any]], *,
                                 task: str | None = None, priority: int = 0, dedup: bool = True,
                                 batch_size: int = 1000) -> list[tuple[str, bool]]:
        """Like :meth:`enqueue_many`, with each id paired with True when this call created the task
        and False when it was a duplicate (decided atomically by the server, not by a pre-check)."""
        rows: list[list[Any]] = []
        for spec in specs:
            if isinstance(spec, str):
                spec = {"url": spec}
            elif not isinstance(spec, Mapping):
                raise InvalidInput(f"each task must be a URL or a dict, got {type(spec).__name__}")
            unknown = spec.keys() - _SPEC_FIELDS
            if unknown:
                raise InvalidInput(f"unknown task field(s): {', '.join(sorted(unknown))}")
            if "url" not in spec:
                raise InvalidInput("task spec has no 'url'")
            rows.append(self._prepare(
                spec["url"], spec.get("task") or task or self.default_task,
                priority if spec.get("priority") is None else spec["priority"], spec.get("meta"),
                dedup if spec.get("dedup") is None else bool(spec["dedup"]),
                spec.get("max_attempts"), spec.get("max_stalls")))
        batch_size = max(1, min(int(batch_size), MAX_BATCH))
        created: dict[int, bool] = {}
        for start in range(0, len(rows), batch_size):
            pending = list(range(start, min(start + batch_size, len(rows))))
            while pending:
                codes = self._run("enqueue", *_grouped([rows[i] for i in pending]))
                if isinstance(codes, bytes):
                    codes = codes.decode()
                # One char per task: '1' new, '0' duplicate, '-' a random id met an existing one
                # (astronomically rare): retried with a new id.
                created.update((i, code == "1") for i, code in zip(pending, codes, strict=True))
                pending = [i for i, code in zip(pending, codes, strict=True) if code == "-"]
                for i in pending:
                    rows[i][0] = _random_id()
        return [(row[0], created[i]) for i, row in enumerate(rows)]

    # ------------------------------------------------------------------ leases
    def _lease(self, reply: list[Any] | None, worker: str) -> Lease | None:
        if not reply:
            return None
        tid, token, expiry, raw, ckpt = reply
        info = TaskInfo.parse(tid, raw)
        return Lease(task_id=tid, token=int(token), worker=worker, expires_at=int(expiry) / 1000.0,
                     task=info, checkpoint=json.loads(ckpt) if ckpt else None)

    def _ttl_ms(self, ttl: float | None) -> int:
        return int((self.lease_ttl if ttl is None else ttl) * 1000)

    def claim(self, task_id: str, worker: str, ttl: float | None = None) -> Lease | None:
        """Claim a queued or dispatched task; None when it is not claimable (running elsewhere,
        delayed, completed, dead or unknown) — a Celery message for it should then be dropped."""
        return self._lease(self._run("claim", task_id, worker, self._ttl_ms(ttl)), worker)

    def claim_next(self, worker: str, ttl: float | None = None, wait: float = 0.0) -> Lease | None:
        """Claim the best queued task (highest priority, then FIFO); standalone mode, no Celery.

        With ``wait`` > 0, block up to that many seconds for work: idle callers sleep on a wake-up
        list that enqueue, reclaim and redrive feed, and re-check at least once a second (due
        retries). The claim itself is atomic, so no task is ever handed to two callers.
        """
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            lease = self._lease(self._run("claim_next", worker, self._ttl_ms(ttl), 100), worker)
            if lease is not None:
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.client.blpop([self.keys.wake], timeout=max(0.01, min(remaining, 1.0)))

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Extend the lease; raise LeaseLost if it is no longer the task's current lease."""
        expiry = self._run("renew", lease.task_id, lease.token, self._ttl_ms(ttl))
        if not expiry:
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")
        lease.expires_at = int(expiry) / 1000.0
        return lease

    def save_checkpoint(self, lease: Lease, checkpoint: Mapping[str, Any]) -> None:
        """Store the task's resume point (JSON object, capped) under the lease."""
        text = dumps_capped("checkpoint", checkpoint, self.checkpoint_cap)
        if not self._run("checkpoint", lease.task_id, lease.token, text):
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")
        lease.checkpoint = json.loads(text)

    def commit(self, lease: Lease, items: Iterable[tuple[str, Mapping[str, Any]]],
               checkpoint: Mapping[str, Any] | None = None) -> int:
        """Store keyed output items and (optionally) the checkpoint in one fenced step.

        A key the sink already holds is ignored, so re-running a page never doubles its output.
        Returns how many items were new; raises LeaseLost (and writes nothing) if the lease is lost.
        """
        args: list[Any] = [lease.task_id, lease.token,
                           "" if checkpoint is None else dumps_capped("checkpoint", checkpoint,
                                                                      self.checkpoint_cap)]
        for key, item in items:
            if not isinstance(key, str) or not key or len(key) > 512:
                raise InvalidInput(f"item key must be a non-empty string of at most 512 chars: {key!r}")
            args += [key, dumps_capped("item", item, MAX_ITEM_BYTES)]
        added = self._run("commit", *args, keys=[*self._keys, self.keys.items, self.keys.item_log])
        if added is False or added is None:
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")
        if checkpoint is not None:
            lease.checkpoint = dict(checkpoint)
        return int(added)

    def complete(self, lease: Lease) -> None:
        """Mark the task completed (clears its checkpoint); LeaseLost if the lease is not current."""
        ok = self._run("complete", lease.task_id, lease.token, self.history_max,
                       int(self.history_age * 1000))
        if not ok:
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")

    def complete_and_claim(self, lease: Lease, worker: str | None = None, ttl: float | None = None
                           ) -> Lease | None:
        """Complete ``lease``'s task and claim the next queued one in the same script: one round trip
        per task for a busy standalone worker. Returns the next lease, or None when the queue is empty;
        raises LeaseLost (and changes nothing) if ``lease`` is not current."""
        worker = lease.worker if worker is None else worker
        reply = self._run("complete_next", lease.task_id, lease.token, self.history_max,
                          int(self.history_age * 1000), worker, self._ttl_ms(ttl), 100)
        if not int(reply[0]):
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")
        return self._lease(reply[1], worker) if len(reply) > 1 else None

    def fail(self, lease: Lease, error: str, retry: bool = True) -> str:
        """Record a failed attempt: 'retry' (back to delayed with backoff) or 'dead'."""
        reply = self._run("fail", lease.task_id, lease.token, str(error)[:MAX_ERROR_CHARS],
                          "1" if retry else "0", int(self.backoff_base * 1000), int(self.backoff_cap * 1000))
        if not reply:
            raise LeaseLost(f"lease on task {lease.task_id} (token {lease.token}) is lost")
        return str(reply[0])

    def release(self, task_id: str, *, token: int | None = None, worker: str | None = None,
                count_stall: bool = True, reason: str = "worker lost") -> str | None:
        """Give a running task back now instead of waiting for lease expiry.

        ``count_stall`` for a holder that died (fast failover; poison pills still end up dead);
        False for a graceful hand-back at shutdown. Returns 'queued', 'dead' or None (not running
        under that token/worker).
        """
        reply = self._run("release", task_id, "" if token is None else token, worker or "",
                          "1" if count_stall else "0", reason[:MAX_ERROR_CHARS])
        return {"q": "queued", "x": "dead"}.get(reply) if reply else None

    def reclaim_expired(self, batch: int = 1000, max_batches: int = 100) -> int:
        """Return tasks whose lease expired to the queue (or to dead past ``max_stalls``).

        Works oldest-expiry first in bounded batches; cost is O(expired), not O(running).
        Returns how many leases were reclaimed.
        """
        total = 0
        for _ in range(max_batches):
            requeued, dead, more = self._run("reclaim", int(batch))
            total += int(requeued) + int(dead)
            if not int(more):
                break
        return total

    def dispatch(self, window: int, redispatch_after: float = 60.0, promote_limit: int = 1000
                 ) -> list[Dispatched]:
        """Move up to ``window - dispatched`` tasks from ready to dispatched, promote due retries and
        pick up dispatched tasks never claimed within ``redispatch_after`` seconds (``resent``: their
        message may still be waiting, or lost). The caller sends one broker message for each."""
        flat = self._run("dispatch", int(window), int(redispatch_after * 1000), int(promote_limit))
        return [Dispatched(flat[i], flat[i + 1], int(flat[i + 2]), bool(int(flat[i + 3])))
                for i in range(0, len(flat), 4)]

    # ------------------------------------------------------------------ dead letters
    def dead(self, limit: int = 100, offset: int = 0) -> list[TaskInfo]:
        """Dead tasks, oldest death first."""
        ids = self.client.zrange(self.keys.dead, offset, offset + max(0, limit) - 1)
        return [t for t in self._infos(ids) if t is not None]

    def redrive(self, task_id: str | None = None, batch: int = 1000) -> int:
        """Move one dead task (or all of them) back to the queue with attempts reset."""
        if task_id is not None:
            moved = int(self._run("redrive", task_id, 1))
            if not moved and not self.client.hexists(self.keys.tasks, task_id):
                raise TaskNotFound(f"no task {task_id!r} in namespace {self.namespace!r}")
            return moved
        total = 0
        while True:
            moved = int(self._run("redrive", "", int(batch)))
            total += moved
            if moved < batch:
                return total

    # ------------------------------------------------------------------ reading
    def _infos(self, ids: list[str]) -> list[TaskInfo | None]:
        if not ids:
            return []
        raws = self.client.hmget(self.keys.tasks, ids)
        return [TaskInfo.parse(i, raw) if raw else None for i, raw in zip(ids, raws, strict=True)]

    def get_many(self, task_ids: list[str]) -> list[TaskInfo | None]:
        """Snapshots of many tasks in one round trip (None for unknown or trimmed ids)."""
        return self._infos(list(task_ids))

    def get(self, task_id: str) -> TaskInfo:
        """Snapshot of one task; TaskNotFound if the id is unknown (or its history was trimmed)."""
        info = self._infos([task_id])[0] if isinstance(task_id, str) and task_id else None
        if info is None:
            raise TaskNotFound(f"no task {task_id!r} in namespace {self.namespace!r}")
        return info

    def checkpoint(self, task_id: str) -> dict[str, Any] | None:
        raw = self.client.hget(self.keys.checkpoints, task_id)
        return json.loads(raw) if raw else None

    def stats(self) -> dict[str, int]:
        """Counts per state plus lifetime counters, read in one round trip."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zrange(k.ready_bands, 0, -1)
        for key in (k.inflight, k.running, k.delayed, k.dead, k.completed):
            pipe.zcard(key)
        pipe.hgetall(k.stats)
        bands, dispatched, running, delayed, dead, history, counters = pipe.execute()
        queued = 0
        if bands:
            pipe = self.client.pipeline(transaction=False)
            for band in bands:
                pipe.llen(k.ready_list(band))
            queued = sum(pipe.execute())
        out = {"queued": queued, "dispatched": dispatched, "running": running, "delayed": delayed,
               "dead": dead, "completed_history": history}
        counters = {name: int(v) for name, v in counters.items()}
        out["completed"] = counters.pop("completed", 0)
        for name in ("enqueued", "duplicates", "claimed", "failed", "retried", "reclaimed", "released",
                     "redriven", "redispatched", "items", "items_duplicate"):
            out[name] = counters.pop(name, 0)
        out.update(counters)
        out.pop("died", None)
        return out

    def ready_ids(self) -> list[str]:
        """Every queued id in claim order (for tests and tooling; O(queued))."""
        k = self.keys
        out: list[str] = []
        for band in self.client.zrange(k.ready_bands, 0, -1):
            out.extend(self.client.lrange(k.ready_list(band), 0, -1))
        return out
