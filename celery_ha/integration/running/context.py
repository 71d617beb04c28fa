"""``ctx``: what a durable task function sees — its input, its checkpoint, and fenced ways to write.

Outputs are exactly-once: ``ctx.emit`` buffers keyed items, which are committed together with each
checkpoint (one fenced Lua script) and at completion. Children queued with ``ctx.enqueue`` are
written before the next checkpoint, so a checkpoint never covers children that were not queued.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery_ha.base.errors import InvalidInput, LeaseLost
from celery_ha.base.settings import Settings
from celery_ha.base.tracing import capture
from celery_ha.base.urls import canonical_url
from celery_ha.base.validation import MAX_ITEM_BYTES, check_item_key, dumps_capped
from celery_ha.fetch.conditional import PageValidators
from celery_ha.fetch.errors import FetchError, HostNotReady, NotModified
from celery_ha.fetch.fetcher import Fetcher
from celery_ha.fetch.host_pacing import in_flight_bound
from celery_ha.fetch.process_fetcher import process_fetcher
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.dispatch.script_push import push_refused
from celery_ha.state import Dispatched, Lease, TaskInfo
from celery_ha.state.lease_gate import LeaseGate
from celery_ha.state.list_push import ListPush
from celery_ha.state.records import TaskState
from celery_ha.state.run_sum import ITEMS_SUM, take_items_sum
from celery_ha.state.sink import item_key

#: Seconds of a lease's certain hold (``Lease.held_until``) a request to another host leaves unused:
#: below it the lease is read from Redis before the request goes.
FENCE_MARGIN = 2.0
#: Buffered items are committed (without a checkpoint) once this many are pending.
FLUSH_AT = 500
#: Arguments of ``ctx.fetch`` with which a request of the own URL asks for another resource.
REQUEST_CHANGING = ("params", "data", "json", "files")


def _in_flight(fetcher: Fetcher, kwargs: dict[str, Any]) -> float:
    """How long a request of this fetch may be in flight at most, from the gate's stamp: its timeout
    (and the fetcher's, robots.txt's, when robots.txt may be read), and with a pool the wait for a
    proxy and the proxy lease."""
    pool = fetcher.pool
    timeouts = [kwargs.get("timeout", fetcher.timeout)] + ([fetcher.timeout] if fetcher.obey_robots else [])
    return in_flight_bound(timeouts,
                           borrow_wait=fetcher.max_wait if pool is not None else 0.0,
                           proxy_lease=pool.config.lock_ttl if pool is not None else 0.0)


class DurableContext:
    """What a durable task function sees: its input, its checkpoint, and fenced ways to write."""

    def __init__(self, lease: Lease, rt: Services, spec: DurableTask) -> None:
        self.lease = lease
        self._rt = rt
        self._spec = spec
        self._items: list[tuple[str, dict[str, Any]]] = []
        self._children: list[dict[str, Any]] = []
        self._lost = threading.Event()
        self._lost_reason = ""
        self.stopping = False
        self.checkpoints_saved = 0
        self.emitted = 0
        self.committed = 0
        # The host gate's first due time as the completion's script read it (Completion.host_wait)
        self.host_wait: tuple[int, int | None] | None = None
        # The next task's lease, leased to this process by the completion's script (a chain)
        self.chained: Lease | None = None
        # Conditional requests of the task's own page (fetch/conditional.py), made at its first fetch
        self._page: PageValidators | None = None
        # Order-independent digest of the items of this run (ctx.signature() with no data): those of
        # the attempts before its checkpoint come back with it (state/run_sum.py), so a resumed run
        # signs every item of the run, as a run from the start would. A checkpoint without the sum
        # (an earlier release's) leaves the items before it unknown: no signature of items then.
        restored = take_items_sum(lease.checkpoint)
        self._items_sum = restored or 0
        self._sum_known = lease.checkpoint is None or restored is not None
        self._signed: bool | None = None  # ctx.signature()'s verdict: changed since the last run

    # ------------------------------------------------------------------ input
    @property
    def task_id(self) -> str:
        return self.lease.task_id

    @property
    def task(self) -> TaskInfo:
        return self.lease.task

    @property
    def url(self) -> str:
        return self.lease.task.url

    @property
    def meta(self) -> dict[str, Any]:
        return self.lease.task.meta

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """The last committed checkpoint (from a previous attempt, or saved in this one)."""
        return self.lease.checkpoint

    @property
    def attempt(self) -> int:
        """1 on the first run; grows with every failure and every stall (crash, lost lease)."""
        return self.lease.task.attempt

    @property
    def settings(self) -> Settings:
        return self._rt.settings

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def mark_lost(self, reason: str) -> None:
        """Called by the lease keeper: every later write raises LeaseLost."""
        self._lost_reason = reason
        self._lost.set()

    def check(self) -> None:
        """Raise LeaseLost if the lease is gone (call it in long loops that do no other I/O)."""
        if self._lost.is_set():
            raise LeaseLost(f"task {self.task_id}: {self._lost_reason}")

    # ------------------------------------------------------------------ I/O
    def fetch(self, url: str, method: str = "GET", *, conditional: bool = True, **kwargs: Any) -> Any:
        """HTTP through this process's proxy-aware fetcher (``celery_ha.fetch``): a proxy from the
        pool, rotation to another proxy on failure, a FetchError when the page must wait.

        A GET of the task's own URL is conditional (``conditional=False``: never; nor one given
        ``params``, ``data``, ``json`` or ``files``, which ask for another resource): it sends the
        ETag / Last-Modified of the task's previous run, and a 304 raises NotModified, which
        completes the task as unchanged (``fetch/conditional.py``); ``ctx.changed`` tells.

        Every request is fenced by the task's lease: one to the task's own host by the gate's ask
        (``LeaseGate``), any other by one read of the task's record first (:meth:`_fence`), so a
        zombie woken after its task ran again elsewhere sends nothing (LeaseLost)."""
        self.check()
        rt = self._rt
        fetcher = process_fetcher(rt.client, rt.settings, rt.worker_name)
        gate: LeaseGate | None = None
        if self._own_host(url):  # the host gate paces this task's host, each request fenced by the lease
            gate = rt.queue.hosts.for_lease(self.lease, _in_flight(fetcher, kwargs))
            kwargs.setdefault("gate", gate)
            kwargs.setdefault("crawl_delay_cap", rt.settings.host_crawl_delay_max)
        if gate is None or kwargs["gate"] is not gate or not gate.fenced:
            self._fence()
        asks_other = any(kwargs.get(k) for k in REQUEST_CHANGING)  # ?page=2 of the own URL: another page
        page = self._own_page(url) if conditional and method.upper() == "GET" and not asks_other else None
        sent = page.prepare(kwargs) if page is not None else False
        try:
            response = fetcher.fetch(url, method, **kwargs)
        except (FetchError, HostNotReady, InvalidInput, LeaseLost):
            # The fetcher's own refusals: every request it sent was reported over, so one let go and
            # still open never went out (no proxy came, the pool refused). Anything else may have
            # interrupted a request the site is still answering: its mark stays (a hand-back or a
            # reclaim then holds the host's slot until the request can no longer be in flight).
            if gate is not None:
                gate.settle()
            raise
        self.check()
        if page is not None:
            try:
                page.seen(url, response, sent)  # NotModified for a 304 to the validator sent
            except NotModified:
                self.lease.verdict = self.lease.verdict or "="  # unchanged, for an adaptive schedule
                raise
        return response

    @property
    def changed(self) -> bool | None:
        """Whether the task's output changed since its previous run: what :meth:`signature` said
        once called; else whether its own page changed (False after a 304 to the validator sent,
        True after another answer to a fetch of it); None before either."""
        if self.lease.verdict and self.lease.verdict != "=":
            return self._signed
        return None if self._page is None else self._page.changed

    def signature(self, data: Any = None) -> bool | None:
        """Sign this run's output, for an adaptive refetch schedule (``state/schedules.py``): the
        next interval grows when the signature equals the previous run's and shrinks when not.
        ``data``: what identifies the content (the page body as bytes or str, or any JSON value —
        leave out what changes on every visit, such as timestamps); None signs the items emitted
        so far in this run, whatever their order (a run resumed from its checkpoint counts the items
        emitted before it too). Returns whether it changed since the previous run (None: the task
        had no signature before; or, signing items, the run resumed from a checkpoint saved by a
        release before the checkpoint kept their sum: no verdict, the schedule's interval stays)."""
        if data is None:
            if not self._sum_known:
                self._signed = None
                return None
            digest = self._items_sum.to_bytes(8, "big")
        else:
            if isinstance(data, str):
                data = data.encode("utf-8", "surrogatepass")
            elif not isinstance(data, (bytes, bytearray, memoryview)):
                data = dumps_capped("signature data", data, 1 << 30, require_object=False).encode()
            digest = hashlib.blake2b(data, digest_size=8).digest()
        self.lease.verdict = digest.hex()
        previous = self.lease.task.signature
        self._signed = None if previous is None else previous != self.lease.verdict
        return self._signed

    def _own_page(self, url: str) -> PageValidators | None:
        """The conditional-request state when ``url`` is the task's own page (same canonical URL)."""
        queue = self._rt.queue
        try:
            if canonical_url(url, queue.url_rules) != canonical_url(self.url, queue.url_rules):
                return None
        except InvalidInput:
            return None
        if self._page is None:
            self._page = PageValidators(queue, self.task_id, self._rt.settings.validators_max)
        return self._page

    def _fence(self) -> None:
        """Check the lease before a request no gate ask fences: one read of the task's record, whose
        state and fencing token must still be this lease's (the check every fenced script makes,
        ``fenced()`` in ``_common.lua``); else LeaseLost, and nothing is sent.

        No read while the lease is certainly still held (``Lease.held_until``, kept by the claim and
        every renewal, less a margin for the request's own start): no other holder can exist before
        its expiry, and the lease keeper renews it well before. A process stopped past that (SIGSTOP,
        a long pause) finds the bound gone when it wakes, and reads."""
        self.check()
        if time.monotonic() < self.lease.held_until - FENCE_MARGIN:
            return
        info = self._rt.queue.get_many([self.task_id])[0]
        if info is not None and info.state == TaskState.RUNNING and info.token == self.lease.token:
            return
        if info is None or info.state != TaskState.RUNNING:
            why = "the task is gone" if info is None else f"the task is {info.state}"
        else:
            why = "a newer claim holds the task"
        self.mark_lost(why)
        raise LeaseLost(f"lease on task {self.task_id} (token {self.lease.token}) is lost: {why}; "
                        "its request was not sent", reason=why)

    def _own_host(self, url: str) -> bool:
        """Whether ``url`` is on the host the gate queued this task under (a politeness refusal then
        hands the task back to that host's queue instead of waiting in it)."""
        host = self.lease.task.host
        if not host:
            return False
        return self._rt.queue.hosts.key_of_url(url) == host  # under the namespace's key mode

    def emit(self, item: Mapping[str, Any], key: str | None = None) -> str:
        """Buffer one output item; stored exactly once under ``key`` (default: the task's
        ``item_key`` field, else a stable hash of the item). Returns the key."""
        self.check()
        if not isinstance(item, Mapping):
            raise InvalidInput(f"emit() takes a dict, got {type(item).__name__}")
        value = dict(item)
        text = dumps_capped("item", value, MAX_ITEM_BYTES)  # first: item_key hashes the item's JSON
        k = check_item_key(str(key if key is not None else item_key(value, self._spec.item_key)))
        item_digest = hashlib.blake2b(k.encode() + b"\n" + text.encode(), digest_size=8).digest()
        self._items_sum = (self._items_sum + int.from_bytes(item_digest, "big")) % (1 << 64)
        self._items.append((k, value))
        self.emitted += 1
        if len(self._items) >= FLUSH_AT:
            self.flush()
        return k

    def enqueue(self, url: str, task: str | None = None, priority: int = 0,
                meta: Mapping[str, Any] | None = None, dedup: bool = True,
                max_attempts: int | None = None) -> str | None:
        """Queue a child task. Buffered and written before the next checkpoint, so a checkpoint
        never covers children that were not queued; with ``dedup`` (default) re-running the parent
        never doubles them. Returns the child's id (deterministic with dedup)."""
        self.check()
        queue = self._rt.queue
        task = task or queue.default_task
        if meta is not None and not isinstance(meta, Mapping):
            raise InvalidInput(f"meta must be a JSON object (dict), got {type(meta).__name__}")
        spec = {"url": url, "task": task, "priority": priority, "meta": dict(meta) if meta else None,
                "dedup": bool(dedup), "max_attempts": max_attempts, "trace": capture()}
        if not dedup:
            return queue.enqueue_many([spec])[0]
        # Validate now, with the queue's own rules, so the error points at this call and a bad child
        # never sits in the buffer to fail every later checkpoint.
        (child_id,) = queue.task_ids([spec])
        self._children.append(spec)
        if len(self._children) >= FLUSH_AT:
            self._flush_children()
        return child_id

    def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        """Commit the buffered items and this checkpoint together (one fenced step)."""
        self.check()
        if not isinstance(checkpoint, Mapping):
            raise InvalidInput(f"checkpoint must be a JSON object (dict), got {type(checkpoint).__name__}")
        checkpoint = dict(checkpoint)
        if ITEMS_SUM in checkpoint:
            raise InvalidInput(f"checkpoint key {ITEMS_SUM!r} is reserved (the run's items digest)")
        # Refuse a bad checkpoint before the buffered children are written: a refusal writes nothing.
        dumps_capped("checkpoint", checkpoint, self._rt.queue.checkpoint_cap)
        self._commit(checkpoint)
        self.checkpoints_saved += 1

    def flush(self) -> None:
        """Commit buffered items and children now, leaving the checkpoint as it is."""
        self.check()
        self._commit(None)

    def _flush_children(self) -> None:
        if self._children:
            self._rt.queue.enqueue_many(self._children)
            self._children = []

    def _complete(self, window: int | None, redispatch_after: float,
                  push: ListPush | None = None, host_wait: bool = False,
                  chain: tuple[str, str] | None = None) -> list[Dispatched] | None:
        """Write the buffered children, then store the buffered items, complete the task and (with
        ``window``) refill the broker window in one fenced script, which with ``push`` also pushes
        the refill's messages (``integration/dispatch/script_push.py``) and with ``chain`` (worker,
        task name) leases the next queued task of that name to this process (:attr:`chained`).
        Returns the tasks left to send, or None when the window was not refilled (the caller pumps)."""
        self._flush_children()
        try:
            done = self._rt.queue.complete_and_push(self.lease, self._items, window=window,
                                                    redispatch_after=redispatch_after, push=push,
                                                    host_wait=host_wait, chain=chain)
        except LeaseLost as exc:
            self.mark_lost(str(exc))
            raise
        self.committed += done.added
        self.host_wait = done.host_wait
        self.chained = done.next_lease
        self._items = []
        if self._page is not None:  # only now: a validator must not outlive uncommitted items
            self._page.remember()
        if done.push_error is not None:
            push_refused(done.push_error)
        return done.to_send

    def _complete_and_claim(self, next_id: str) -> Lease | None:
        """Write the buffered children, then store the buffered items, complete the task and claim
        the batch's next task ``next_id`` for this process in one fenced script. Returns its lease,
        None when it is not claimable (its message is then dropped, as a refused claim's)."""
        self._flush_children()
        try:
            added, nxt = self._rt.queue.complete_and_claim_id(self.lease, next_id, self._rt.worker_name,
                                                              self._items)
        except LeaseLost as exc:
            self.mark_lost(str(exc))
            raise
        self.committed += added
        self._items = []
        if self._page is not None:  # only now: a validator must not outlive uncommitted items
            self._page.remember()
        return nxt

    def _commit(self, checkpoint: dict[str, Any] | None) -> None:
        self._flush_children()
        if not self._items and checkpoint is None:
            return
        try:
            # With a checkpoint, the sum of every item emitted up to it (stored inside it): what a run
            # resumed from it starts from. A commit without one leaves the stored sum as it is.
            self.committed += self._rt.queue.commit(self.lease, self._items, checkpoint,
                                                    items_sum=self._items_sum)
        except LeaseLost as exc:
            self.mark_lost(str(exc))
            raise
        self._items = []
