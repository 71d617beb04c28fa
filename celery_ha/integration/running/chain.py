"""Chains (``CELERY_HA_CHAIN``): a pool process that completes a task takes the next one itself.

A durable task through Celery costs Redis two scripts: the claim its message's arrival makes, and
the completion (with the window's refill). While work is queued beyond what the window's messages
already offer the other pool processes, the completion's script also leases the best queued task of
the same task name to the completing process (``complete_dispatch.lua``: a pull, as BullMQ's
``moveToFinished`` fetches the next job), and the process runs it at once under the same Celery
message: one script per task, no message, no claim, no broker round trip. A chain lasts at most
``CELERY_HA_CHAIN`` seconds (1 by default; never more than a tenth of the message's time limit),
then the process goes back to the broker, where the window's messages wait for it.

Nothing is held back: a chain takes a task only after the refill has given the window every task it
has room for, and takes one task at a time (a batch's ids wait in their message; a chain's next task
is queued until its lease). Each chained task is claimed, fenced, renewed, checkpointed and
completed on its own (its lease names this process, so the worker's fast failover releases it when
the process dies); a shutdown or the message's soft time limit between two tasks ends the chain,
and a task leased but not started is handed back, uncounted.

A worker serving several namespaces keeps them fair by its consumer's rotation over their queues,
message by message; a chain holds its process in one namespace's work. So a chain also ends once
another namespace the worker serves has a message waiting on its crawl queue (the broker's lists
read at most every :data:`CHECK_EVERY` seconds of a chain; a broker whose lists cannot be read ends
it at once there).

What Celery sees: one message, whose result names the chained tasks' outcomes; Flower shows the
message's first task only (celery-ha's ``tasks``, dashboard and metrics show every task). Celery's
``worker_max_tasks_per_child`` (or ``--max-tasks-per-child``) counts messages: a process that has
run that many tasks stops chaining (:func:`set_recycle_after`, from the worker's ``celeryd_init``,
before the fork), so from then on each message is one task and Celery replaces the process after
at most twice that many tasks, as a team that recycles its processes against leaks expects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import redis

from celery_ha.integration.core.queues import broker_queue
from celery_ha.integration.core.services import Services, services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.dispatch.broker import broker_client, broker_lists
from celery_ha.integration.running.graceful_stop import stop_handler
from celery_ha.integration.running.runner import Outcome, release_unstarted, run_message

log = logging.getLogger(__name__)


def chain_seconds(celery_task: Any, chain: float) -> float:
    """How long a message's chain may go on: ``CELERY_HA_CHAIN``, at most a tenth of the message's
    time limits (a chained task runs under what is left of them), 0 = no chain."""
    if chain <= 0:
        return 0.0
    request = getattr(celery_task, "request", None)
    limits = [limit for limit in (getattr(request, "timelimit", None) or ())
              if isinstance(limit, (int, float)) and limit > 0]
    limits += [limit for limit in (getattr(celery_task, "time_limit", None),
                                   getattr(celery_task, "soft_time_limit", None))
               if isinstance(limit, (int, float)) and limit > 0]
    return min([chain, *(limit / 10 for limit in limits)])


#: Seconds of a chain between two reads of the other namespaces' crawl queues.
CHECK_EVERY = 0.1

#: Tasks a pool process runs before it stops chaining (the worker's max tasks per child; empty: no
#: bound), and the tasks this process has run under messages that may chain.
_recycle_after: list[int] = []
_tasks_run = [0]


def set_recycle_after(bound: int | None) -> None:
    """Remember how many tasks a pool process may run before Celery replaces it (None: it is not
    replaced; ``hooks.recycle_bound`` reads it); called in the worker's main process before the
    fork, so every pool process inherits it."""
    _recycle_after[:] = [bound] if bound else []


def recycle_due() -> bool:
    """Whether this process has run as many tasks as its worker lets a process run before Celery
    replaces it: it chains no more (each message is then one task, which Celery counts)."""
    return bool(_recycle_after) and _tasks_run[0] >= _recycle_after[0]


class ChainBudget:
    """Whether a message's chain may take one more task: before its deadline, and while no other
    namespace this worker serves has a message waiting (see the module docstring)."""

    def __init__(self, app: Any, rt: Services, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.app = app
        self.others = [broker_queue(ns) for ns in rt.settings.served_namespaces if ns != rt.queue.namespace]
        self.settings = rt.settings
        self.checked = time.monotonic()  # the message itself came from the rotation just now

    def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self.until or recycle_due():
            return False
        if self.others and now - self.checked >= CHECK_EVERY:
            self.checked = now
            if self._others_waiting():
                self.until = 0.0
                return False
        return True

    def _others_waiting(self) -> bool:
        client = broker_client(self.app, self.settings)
        if client is None:
            return True  # not a Redis broker: their lists cannot be read, so no chain there
        options = dict(self.app.conf.broker_transport_options or {})
        try:
            pipe = client.pipeline(transaction=False)
            for queue in self.others:
                for name in broker_lists(queue, options):
                    pipe.llen(name)
            return any(pipe.execute())
        except redis.RedisError:
            return True


def run_chain(spec: DurableTask, celery_task: Any, task_id: str,
              chain: float) -> tuple[Outcome, list[Outcome]]:
    """Run the message's task, then the tasks its completions lease to this process, for up to
    ``chain`` seconds; returns (the message's task's outcome, the chained tasks' outcomes)."""
    seconds = chain_seconds(celery_task, chain)
    # Only a pool process's main thread (prefork, solo) is the one holder under its worker name, which
    # the hand-back of a lease it never heard of relies on (runner.py): no chain in a thread pool.
    alone = threading.current_thread() is threading.main_thread()
    budget = ChainBudget(celery_task.app, services(), seconds) if seconds > 0 and alone else None
    stop = stop_handler()
    chained: list[Outcome] = []
    with stop.holding_lease():  # a SIGTERM between two tasks is noted: the chain ends below
        _tasks_run[0] += 1
        first = outcome = run_message(spec, celery_task, task_id, may_chain=budget)
        while outcome.next_lease is not None:
            lease = outcome.next_lease
            if stop.stop_requested or stop.soft_limit:  # leased, not started: back to queued
                release_unstarted(services(), lease)
                break
            _tasks_run[0] += 1
            outcome = run_message(spec, celery_task, lease.task_id, lease=lease, may_chain=budget)
            chained.append(outcome)
    return first, chained


def chain_summary(result: str, chained: list[Outcome]) -> str:
    """The Celery result of a message that chained: its own task's, then the chained tasks' counts."""
    if not chained:
        return result
    counts = Counter(o.kind for o in chained)
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return f"{result}; then {len(chained)} chained: {kinds}"
