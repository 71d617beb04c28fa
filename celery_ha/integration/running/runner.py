"""Run one Celery message of a durable task: claim, run under a kept lease, complete or fail.

Claim in Redis (``None`` = duplicate or stale message: ack and drop), hand the function a
:class:`DurableContext`, keep the lease renewed from the lease keeper thread, then complete the task,
fail it (retry with backoff, or dead) or hand it back (shutdown, soft time limit after progress).
Execution is at-least-once: a crash re-runs the task from its last checkpoint, and the keyed sink
ignores what was already stored. Every outcome refills the broker window: a completion in its own
script (items, completion and refill in one round trip; the messages are pushed onto a Redis broker
by that script, ``integration/dispatch/script_push.py``, else go out from a background thread, or from the
task's own thread when its code keeps the CPU busy: ``integration/dispatch/sender.py``), any other outcome
through the pump.

Whose fault an exception is decides what it costs. One raised by the task's own function is the
task's: an attempt counted (retry or dead), unless it is an infrastructure error (Redis away or full:
handed back) or a lost lease. One raised by celery-ha's own code before or after the function (the
completion's script, the script push, a publish) is a bug of celery-ha: logged once with its
traceback and the task handed back without an attempt (:func:`_own_fault`). A failure to send the
refill messages afterwards changes nothing of the outcome (the pump re-sends them). An
``InvalidInput`` that the context's own checks raise on what the task's code hands it (an item that
is no dict or holds a datetime, a checkpoint with a set, ...: :func:`_refused_input`) is a coding
error that no retry mends: the task is dead at once, with the message.

A message whose argument is no durable task id (a URL sent with ``send_task``, or by a client of an
older release where ``.delay(url)`` was not refused) is dropped with a WARNING saying how durable
tasks are queued, not with the INFO line of a duplicate message.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from celery.exceptions import Reject, SoftTimeLimitExceeded

from celery_ha.base.errors import InvalidInput, LeaseLost
from celery_ha.integration.core.services import Services, services, set_node
from celery_ha.integration.core.task_errors import GracefulStop, HostNotReady, NotModified, is_permanent
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.core.tracing import attempt_started
from celery_ha.integration.dispatch.pump import chain_window_open, gate_on, pump_quietly, refill_window
from celery_ha.integration.dispatch.script_push import script_push
from celery_ha.integration.dispatch.sender import publish_queued, send_soon
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.running.graceful_stop import stop_handler
from celery_ha.integration.running.infrastructure import is_infrastructure_error, with_patience
from celery_ha.integration.running.lease_keeper import keeper
from celery_ha.state import Dispatched, Lease
from celery_ha.state.enqueue_ops import task_names_unchecked
from celery_ha.state.ids import ALPHABET, ID_LEN
from celery_ha.state.migrate_marks import dropped_for
from celery_ha.state.worker_registry import running_by_worker

log = logging.getLogger(__name__)

#: Seconds a message waits for Redis to take its claim before it goes back to the broker.
CLAIM_PATIENCE = 5.0

_TASK_ID = re.compile(f"[{re.escape(ALPHABET)}]{{{ID_LEN}}}")
#: The context's methods that check what the task's code hands them before anything is written, and
#: the writes they may go on to (a full buffer flushed, children queued): an InvalidInput raised in
#: the first and not in the second is the task's coding error (:func:`_refused_input`).
_CHECKS = frozenset(f.__code__ for f in (DurableContext.emit, DurableContext.save_checkpoint,
                                         DurableContext.signature))
_WRITES = frozenset(f.__code__ for f in (DurableContext._commit, DurableContext._flush_children))


def looks_like_task_id(value: object) -> bool:
    """Whether ``value`` has the shape of a durable task id (``state/ids.py``: 12 alphanumerics)."""
    return isinstance(value, str) and _TASK_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class Outcome:
    """What one message's run did to its durable task (``celery_outcome`` shows it to Celery).

    ``kind``: completed; dropped (duplicate or stale message); lost (the lease was taken over);
    released / abandoned (handed back: it runs again); failed:retry / failed:dead (an attempt
    counted: a retry waits in Redis until ``due_at``, or the task is dead).
    """

    kind: str
    task_id: str
    url: str = ""
    detail: str = ""
    due_at: float | None = None  # retry due time, Redis clock (epoch seconds)
    # The next task of a batch, claimed by this task's completion script (``then_claim``), or None.
    next_lease: Lease | None = field(default=None, repr=False, compare=False)


def run_message(spec: DurableTask, celery_task: Any, task_id: str, *, refill: bool = True,
                lease: Lease | None = None, then_claim: str | None = None,
                may_chain: Callable[[], bool] | None = None) -> Outcome:
    """Execute durable task ``task_id`` for one Celery message; returns the outcome. ``refill``
    refills the window afterwards (a batch refills once, after its last task). A batch hands in the
    ``lease`` the previous task's completion claimed, and names the task after this one
    (``then_claim``): a completion without refill then claims it in the same script, and the
    outcome carries its lease (``next_lease``). A chain (``running/chain.py``) hands in the lease
    too, and ``may_chain``: a completion with a refill, when it says yes, leases the next queued task
    of the same name to this process in the same script (``next_lease``). The
    children the task queues are not checked against the live workers' task names
    (``state/enqueue_ops.py``): they are written at a checkpoint or at the completion, where a
    refusal would fail celery-ha's own step, not the task's call."""
    with stop_handler().holding_lease(), task_names_unchecked():
        return _run_message(spec, celery_task, task_id, refill, lease, then_claim, may_chain)


def _not_an_id(spec: DurableTask, task_id: str) -> Outcome:
    """Drop a message whose argument is no durable task id, saying how durable tasks are queued."""
    log.warning("task %s: its message carries %r, not a durable task id: this looks like a URL passed to "
                ".delay(): durable tasks are enqueued with TaskQueue.enqueue(url, task=%r) or `celery-ha "
                "enqueue --task %s URL`, and the pump sends their messages; dropped", spec.name, task_id,
                spec.name, spec.name)
    return Outcome("dropped", task_id, detail="not a durable task id: durable tasks are enqueued, not sent")


def _claim(rt: Services, task_id: str) -> Lease | None:
    """Claim ``task_id`` for this process, patient while Redis is briefly away; a claim Redis cannot
    take puts the message back in the broker instead of losing it.

    In a pool process's main thread (prefork, solo: the only one running tasks under its worker
    name) a task found running under this very name is adopted: a claim whose reply was lost (a
    timeout, a Redis pause, then the retry), or a batch's next id that its previous completion
    claimed before an exception cut the reply's use, is this process's own lease, not another's."""
    adopt = threading.current_thread() is threading.main_thread()
    try:
        return with_patience(lambda: rt.queue.claim(task_id, rt.worker_name, adopt=adopt),
                             time.monotonic() + CLAIM_PATIENCE)
    except redis.RedisError as exc:
        if not is_infrastructure_error(exc):
            raise
        log.warning("task %s: cannot claim (%s); message requeued", task_id, exc)
        raise Reject(str(exc), requeue=True) from None


def _run_message(spec: DurableTask, celery_task: Any, task_id: str, refill: bool, lease: Lease | None,
                 then_claim: str | None, may_chain: Callable[[], bool] | None) -> Outcome:
    hostname = getattr(getattr(celery_task, "request", None), "hostname", None)
    if hostname:
        set_node(hostname)
    stop = stop_handler()
    if threading.current_thread() is threading.main_thread():
        stop.install()
    rt = services()
    keep = keeper(celery_task.app)
    chained_run = lease is not None and may_chain is not None  # leased by the chain's last completion
    if lease is None and "://" in task_id:  # no id has one: not worth a claim
        return _not_an_id(spec, task_id)
    if lease is None:
        lease = _claim(rt, task_id)
    if lease is None:
        if moved := dropped_for(rt.client, rt.queue.namespace):  # a read only when a message is dropped
            log.warning("task %s: namespace %r was migrated to %r (celery-ha migrate): message dropped, the "
                        "task runs there", task_id, rt.queue.namespace, moved)
            return Outcome("dropped", task_id, detail=f"its namespace was migrated to {moved}")
        if not looks_like_task_id(task_id):
            return _not_an_id(spec, task_id)
        log.info("task %s is not claimable (duplicate or stale message): dropped", task_id)
        return Outcome("dropped", task_id, detail="duplicate or stale message: the task is not claimable")
    ctx = DurableContext(lease, rt, spec)
    attempt = attempt_started(lease, rt)  # its span (tracing on only): current while the code runs
    keep.track(ctx, rt)
    outcome = Outcome("completed", task_id, lease.task.url)
    dispatched: list[Dispatched] | None = None  # what the completion's own refill dispatched
    next_lease: Lease | None = None  # the batch's or chain's next task, claimed by the completion's script
    task_cpu = 0.0  # CPU seconds of the task's own code (where its refill is published)
    in_task = False  # the task's own function is on the stack: what it raises is the task's
    chain: tuple[str, str] | None = None  # what the completion asked of a chain
    refilled = False  # the completion's own script refilled the window (one shard)
    try:
        publish_queued()  # what the last completion dispatched goes out now, not beside this task's code
        with stop.running(ctx):
            if stop.stop_requested:  # SIGTERM came while the lease was being taken: hand it back now
                raise GracefulStop()
            with stop.user_code():
                cpu_started = time.thread_time()
                in_task = True
                try:
                    spec.fn(ctx)
                except NotModified:  # its own page answered 304: complete it as unchanged
                    pass
                in_task = False
                task_cpu = time.thread_time() - cpu_started
            ctx.check()
            # Last items + completion + window refill: one fenced script, one round trip.
            # With a script push the refill's messages go onto the broker in that script too.
            if then_claim is not None and not refill:  # a batch's task: completion + the next claim
                next_lease = ctx._complete_and_claim(then_claim)
            else:
                window = refill_window(rt) if refill else None
                if (refill and may_chain is not None and not (stop.stop_requested or stop.soft_limit)
                        and chain_window_open(rt, window) and may_chain()):
                    chain = (rt.worker_name, spec.name)
                refilled = window is not None
                dispatched = ctx._complete(window, rt.settings.redispatch_after,
                                           script_push(celery_task.app, rt) if window is not None else None,
                                           host_wait=window is not None and gate_on(rt), chain=chain)
    except LeaseLost as exc:
        outcome = Outcome("lost", task_id, lease.task.url, f"lease lost: {exc}")
        log.warning("task %s stopped, its lease is lost: %s", task_id, exc)
    except GracefulStop:
        outcome = _hand_back(ctx, rt, "worker shutting down")
    except HostNotReady as exc:  # the host gate holds the host already: back to its queue, uncounted
        outcome = _hand_back(ctx, rt, str(exc))
    except SoftTimeLimitExceeded:
        if ctx.checkpoints_saved:
            outcome = _hand_back(ctx, rt, "soft time limit (progress saved)")
        else:
            outcome = _fail(ctx, rt, "soft time limit exceeded without progress", retry=True)
    except Exception as exc:
        if is_infrastructure_error(exc):
            outcome = _hand_back(ctx, rt, f"Redis unavailable ({type(exc).__name__}: {exc})")
            if chain is not None:  # the script may have run, its reply lost: a lease nobody knows of
                _release_unknown_chained(rt, task_id)
        elif in_task:
            outcome = _fail(ctx, rt, f"{type(exc).__name__}: {exc}",
                            retry=not (is_permanent(exc) or _refused_input(exc)))
        else:
            outcome = _own_fault(ctx, rt, exc)
    finally:
        keep.untrack(ctx)
    try:
        if refill and refilled and dispatched is not None:
            send_soon(celery_task.app, rt, dispatched, task_cpu, ctx.host_wait)  # the completion's refill
        elif refill:
            if dispatched:  # a sharded namespace's chain dispatched a gated task of another name
                send_soon(celery_task.app, rt, dispatched, task_cpu, ctx.host_wait)
            # Refill the window (a handed-back task goes to another worker); a chained task that
            # completed took no place of the window (no message), so there is nothing to refill.
            if not (chained_run and outcome.kind == "completed"):
                pump_quietly(celery_task.app, rt)
    except Exception:  # the task's outcome stands; what was dispatched is re-sent by the pump later
        log.exception("task %s: celery-ha could not send the refill messages (the pump re-sends them "
                      "after CELERY_HA_REDISPATCH_AFTER)", task_id)
    attempt.ended(outcome.kind, outcome.detail)
    next_lease = next_lease or ctx.chained  # leased by the completion, whatever was raised after it
    return replace(outcome, next_lease=next_lease) if next_lease is not None else outcome


def release_unstarted(rt: Services, lease: Lease) -> None:
    """Hand back a task leased to this process but never started (a batch's next id, a chain's next
    task, when a stop came first), uncounted; if that fails, its lease expires and the sweep
    reclaims it."""
    try:
        rt.queue.release(lease.task_id, token=lease.token, worker=rt.worker_name, count_stall=False,
                         reason="worker shutting down before it started")
    except Exception as exc:
        log.warning("could not hand back task %s (%s): its lease will expire", lease.task_id, exc)


def _release_unknown_chained(rt: Services, done_id: str) -> None:
    """A completion that asked for a chain lost its reply (Redis timed out or paused): its script may
    have run and leased the next task to this process, which never heard of it. This process is the
    one holder under its worker name and runs nothing else now, so whatever else it holds is that
    lease: handed back, uncounted, while Redis lets (within the lease's TTL; past it the lease
    expires and the sweep takes the task back with a stall)."""
    deadline = time.monotonic() + max(1.0, rt.settings.lease_ttl - 1.0)
    try:
        held = with_patience(lambda: running_by_worker(rt.client, rt.queue.namespace).get(rt.worker_name, []),
                             deadline)
        for tid in held:
            if tid == done_id:
                continue
            # Released by holder, not by token: nothing else leases under this name while it waits here.
            state = with_patience(lambda tid=tid: rt.queue.release(
                tid, worker=rt.worker_name, count_stall=False,
                reason="leased by a completion whose reply was lost"), deadline)
            log.warning("task %s, leased to this process by a completion whose reply was lost, handed "
                        "back: %s", tid, state)
    except Exception as exc:
        log.warning("could not look for a task leased by a completion whose reply was lost (%s): its "
                    "lease will expire", exc)


def _refused_input(exc: BaseException) -> bool:
    """Whether ``exc`` is an InvalidInput raised by the context's own check of what the task's code
    handed it (``emit``, ``save_checkpoint``, ``signature``: a list for an item, a datetime or a set in
    one), not by the write that may follow (a host key mode that keeps changing under the children's
    enqueue) nor by anything else the task called (``ctx.fetch`` of a bad URL keeps its retries)."""
    if not isinstance(exc, InvalidInput):
        return False
    checked = False
    tb = exc.__traceback__
    while tb is not None:  # outermost frame first
        code = tb.tb_frame.f_code
        if code in _WRITES:
            return False
        checked = checked or code in _CHECKS
        tb = tb.tb_next
    return checked


def _own_fault(ctx: DurableContext, rt: Services, exc: Exception) -> Outcome:
    """An unexpected error of celery-ha's own code around the task's function (the completion, the
    script push, a publish before it): a bug of celery-ha, not of the task. Logged once with its
    traceback, loudly, and the task is handed back without counting an attempt: it runs again (its
    keyed items make that safe). Every fifth such hand-back of a task counts a stall
    (``release.lua``), so a bug that fails every run ends in dead, with its reason, not in a loop.
    A fault raised after the completion's script committed leaves the task completed; the outcome
    says so."""
    log.error("celery-ha internal error while running task %s (not the task's fault: handed back, no "
              "attempt counted; every fifth counts a stall): %s: %s", ctx.task_id, type(exc).__name__, exc,
              exc_info=exc)
    outcome = _hand_back(ctx, rt, f"celery-ha internal error ({type(exc).__name__}: {exc})", own_fault=True)
    if outcome.kind == "lost":
        with contextlib.suppress(Exception):  # only for the outcome shown: Redis holds the truth
            if rt.queue.get(ctx.task_id).state == "completed":
                return Outcome("completed", ctx.task_id, ctx.url)
    return outcome


def _hand_back(ctx: DurableContext, rt: Services, reason: str, own_fault: bool = False) -> Outcome:
    """Keep what was produced (keyed, so safe), then release the lease without counting a stall
    (``own_fault``: counted as celery-ha's own, see :func:`_own_fault`); the release is retried
    while the lease lives (Redis may be coming back)."""
    try:
        ctx._commit(None)
    except (LeaseLost, redis.RedisError):
        pass  # the items are produced again by the next run
    except Exception:
        log.exception("task %s: its items could not be kept before the hand-back (the next run "
                      "produces them again)", ctx.task_id)
    lease_left = ctx.lease.expires_at - time.time()  # Redis time; only bounds how long we try
    deadline = time.monotonic() + max(0.0, min(lease_left, rt.settings.lease_ttl) - 1.0)
    try:
        state = with_patience(lambda: rt.queue.release(ctx.task_id, token=ctx.lease.token,
                                                       worker=rt.worker_name, count_stall=False,
                                                       reason=reason, own_fault=own_fault), deadline)
    except Exception as exc:
        log.warning("could not release task %s (%s): its lease will expire", ctx.task_id, exc)
        return Outcome("abandoned", ctx.task_id, ctx.url,
                       f"handed back ({reason}); the release failed, the lease expires")
    if state is None:
        log.warning("task %s not handed back (%s): this run no longer holds it", ctx.task_id, reason)
        return Outcome("lost", ctx.task_id, ctx.url, f"not handed back ({reason}): no longer held")
    log.warning("task %s handed back (%s): %s", ctx.task_id, reason, state)
    return Outcome("released", ctx.task_id, ctx.url, f"handed back: {reason}")


def _fail(ctx: DurableContext, rt: Services, error: str, retry: bool) -> Outcome:
    try:
        result = rt.queue.fail(ctx.lease, error, retry=retry)
    except LeaseLost as exc:
        return Outcome("lost", ctx.task_id, ctx.url, f"lease lost: {exc}")
    except redis.RedisError as exc:
        if not is_infrastructure_error(exc):
            raise
        return _hand_back(ctx, rt, f"Redis unavailable while failing ({exc}); not counted")
    log.warning("task %s failed (%s): %s", ctx.task_id, result, error)
    due_at = None
    if result == "retry":
        with contextlib.suppress(redis.RedisError):  # only for display: the retry is in Redis already
            due_at = rt.queue.get(ctx.task_id).due_at
    return Outcome(f"failed:{result}", ctx.task_id, ctx.url, error, due_at)
