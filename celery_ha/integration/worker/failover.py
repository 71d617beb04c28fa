"""Fast failover: when a prefork child dies, release its lease at once instead of after the TTL.

When a pool child is SIGKILLed or OOM-killed, Celery's main process reports the task with
``task_failure`` / ``WorkerLostError``. The message carried the durable task id; the task record
names the lease holder ``node:pid``. If that holder is a process of this node that is no longer
alive, the lease is released at once (fenced by token and holder, stall counted) and the pump sends
the task again, so it re-runs within about a second instead of after the lease TTL. A lease another
process has since taken is never touched: the holder string would differ. With chains
(``CELERY_HA_CHAIN``) the task a child ran may be no id of its message, so the leases every dead
process of this node still holds are released too (a read of the running tasks, once per loss).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded

from celery_ha.base.procfs import pid_alive
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import is_durable
from celery_ha.integration.core.tracing import task_event
from celery_ha.integration.dispatch.pump import pump_quietly, resend_waiting
from celery_ha.integration.patches.timeout_pid import timed_out_child
from celery_ha.state.worker_registry import running_by_worker, split_worker

log = logging.getLogger(__name__)


def holder_is_dead_here(rt: Services, holder: str) -> bool:
    """Whether ``holder`` (``node:pid``) is a process of this node, not this one, that is gone."""
    node, pid = split_worker(holder)
    return node == rt.node and pid is not None and pid != os.getpid() and not pid_alive(pid)


def holder_is_child(rt: Services, holder: str, child: int) -> bool:
    """Whether ``holder`` (``node:pid``) is the pool process ``child`` of this node, dead or alive."""
    node, pid = split_worker(holder)
    return node == rt.node and pid == child and pid != os.getpid()


def release_dead_holder(rt: Services, task_id: str, count_stall: bool, reason: str,
                        dying: int | None = None) -> str | None:
    """Release ``task_id`` if its lease is held by a dead process of this node (``dying``: or by that
    pool process, about to be killed, still alive); returns the state."""
    try:
        info = rt.queue.get(task_id)
    except Exception:
        return None
    if info.state != "running" or not info.worker:
        return None
    if not (holder_is_child(rt, info.worker, dying) if dying is not None
            else holder_is_dead_here(rt, info.worker)):
        return None
    state = rt.queue.release(task_id, token=info.token, worker=info.worker, count_stall=count_stall,
                             reason=reason)
    task_event(rt, info, "celery_ha.failover", **{"celery_ha.reason": reason, "celery_ha.released_to": state})
    return state


def our_held_leases(rt: Services) -> dict[str, list[str]]:
    """Running tasks held by processes of this node: holder -> task ids."""
    return {holder: tids for holder, tids in running_by_worker(rt.client, rt.settings.namespace).items()
            if split_worker(holder)[0] == rt.node}


def on_child_lost(rt: Services, app: Any, celery_task: Any, exception: BaseException | None,
                  args: Any) -> None:
    """``task_failure`` in the main process: release the lease of a child that died, or that the
    hard time limit is about to kill.

    billiard reports a hard time limit here before it sends the child SIGTERM (then SIGKILL): the
    child is still alive, and its SIGTERM would otherwise hand the task back as a graceful stop,
    uncounted, so a task that outlives its limit every time would run for ever. Its lease is released
    now, a stall counted (dead after max_stalls); the child's own hand-back then finds the lease
    gone and writes nothing."""
    if not isinstance(exception, (WorkerLostError, TimeLimitExceeded)) or not is_durable(celery_task):
        return
    if not args:
        return
    ids = [str(a) for a in args]  # one id, or the ids of a batch (CELERY_HA_BATCH)
    timed_out = isinstance(exception, TimeLimitExceeded)
    reason = ("hard time limit exceeded" if timed_out else f"pool child died: {type(exception).__name__}")
    # Only the leases of the process being killed: another id of a batch may be running in a sibling
    # (a message of it re-sent while it waited), alive and holding its lease.
    dying = timed_out_child() if timed_out else None
    try:
        released = False
        known = [] if timed_out and dying is None else ids  # unknown process: leases expire
        if known and rt.settings.chain_seconds > 0:
            # A chain's task (running/chain.py) is no id of the message: the leases the process holds.
            known = known + [tid for holder, tids in our_held_leases(rt).items() for tid in tids
                             if tid not in ids and (holder_is_child(rt, holder, dying) if dying is not None
                                                    else holder_is_dead_here(rt, holder))]
        for durable_id in known:
            state = release_dead_holder(rt, durable_id, count_stall=True, reason=reason, dying=dying)
            if state is not None:
                released = True
                log.warning("fast failover: task %s released (%s): %s", durable_id, state, reason)
        resent = resend_waiting(app, rt, ids)  # died before reaching them: none is stranded
        if resent:
            log.warning("fast failover: %d unclaimed task(s) of the dead child sent again", resent)
        if released or resent:
            pump_quietly(app, rt)
    except redis.RedisError as exc:
        log.warning("fast failover for %s failed (lease expiry and redispatch will cover it): %s",
                    ", ".join(ids[:5]), exc)
