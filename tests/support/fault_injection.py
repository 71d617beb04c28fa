"""Faults injected into celery-ha's own code inside real worker processes: tests only.

A test's workers import this module through ``CELERY_HA_EXTRA_IMPORTS`` (celery-ha itself never
does); it reads ``CELERY_HA_TEST_FAULTS``, a comma-separated list of the fault names below, and wraps
the celery-ha function each names so that it raises :class:`InjectedFault` (an error no code of
celery-ha expects: a stand-in for a bug of its own). Without the variable importing it changes
nothing. The wrappers are installed once, at import, in the worker's main process, so every pool
process inherits them; what a fault counts lives in the state Redis under
``celery-ha-test:faults:<namespace>:<fault>``, so "once per task" holds across processes.

Faults (the name is what ``CELERY_HA_TEST_FAULTS`` lists):

- ``complete-before``: ``DurableContext._complete`` raises before its script runs, once per task.
- ``complete-after``: ``DurableContext._complete`` raises after its script completed the task,
  once per task.
- ``complete-always``: ``DurableContext._complete`` raises before its script runs, every time (a
  bug of celery-ha that fails every run of a task).
- ``script-push``: the runner's ``script_push`` (the plan of the completion's own push) raises, the
  first :data:`SCRIPT_PUSH_FAULTS` times in the namespace.
- ``keeper-tick``: ``LeaseKeeper.renew_all`` raises on every other call of a process.
- ``keeper-heartbeat``: the keeper's worker-registry heartbeat raises on every other call.
- ``keeper-renew``: ``TaskQueue.renew`` raises on every other call of a process.
- ``slow-claim``: no fault of celery-ha: ``TaskQueue.claim`` holds a lease it took
  :data:`SLOW_CLAIM` seconds before returning it, once per task, and lists the task under
  ``<key>:held`` as it starts holding (the moment a graceful shutdown may meet a lease outside any
  task's context).
- ``slow-exit``: no fault of celery-ha: a ``worker_process_shutdown`` receiver connected after
  celery-ha's own keeps the pool process alive :data:`SLOW_EXIT` seconds more (a user's shutdown
  work), the time a lease keeper left running would take to register the process again.

Also one durable task whose own function fails: ``test_user_fault`` (its error is the task's).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import signals

from celery_ha.integration import DurableContext, durable_task
from celery_ha.integration.core.services import services
from celery_ha.integration.running import lease_keeper, runner
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state import TaskQueue

VARIABLE = "CELERY_HA_TEST_FAULTS"
SCRIPT_PUSH_FAULTS = 3
SLOW_EXIT = 2.0
SLOW_CLAIM = 1.5  # under the test clusters' 3 s lease TTL: nothing renews a lease before its context exists


class InjectedFault(RuntimeError):
    """The error an injected fault raises."""


def _key(fault: str) -> str:
    return f"celery-ha-test:faults:{services().settings.namespace}:{fault}"


def _first_time(fault: str, task_id: str) -> bool:
    """True the first time ``fault`` meets ``task_id`` (in any process)."""
    return bool(services().client.sadd(_key(fault), task_id))


def _every_other(fn: Callable[..., Any], fault: str) -> Callable[..., Any]:
    """``fn`` raising on every other call of this process (the first call raises)."""
    counter = itertools.count()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with lock:
            n = next(counter)
        if n % 2 == 0:
            services().client.incr(_key(fault))
            raise InjectedFault(f"{fault} (call {n})")
        return fn(*args, **kwargs)

    return wrapper


def _complete(original: Callable[..., Any], after: bool, always: bool = False) -> Callable[..., Any]:
    fault = "complete-always" if always else "complete-after" if after else "complete-before"

    @functools.wraps(original)
    def complete(self: DurableContext, *args: Any, **kwargs: Any) -> Any:
        if always:
            services().client.incr(_key(fault))
            raise InjectedFault(f"{fault} on task {self.task_id}")
        if not after and _first_time(fault, self.task_id):
            raise InjectedFault(f"{fault} on task {self.task_id}")
        result = original(self, *args, **kwargs)
        if after and _first_time(fault, self.task_id):
            raise InjectedFault(f"{fault} on task {self.task_id}")
        return result

    return complete


def _script_push(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def script_push(*args: Any, **kwargs: Any) -> Any:
        if services().client.incr(_key("script-push")) <= SCRIPT_PUSH_FAULTS:
            raise InjectedFault("script-push")
        return original(*args, **kwargs)

    return script_push


def _slow_claim(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def claim(self: TaskQueue, task_id: str, *args: Any, **kwargs: Any) -> Any:
        lease = original(self, task_id, *args, **kwargs)
        if lease is not None and _first_time("slow-claim", task_id):
            services().client.rpush(_key("slow-claim") + ":held", task_id)
            time.sleep(SLOW_CLAIM)  # the lease held outside the task's context, not a wait
        return lease

    return claim


def _slow_exit(**_: Any) -> None:
    client = services().client
    client.incr(_key("slow-exit"))  # the test checks that the exit was slow
    client.rpush(_key("slow-exit") + ":at", f"{os.getpid()}@{redis_now_ms(client)}")
    time.sleep(SLOW_EXIT)  # the simulated shutdown work of a user's receiver, not a wait


def install(faults: set[str]) -> None:
    unknown = faults - {"complete-before", "complete-after", "complete-always", "script-push", "keeper-tick",
                        "keeper-heartbeat", "keeper-renew", "slow-claim", "slow-exit"}
    if unknown:
        raise ValueError(f"{VARIABLE}: unknown faults {sorted(unknown)}")
    if faults & {"complete-before", "complete-after", "complete-always"}:
        DurableContext._complete = _complete(DurableContext._complete,  # type: ignore[method-assign]
                                             after="complete-after" in faults,
                                             always="complete-always" in faults)
    if "script-push" in faults:
        runner.script_push = _script_push(runner.script_push)  # type: ignore[assignment]
    if "keeper-tick" in faults:
        lease_keeper.LeaseKeeper.renew_all = _every_other(  # type: ignore[method-assign]
            lease_keeper.LeaseKeeper.renew_all, "keeper-tick")
    if "keeper-heartbeat" in faults:
        lease_keeper.heartbeat = _every_other(lease_keeper.heartbeat, "keeper-heartbeat")  # type: ignore[assignment]
    if "keeper-renew" in faults:
        TaskQueue.renew = _every_other(TaskQueue.renew, "keeper-renew")  # type: ignore[method-assign]
    if "slow-claim" in faults:
        TaskQueue.claim = _slow_claim(TaskQueue.claim)  # type: ignore[method-assign]
    if "slow-exit" in faults:
        # Connected in the pool process, after the app's own hooks: the receivers run in that order.
        signals.worker_process_init.connect(
            lambda **_: signals.worker_process_shutdown.connect(_slow_exit, weak=False), weak=False)


@durable_task(name="test_user_fault")
def user_fault(ctx: DurableContext) -> None:
    """The task's own function fails: that error is the task's (an attempt counted)."""
    ctx.emit({"url": ctx.url, "attempt": ctx.attempt}, key=f"{ctx.url}#{ctx.attempt}")
    raise ValueError(f"the task's own bug ({ctx.url})")


_requested = {name.strip() for name in os.environ.get(VARIABLE, "").split(",") if name.strip()}
if _requested:
    install(_requested)
