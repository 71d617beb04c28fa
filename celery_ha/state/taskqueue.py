"""The client of the durable task layer: a fenced, lease-based task state machine in Redis.

Every transition is one Lua script (see the ``.lua`` files beside this module), so a crash at any
instant leaves each task in exactly one state structure. Leases carry a fencing token that grows with
every claim: a holder whose lease was reclaimed can no longer renew, checkpoint, commit, complete or
fail. All times come from the Redis server clock. A refused transition answers a refusal code, which
:mod:`celery_ha.state.replies` turns into None, 0 or an error; ids are made in
:mod:`celery_ha.state.ids`, enqueueing is :mod:`celery_ha.state.enqueue_ops` (its arguments packed in
:mod:`celery_ha.state.enqueue_args`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis

from celery_ha.base import tracing
from celery_ha.base.settings import Settings
from celery_ha.base.urls import UrlRules
from celery_ha.base.validation import (
    MAX_CHECKPOINT_BYTES,
    MAX_ERROR_CHARS,
    MAX_META_BYTES,
    MAX_NAME_CHARS,
    check_int,
    check_namespace,
    check_number,
    check_seconds,
    check_task_name,
    check_text,
    clean_message,
    dumps_capped,
    parse_duration,
)
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.cluster import is_cluster_client
from celery_ha.redisio.replicas import replica_wait
from celery_ha.redisio.scripts import ScriptSet
from celery_ha.state.completion import MAX_TOKEN, CompletionOps, item_args, lease_ids, verdict_of
from celery_ha.state.enqueue_args import (
    MAX_BATCH,
    SCRIPT_BATCH,
)
from celery_ha.state.enqueue_ops import EnqueueOps
from celery_ha.state.hosts import UNSET, HostGate
from celery_ha.state.keys import QueueKeys
from celery_ha.state.operator_ops import OperatorOps
from celery_ha.state.queue_reads import QueueReads, _task_id
from celery_ha.state.records import Dispatched, Lease
from celery_ha.state.replies import lease_from, raise_for, refused
from celery_ha.state.run_sum import with_items_sum
from celery_ha.state.schedules import ScheduleOps
from celery_ha.state.sharded import dispatch_shards, rotation
from celery_ha.state.shards import MAX_SHARDS, shard_keys
from celery_ha.state.url_rules import checked_rules, settings_rules

_HERE = Path(__file__).parent
# The scripts that take many rows a call stay on EVALSHA on Redis 7 too: their prelude is shared by
# up to hundreds of rows, so the function library saves them next to nothing, and their long-call tail
# (issue 30 item 1) was measured by EVALSHA (benchmarks/RESULTS.md, "Redis 7 function libraries").
ROW_SCRIPTS = ("enqueue", "enqueue_if_absent", "reclaim", "migrate_in", "forget_finished", "forget_carried",
               "refetch_due")
_RELEASED = {"q": "queued", "x": "dead"}  # release.lua's success replies -> release()'s results


def _worker(worker: Any) -> str:
    return check_text("worker", worker, MAX_NAME_CHARS)


class TaskQueue(EnqueueOps, QueueReads, OperatorOps, CompletionOps, ScheduleOps):
    """Client of one namespace of the durable task layer.

    Safe to share between threads (redis-py pools connections). In a forked child, build a new one.
    ``shards`` > 1 spreads the namespace over that many hash tags (``state/shards.py``); an explicit
    count is checked against the one the namespace was written with (ConfigurationError on a change
    while it holds tasks). None = 1, unchecked.

    ``host_gate`` (or any of ``host_rate``, ``host_delay``, ``host_concurrency``) switches the
    namespace's host gate on at the first call and records those defaults (``state/hosts.py``);
    ``self.hosts`` steers the gate.
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
        min_replicas: int = 0,
        replica_timeout: float = Settings.replica_timeout,
        shards: int | None = None,
        dedup_ttl: float | None = None,
        host_gate: bool = False,
        host_rate: str | tuple[int, float] | None = None,
        host_delay: float = 0.0,
        host_concurrency: int = 0,
        url_rules: UrlRules | None = None,
    ) -> None:
        self.client = client
        self.namespace = check_namespace(namespace)
        self.shard_count = 1 if shards is None else check_int("shards", shards, 1, MAX_SHARDS)
        self._shards = shard_keys(self.namespace, self.shard_count)  # shard 0 = the unsharded keys
        self.keys: QueueKeys = self._shards[0]
        self._turn = 0  # the shard claim_next and dispatch start from (rotates)
        self.lease_ttl = check_seconds("lease_ttl", lease_ttl)
        self.max_attempts = check_int("max_attempts", max_attempts, 1, 1000)
        self.max_stalls = check_int("max_stalls", max_stalls, 0, 1000)
        self.backoff_base = check_number("backoff_base", backoff_base, 0, 86_400, unit="seconds")
        self.backoff_cap = check_number("backoff_cap", backoff_cap, 0, 30 * 86_400, unit="seconds")
        self.history_max = check_int("history_max", history_max, 0, 10**9)
        self.history_age = check_number("history_age", history_age, 0, 10 * 365 * 86_400, unit="seconds")
        self.checkpoint_cap = check_int("checkpoint_cap", checkpoint_cap, 2, MAX_CHECKPOINT_BYTES)
        self.meta_cap = check_int("meta_cap", meta_cap, 2, MAX_META_BYTES)
        self.default_task = check_task_name(default_task)
        # Seconds or a duration ("7d"); None = finished dedup ids stay duplicates forever.
        self.dedup_ttl = None if dedup_ttl is None else parse_duration(dedup_ttl, "dedup_ttl")
        # With min_replicas, every transition waits (bounded) until that many replicas hold it.
        self._scripts = ScriptSet(client, _HERE, wait=replica_wait(
            check_int("min_replicas", min_replicas, 0, 16),
            check_seconds("replica_timeout", replica_timeout, high=60)), library_prelude="_common",
            library_skip=ROW_SCRIPTS)
        self._key_lists = [[k.tasks, k.ready_bands, k.delayed, k.inflight, k.running, k.dead, k.completed,
                            k.done, k.checkpoints, k.stats, k.wake, k.hist] for k in self._shards]
        self._keys = self._key_lists[0]
        self._layout_checked = shards is None  # an explicit count is checked at the first call
        # The host defaults this process brings (validated now, written at the first call); only the
        # ones it sets, so a default an operator stored is not reset by a process that has none.
        self._host_defaults = self.hosts._limits(
            "", UNSET if host_rate is None else host_rate, UNSET if not host_delay else host_delay,
            UNSET if not host_concurrency else host_concurrency, UNSET)
        self.host_gate = bool(host_gate or self._host_defaults)
        self._gate_pending = self.host_gate
        # The namespace's host key mode as last read (HostGate.mode; None = not read yet) and when
        # (monotonic): enqueue uses it however old (enqueue.lua refuses keys made under a mode that
        # is no longer in force), other readers re-read it after a few seconds.
        self._key_mode: str | None = None
        self._key_mode_at = 0.0
        # How dedup ids canonicalise URLs: checked against the namespace's at the first dedup enqueue.
        self.url_rules, self._rules_checked = checked_rules(url_rules), False
        # Ancestors whose remembered ids it carries (state/carried.py): read with the URL rules, then
        # again when CARRY_TTL has passed since (monotonic time of the last read).
        self._carries = None
        self._ancestors = None  # every ancestor whose dedup ids meant something else, read with them
        self._carries_at = float("-inf")
        self._moved_to = None  # read with them: where a migration moved this namespace to
        self._registered = False  # in the registry of namespaces (at the first enqueue)

    @property
    def hosts(self) -> HostGate:
        """The namespace's host gate (limits, blocks, listings; ``state/hosts.py``). Made on each use
        rather than kept: a gate held by the queue that it holds would be a reference cycle, so a
        dropped queue would keep its Redis connections until the cyclic collector ran."""
        return HostGate(self)

    @classmethod
    def from_url(cls, url: str, namespace: str = "default", **options: Any) -> TaskQueue:
        options.setdefault("shards", Settings.one("shards"))
        options.setdefault("dedup_ttl", Settings.one("dedup_ttl"))
        for name in ("host_rate", "host_delay", "host_concurrency"):
            options.setdefault(name, Settings.one(name))
        options.setdefault("host_gate", Settings.one("hosts"))
        options.setdefault("url_rules", settings_rules())
        return cls(redis_client(url), namespace, **options)

    @classmethod
    def for_settings(cls, client: redis.Redis, settings: Settings, namespace: str | None = None) -> TaskQueue:
        """The queue of ``namespace`` (default: the settings') with the settings' lease and limits."""
        return cls(client, namespace or settings.namespace, lease_ttl=settings.lease_ttl,
                   max_attempts=settings.max_attempts, max_stalls=settings.max_stalls,
                   default_task=settings.default_task, min_replicas=settings.min_replicas,
                   replica_timeout=settings.replica_timeout, shards=settings.shards,
                   dedup_ttl=settings.dedup_ttl, host_gate=settings.hosts, host_rate=settings.host_rate,
                   host_delay=settings.host_delay, host_concurrency=settings.host_concurrency,
                   url_rules=settings.url_rules)

    def _run(self, script: str, *args: Any, keys: list[str] | None = None, shard: int = 0) -> Any:
        """One script call (one round trip) on a shard's KEYS layout; ARGV[1] is its key prefix."""
        self._ensure_layout()
        if self._gate_pending:
            self._gate_pending = False
            for each in range(self.shard_count):
                self._scripts.host_limits(keys=self._key_lists[each],
                                          args=[self._shards[each].prefix, "", *self._host_defaults])
        return getattr(self._scripts, script)(keys=keys or self._key_lists[shard],
                                              args=[self._shards[shard].prefix, *args])

    def _rotation(self) -> list[int]:
        self._turn += 1
        return rotation(self.shard_count, self._turn)

    # ------------------------------------------------------------------ leases
    def _ttl_ms(self, ttl: float | None) -> int:
        """A lease's length in ms; a caller's ``ttl`` must be positive and finite (a negative one would
        grant a lease that expired before it was granted)."""
        return int((self.lease_ttl if ttl is None else check_seconds("ttl", ttl)) * 1000)

    def claim(self, task_id: str, worker: str, ttl: float | None = None, adopt: bool = False) -> Lease | None:
        """Claim a queued or dispatched task; None when it is not claimable (running elsewhere,
        delayed, completed, dead or unknown) — a Celery message for it should then be dropped.

        ``adopt``: for a caller that alone runs tasks under ``worker`` (a prefork pool child, whose
        name is its node and pid): a task already running under ``worker`` is its own lease whose
        grant it never heard of (a reply lost to a timeout, an exception before its use), returned
        with its token and a fresh expiry instead of refused (it would otherwise sit until its lease
        expired, and count a stall). Never for a pool whose threads share one worker name."""
        task_id = _task_id(task_id)
        ttl_ms, sent = self._ttl_ms(ttl), time.monotonic()
        lease = lease_from(self._run("claim", task_id, _worker(worker), ttl_ms, "1" if adopt else "",
                                     shard=self._of(task_id)), worker)
        if lease is not None:
            lease.held_until = sent + ttl_ms / 1000.0
        return lease

    def claim_next(self, worker: str, ttl: float | None = None, wait: float = 0.0) -> Lease | None:
        """Claim the best queued task (highest priority, then FIFO); standalone mode, no Celery.

        With ``wait`` > 0, block up to that many seconds for work: idle callers sleep on a wake-up
        list that enqueue, reclaim and redrive feed, and re-check at least once a second (due
        retries). The claim itself is atomic, so no task is ever handed to two callers.
        """
        _worker(worker)
        ttl_ms = self._ttl_ms(ttl)
        deadline = time.monotonic() + (0.0 if wait == 0 else check_seconds("wait", wait, low=0.0))
        while True:
            for shard in self._rotation():
                lease = lease_from(self._run("claim_next", worker, ttl_ms, 100, shard=shard), worker)
                if lease is not None:
                    return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # One BLPOP over every shard's wake list; a cluster takes one slot per BLPOP, so there it
            # waits on one shard (rotating) and re-checks every shard at least four times a second.
            wakes = [k.wake for k in self._shards]
            one = is_cluster_client(self.client) and len(wakes) > 1
            self.client.blpop(wakes[self._turn % len(wakes):][:1] if one else wakes,
                              timeout=max(0.01, min(remaining, 0.25 if one else 1.0)))

    def renew(self, lease: Lease, ttl: float | None = None) -> Lease:
        """Extend the lease; raise LeaseLost if it is no longer the task's current lease."""
        task_id, token = lease_ids(lease)
        ttl_ms, sent = self._ttl_ms(ttl), time.monotonic()
        expiry = self._run("renew", task_id, token, ttl_ms, shard=self._of(task_id))
        if refused(expiry):
            raise_for(expiry, task_id, token)
        lease.expires_at = int(expiry) / 1000.0
        lease.held_until = sent + ttl_ms / 1000.0
        return lease

    def save_checkpoint(self, lease: Lease, checkpoint: Mapping[str, Any]) -> None:
        """Store the task's resume point (JSON object, capped) under the lease."""
        task_id, token = lease_ids(lease)
        text = dumps_capped("checkpoint", checkpoint, self.checkpoint_cap)
        reply = self._run("checkpoint", task_id, token, text, shard=self._of(task_id))
        if refused(reply):
            raise_for(reply, task_id, token)
        lease.checkpoint = json.loads(text)

    def commit(self, lease: Lease, items: Iterable[tuple[str, Mapping[str, Any]]],
               checkpoint: Mapping[str, Any] | None = None, *, items_sum: int | None = None) -> int:
        """Store keyed output items and (optionally) the checkpoint in one fenced step.

        A key the sink already holds is ignored, so re-running a page never doubles its output.
        Returns how many items were new; raises LeaseLost (and writes nothing) if the lease is lost.
        ``items_sum``: the run's items digest so far, stored inside the checkpoint under a reserved
        field (``state/run_sum.py``; the cap applies to the checkpoint as given).
        """
        task_id, token = lease_ids(lease)
        text = "" if checkpoint is None else dumps_capped("checkpoint", checkpoint, self.checkpoint_cap)
        if text and items_sum is not None:
            text = with_items_sum(text, items_sum)
        args: list[Any] = [task_id, token, text]
        args += item_args(items)
        shard = self._of(task_id)
        k = self._shards[shard]
        added = self._run("commit", *args, keys=[*self._key_lists[shard], k.items, k.item_log], shard=shard)
        if refused(added):
            raise_for(added, task_id, token)
        if checkpoint is not None:
            lease.checkpoint = dict(checkpoint)
        return int(added)

    def complete(self, lease: Lease) -> None:
        """Mark the task completed (clears its checkpoint); LeaseLost if the lease is not current."""
        task_id, token = lease_ids(lease)
        reply = self._run("complete", task_id, token, self.history_max, int(self.history_age * 1000),
                          verdict_of(lease), shard=self._of(task_id))
        if refused(reply):
            raise_for(reply, task_id, token)

    def complete_and_claim(self, lease: Lease, worker: str | None = None, ttl: float | None = None
                           ) -> Lease | None:
        """Complete ``lease``'s task and claim the next queued one in the same script: one round trip
        per task for a busy standalone worker. Returns the next lease, or None when the queue is empty;
        raises LeaseLost (and changes nothing) if ``lease`` is not current."""
        task_id, token = lease_ids(lease)
        worker = _worker(lease.worker if worker is None else worker)
        reply = self._run("complete_next", task_id, token, self.history_max, int(self.history_age * 1000),
                          worker, self._ttl_ms(ttl), 100, verdict_of(lease), shard=self._of(task_id))
        if refused(reply):
            raise_for(reply, task_id, token)
        if len(reply) > 1:
            return lease_from(reply[1], worker)
        return self.claim_next(worker, ttl) if self.shard_count > 1 else None  # its shard is empty

    def fail(self, lease: Lease, error: str, retry: bool = True) -> str:
        """Record a failed attempt: 'retry' (back to delayed with backoff) or 'dead'; LeaseLost
        (nothing recorded) if the lease is not current."""
        task_id, token = lease_ids(lease)
        reply = self._run("fail", task_id, token, clean_message(error, MAX_ERROR_CHARS),
                          "1" if retry else "0", int(self.backoff_base * 1000), int(self.backoff_cap * 1000),
                          shard=self._of(task_id))
        if refused(reply):
            raise_for(reply, task_id, token)
        return str(reply[0])

    def release(self, task_id: str, *, token: int | None = None, worker: str | None = None,
                count_stall: bool = True, reason: str = "worker lost", own_fault: bool = False) -> str | None:
        """Give a running task back now instead of waiting for lease expiry.

        ``count_stall`` for a holder that died (fast failover; poison pills still end up dead);
        False for a graceful hand-back at shutdown. ``own_fault``: celery-ha's own code failed
        around the task (not the task's fault): no stall for the first four, the fifth counts
        one (``release.lua``), so a bug that fails every run still ends in dead with its
        reason. Returns 'queued', 'dead' or None (not running under that token/worker).
        """
        task_id = _task_id(task_id)
        if token is not None:
            check_int("token", token, 1, MAX_TOKEN)
        if worker is not None:
            _worker(worker)
        counted = "f" if own_fault else "1" if count_stall else "0"
        reply = self._run("release", task_id, "" if token is None else token, worker or "", counted,
                          clean_message(reason, MAX_ERROR_CHARS), shard=self._of(task_id))
        return None if refused(reply) else _RELEASED.get(reply)

    def reclaim_expired(self, batch: int = SCRIPT_BATCH, max_batches: int = 1000,
                        spare: tuple[int, int] | None = None) -> int:
        """Return tasks whose lease expired to the queue (or to dead past ``max_stalls``).

        Works oldest-expiry first in bounded batches; cost is O(expired), not O(running).
        ``spare`` = (from_ms, to_ms), Redis clock: leases that expired inside it go back without a
        stall (no worker could reach Redis then; see ``worker_registry.quiet_window``).
        Returns how many leases were reclaimed.
        """
        batch = check_int("batch", batch, 1, MAX_BATCH)
        spare_from, spare_to = (0, 0) if spare is None else (
            check_int("spare start", spare[0], 0, 2**53), check_int("spare end", spare[1], 0, 2**53))
        total = 0
        rounds = check_int("max_batches", max_batches, 1, 1_000_000)
        named = tracing.enabled()  # the script names the tasks it took back: a span for each
        for shard in range(self.shard_count):
            for _ in range(rounds):
                reply = self._run("reclaim", batch, spare_from, spare_to, "1" if named else "0", shard=shard)
                requeued, dead, more = reply[:3]
                total += int(requeued) + int(dead)
                if named:
                    for outcome, ids in (("queued", reply[3]), ("dead", reply[4])):
                        self._traced("celery_ha.reclaim", [i.decode() if isinstance(i, bytes) else str(i)
                                                           for i in ids],
                                     **{"celery_ha.reason": "lease expired", "celery_ha.outcome": outcome})
                if not int(more):
                    break
        return total

    def dispatch(self, window: int, redispatch_after: float = 60.0, promote_limit: int = 1000
                 ) -> list[Dispatched]:
        """Move up to ``window - dispatched`` tasks from ready to dispatched, promote due retries and
        pick up dispatched tasks never claimed within ``redispatch_after`` seconds (``resent``: their
        message may still be waiting, or lost). The caller sends one broker message for each."""
        window = check_int("window", window, 0, 1_000_000)
        after_ms = int(check_number("redispatch_after", redispatch_after, 0, 30 * 86_400, "seconds") * 1000)
        limit = check_int("promote_limit", promote_limit, 1, MAX_BATCH)
        return dispatch_shards(self.client, self._shards,
                               lambda shard, room: self._run("dispatch", room, after_ms, limit, shard=shard),
                               window, next(iter(self._rotation())))
