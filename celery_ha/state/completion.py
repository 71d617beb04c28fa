"""The Celery path's completion in one round trip: last items + complete + window refill.

Through Celery a durable task used to end with three scripts after its run — ``commit`` (the items
still buffered), ``complete``, and the pump's ``dispatch`` — each a round trip of its own, on top of
Celery's. ``complete_dispatch.lua`` does all three in one atomic step under the lease's fencing
token: a stale lease stores nothing, completes nothing and dispatches nothing. The refill is exactly
``dispatch.lua``'s (both run ``fill_window`` of ``_dispatch.lua``), so the window, the redispatch of
lost messages and the promotion of due retries keep their accounting. Given a
:class:`~celery_ha.state.list_push.ListPush`, the script also pushes the refill's broker messages
itself (``complete_and_push``).

A mixin of :class:`celery_ha.state.taskqueue.TaskQueue` (which sets the attributes declared below),
in a module of its own so the transitions module stays small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import (
    MAX_ITEM_BYTES,
    MAX_NAME_CHARS,
    check_int,
    check_item_key,
    check_number,
    check_text,
    dumps_capped,
    iter_many,
    shown,
)
from celery_ha.state.enqueue_args import MAX_BATCH
from celery_ha.state.keys import QueueKeys
from celery_ha.state.list_push import ListPush
from celery_ha.state.queue_reads import _task_id
from celery_ha.state.records import Dispatched, Lease
from celery_ha.state.replies import dispatched_from, lease_from, raise_for, refused

MAX_TOKEN = 2**53  # fencing tokens are Lua numbers (doubles): exact up to 2**53


def lease_ids(lease: Any) -> tuple[str, int]:
    """The (task id, token) of a lease from a claim; InvalidInput for anything else (the same checks
    as every other fenced call: the token goes to Lua as a number)."""
    if not isinstance(lease, Lease):
        raise InvalidInput(f"lease must be a Lease from claim(), got {type(lease).__name__}")
    token = lease.token
    if type(token) is not int or not 0 < token <= MAX_TOKEN:
        raise InvalidInput(f"lease token must be a positive integer, got {shown(token)}")
    return _task_id(lease.task_id), token


def verdict_of(lease: Lease) -> str:
    """A lease's output verdict for the completion script (``Lease.verdict``), checked."""
    verdict = lease.verdict
    if not isinstance(verdict, str) or len(verdict) > 64 or "\n" in verdict:
        raise InvalidInput("lease.verdict must be '', '=' or a signature of at most 64 characters")
    return verdict


def item_args(items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Validated ``key, item JSON, …`` script arguments of keyed output items (as ``commit``'s)."""
    args: list[str] = []
    for pair in iter_many("items ((key, item) pairs)", items):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidInput(f"each item must be a (key, item) pair, got {type(pair).__name__}")
        key, item = pair
        args += [check_item_key(key), dumps_capped("item", item, MAX_ITEM_BYTES)]
    return args


class Completion(NamedTuple):
    """What ``complete_and_push`` did: new items stored; the dispatched tasks the caller still has to
    send (None: no refill, the caller pumps); messages the script pushed itself; why the push stopped
    (a refused command's text), else None."""

    added: int
    to_send: list[Dispatched] | None
    pushed: int = 0
    push_error: str | None = None
    #: With ``host_wait`` and a refill: (now, hwait's first score: when the gate's first waiting host
    #: may hand out a task, SLOT (9e15) when it waits for an event, None when no host waits), ms of the
    #: Redis clock; else None.
    host_wait: tuple[int, int | None] | None = None
    #: With ``chain``: the next task's lease, taken for the chain's worker by the same script (the
    #: best queued task, of the chain's task name), else None.
    next_lease: Lease | None = None


class CompletionOps:
    """``complete_and_dispatch``; :class:`TaskQueue` provides the attributes and methods below."""

    shard_count: int
    history_max: int
    history_age: float
    _shards: list[QueueKeys]
    _key_lists: list[list[str]]

    _run: Callable[..., Any]
    _of: Callable[[str], int]
    _ttl_ms: Callable[[float | None], int]
    claim: Callable[..., Lease | None]

    def complete_and_dispatch(self, lease: Lease, items: Iterable[tuple[str, Mapping[str, Any]]] = (),
                              *, window: int | None = None, redispatch_after: float = 60.0,
                              promote_limit: int = 1000) -> tuple[int, list[Dispatched] | None]:
        """Store ``items`` (keyed, as :meth:`commit`), complete the task, and with ``window`` move up
        to ``window - dispatched`` ready tasks to dispatched (as :meth:`dispatch`), in one fenced
        script: one round trip instead of three.

        Returns (new items, the dispatched tasks to send one broker message each). The list is None
        when no refill happened: ``window`` None, or a sharded namespace (its window spans every
        shard, which one shard's script cannot see: the caller then pumps with :meth:`dispatch`).
        Raises LeaseLost, having written and moved nothing, if the lease is not current.
        """
        done = self.complete_and_push(lease, items, window=window, redispatch_after=redispatch_after,
                                      promote_limit=promote_limit)
        return done.added, done.to_send

    def complete_and_push(self, lease: Lease, items: Iterable[tuple[str, Mapping[str, Any]]] = (),
                          *, window: int | None = None, redispatch_after: float = 60.0,
                          promote_limit: int = 1000, push: ListPush | None = None,
                          host_wait: bool = False, chain: tuple[str, str] | None = None,
                          ttl: float | None = None) -> Completion:
        """:meth:`complete_and_dispatch`, and with ``push`` the script pushes the refill's messages
        onto the broker's lists itself (``_push.lua``); what it did not push is left to send. With
        ``host_wait`` a refill also tells when the host gate's first waiting host is due
        (:attr:`Completion.host_wait`), which a gated worker's pump timer needs after each task.
        ``chain`` = (worker, task name): after the refill (if any: a sharded namespace's is the
        pump's), the best queued task of the completed task's shard, when it has that task name, is
        leased to that worker (``ttl``, as :meth:`claim`) in the same script
        (:attr:`Completion.next_lease`): a worker that keeps going pays one script per task. The
        caller asks for it only while the namespace's window is above 0 (not paused)."""
        task_id, token = lease_ids(lease)
        args = item_args(items)
        refill = window is not None and self.shard_count == 1
        chain_args = ["", "", ""]
        if chain is not None:
            worker, name = chain
            chain_args = [str(self._ttl_ms(ttl)), check_text("worker", worker, MAX_NAME_CHARS),
                          check_text("task name", name, MAX_NAME_CHARS)]
        window_arg: int | str = check_int("window", window, 0, 1_000_000) if refill else ""
        after_ms = int(check_number("redispatch_after", redispatch_after, 0, 30 * 86_400, "seconds") * 1000)
        limit = check_int("promote_limit", promote_limit, 1, MAX_BATCH)
        if push is not None and not isinstance(push, ListPush):
            raise InvalidInput(f"push must be a ListPush, got {type(push).__name__}")
        push_args = push.args() if push is not None and refill else []
        shard = self._of(task_id)
        k = self._shards[shard]
        reply = self._run("complete_dispatch", task_id, token, self.history_max, int(self.history_age * 1000),
                          window_arg, after_ms, limit, verdict_of(lease), "1" if host_wait else "",
                          *chain_args, len(push_args), *push_args, *args,
                          keys=[*self._key_lists[shard], k.items, k.item_log], shard=shard)
        if refused(reply):
            raise_for(reply, task_id, token)
        added, flat, pushed, error, wait, chained = reply
        if isinstance(error, bytes):
            error = error.decode(errors="replace")
        waits = None
        if wait:
            waits = (int(wait[0]), int(float(wait[1])) if wait[1] else None)
        # Without a refill the list holds at most a chain's gated task of another name (to send).
        to_send = dispatched_from(flat) if refill or flat else None
        return Completion(int(added), to_send, int(pushed), error or None, waits,
                          lease_from(chained, chain_args[1]) if chained else None)

    def complete_and_claim_id(self, lease: Lease, next_id: str, worker: str,
                              items: Iterable[tuple[str, Mapping[str, Any]]] = (), *,
                              ttl: float | None = None) -> tuple[int, Lease | None]:
        """Store ``items``, complete the task, and claim ``next_id`` for ``worker`` (as :meth:`claim`),
        in one fenced script when both are on one shard (``complete_claim.lua``): a batch's tasks
        (``CELERY_HA_BATCH``) cost one script each instead of two. Returns (new items, the next
        task's lease, None when it is not claimable). Raises LeaseLost, having written and claimed
        nothing, if ``lease`` is not current. No window refill: a batch refills with its last task.
        """
        task_id, token = lease_ids(lease)
        next_id = _task_id(next_id)
        ttl_ms = self._ttl_ms(ttl)
        worker = check_text("worker", worker, MAX_NAME_CHARS)
        shard = self._of(task_id)
        if self._of(next_id) != shard:  # two slots: a completion, then a claim
            added = self.complete_and_push(lease, items).added
            return added, self.claim(next_id, worker, ttl)
        args = item_args(items)
        k = self._shards[shard]
        reply = self._run("complete_claim", task_id, token, self.history_max, int(self.history_age * 1000),
                          verdict_of(lease), next_id, worker, ttl_ms, *args,
                          keys=[*self._key_lists[shard], k.items, k.item_log], shard=shard)
        if refused(reply):
            raise_for(reply, task_id, token)
        added, claimed = reply
        return int(added), lease_from(claimed, worker)

