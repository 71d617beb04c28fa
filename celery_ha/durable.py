"""Durable tasks: ``@durable_task`` and the context ``ctx`` a task function receives.

A Celery message carries only the durable task id. Running it means: claim the task in Redis
(``None`` = duplicate or stale message: ack and drop), hand the function a :class:`DurableContext`,
keep the lease renewed from a background thread, then complete or fail the task under the lease.

Outputs are exactly-once: ``ctx.emit`` buffers keyed items, which are committed together with each
checkpoint (one fenced Lua script) and at completion. Execution is at-least-once: a crash re-runs
the task from its last checkpoint, and the keyed sink ignores what was already stored.

Example::

    @durable_task(name="fetch_page", item_key="url")
    def fetch_page(ctx):
        page = ctx.fetch(ctx.url)
        ctx.emit({"url": ctx.url, "size": len(page.content)})
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from . import fetching
from .errors import LeaseLost
from .queue import Lease, TaskInfo, task_id_for
from .queue.taskqueue import DEFAULT_TASK
from .runtime import Runtime, runtime, set_node
from .settings import Settings
from .sink import item_key
from .validation import (
    MAX_ITEM_BYTES,
    MAX_META_BYTES,
    PRIORITY_RANGE,
    check_int,
    check_task_name,
    check_url,
    dumps_capped,
)

log = logging.getLogger(__name__)

#: Buffered items are committed (without a checkpoint) once this many are pending.
FLUSH_AT = 500

# Re-exported so task code imports errors from one place (the fetcher will provide the same names).
FetchError = fetching.FetchError
PermanentFetchError = fetching.PermanentFetchError


class PermanentError(Exception):
    """Raise from a task to fail it without retry (e.g. the input can never be processed)."""

    permanent = True


class GracefulStop(BaseException):
    """Raised inside a running task when the worker shuts down: hand the task back unharmed.

    A BaseException, so task code's ``except Exception`` does not swallow it.
    """


@dataclass
class DurableTask:
    """A registered durable task: its function and how to route and key its output."""

    name: str
    fn: Callable[[DurableContext], Any]
    queue: str = "crawl"
    item_key: str | None = None
    celery_task: Any = None


REGISTRY: dict[str, DurableTask] = {}


class DurableContext:
    """What a durable task function sees: its input, its checkpoint, and fenced ways to write."""

    def __init__(self, lease: Lease, rt: Runtime, spec: DurableTask) -> None:
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
    def fetch(self, url: str, **kwargs: Any) -> Any:
        """HTTP through the project's fetcher (proxy-aware once ``celery_ha.fetcher`` lands)."""
        self.check()
        response = fetching.fetch(url, **kwargs)
        self.check()
        return response

    def emit(self, item: Mapping[str, Any], key: str | None = None) -> str:
        """Buffer one output item; stored exactly once under ``key`` (default: the task's
        ``item_key`` field, else a stable hash of the item). Returns the key."""
        self.check()
        if not isinstance(item, Mapping):
            raise TypeError(f"emit() takes a dict, got {type(item).__name__}")
        k = key if key is not None else item_key(item, self._spec.item_key)
        value = dict(item)
        dumps_capped("item", value, MAX_ITEM_BYTES)
        self._items.append((str(k), value))
        self.emitted += 1
        if len(self._items) >= FLUSH_AT:
            self.flush()
        return str(k)

    def enqueue(self, url: str, task: str = DEFAULT_TASK, priority: int = 0,
                meta: Mapping[str, Any] | None = None, dedup: bool = True,
                max_attempts: int | None = None) -> str | None:
        """Queue a child task. Buffered and written before the next checkpoint, so a checkpoint
        never covers children that were not queued; with ``dedup`` (default) re-running the parent
        never doubles them. Returns the child's id (deterministic with dedup)."""
        self.check()
        spec = {"url": url, "task": task, "priority": priority, "meta": dict(meta) if meta else None,
                "dedup": dedup, "max_attempts": max_attempts}
        if not dedup:
            return self._rt.queue.enqueue_many([spec])[0]
        check_url(url)  # validate now, so the error points at this call
        check_task_name(task)
        check_int("priority", priority, *PRIORITY_RANGE)
        if meta:
            dumps_capped("meta", meta, MAX_META_BYTES)
        self._children.append(spec)
        if len(self._children) >= FLUSH_AT:
            self._flush_children()
        return task_id_for(task, url)

    def save_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        """Commit the buffered items and this checkpoint together (one fenced step)."""
        self.check()
        self._commit(dict(checkpoint))
        self.checkpoints_saved += 1

    def flush(self) -> None:
        """Commit buffered items and children now, leaving the checkpoint as it is."""
        self.check()
        self._commit(None)

    def _flush_children(self) -> None:
        if self._children:
            self._rt.queue.enqueue_many(self._children)
            self._children = []

    def _commit(self, checkpoint: dict[str, Any] | None) -> None:
        self._flush_children()
        if not self._items and checkpoint is None:
            return
        try:
            self.committed += self._rt.queue.commit(self.lease, self._items, checkpoint)
        except LeaseLost as exc:
            self.mark_lost(str(exc))
            raise
        self._items = []


# ---------------------------------------------------------------------- running one message
_current: DurableContext | None = None
_in_user_code = False
_stop_requested = False


_previous_sigterm: Any = signal.SIG_DFL


def _on_sigterm(signum: int, frame: Any) -> None:
    """Pool child SIGTERM: stop the running task where it is and hand it back; idle: exit as before."""
    global _stop_requested
    _stop_requested = True
    ctx = _current
    if ctx is not None:
        ctx.stopping = True
        if _in_user_code:
            raise GracefulStop()
        return
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)


def install_stop_handler() -> None:
    """Install the child's SIGTERM handler, keeping the pool's own handler for idle moments.

    Called before every task: billiard installs its exit handler after ``worker_process_init``,
    so installing once at start-up would be undone.
    """
    global _previous_sigterm
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return
    _previous_sigterm = current
    signal.signal(signal.SIGTERM, _on_sigterm)


def _pump_after(celery_task: Any, rt: Runtime) -> None:
    from .pump import pump

    try:
        pump(rt.queue, celery_task.app, rt.settings)
    except Exception as exc:  # the beat/watchdog sweep will pump later
        log.warning("pump after task failed: %s", exc)


def run_message(spec: DurableTask, celery_task: Any, task_id: str) -> str:
    """Execute one Celery message for durable task ``task_id``; returns the outcome."""
    global _current, _in_user_code
    from .lease_keeper import keeper

    hostname = getattr(getattr(celery_task, "request", None), "hostname", None)
    if hostname:
        set_node(hostname)
    if threading.current_thread() is threading.main_thread():
        install_stop_handler()
    rt = runtime()
    keep = keeper(celery_task.app)
    lease = rt.queue.claim(task_id, rt.worker_name)
    if lease is None:
        log.info("task %s is not claimable (duplicate or stale message): dropped", task_id)
        return "dropped"
    ctx = DurableContext(lease, rt, spec)
    keep.track(ctx)
    _current = ctx
    outcome = "completed"
    try:
        try:
            _in_user_code = True
            spec.fn(ctx)
        finally:
            _in_user_code = False
        ctx.check()
        ctx._commit(None)
        rt.queue.complete(lease)
    except LeaseLost as exc:
        outcome = "lost"
        log.warning("task %s stopped, its lease is lost: %s", task_id, exc)
    except GracefulStop:
        outcome = _hand_back(ctx, rt, "worker shutting down")
    except SoftTimeLimitExceeded:
        if ctx.checkpoints_saved:
            outcome = _hand_back(ctx, rt, "soft time limit (progress saved)")
        else:
            outcome = _fail(ctx, rt, "soft time limit exceeded without progress", retry=True)
    except Exception as exc:
        retry = not fetching.is_permanent(exc)
        outcome = _fail(ctx, rt, f"{type(exc).__name__}: {exc}", retry=retry)
    finally:
        keep.untrack(ctx)
        _current = None
    _pump_after(celery_task, rt)  # refill the window (a handed-back task goes to another worker)
    return outcome


def _hand_back(ctx: DurableContext, rt: Runtime, reason: str) -> str:
    """Keep what was produced (keyed, so safe), then release the lease without counting a stall."""
    with contextlib.suppress(LeaseLost, redis.RedisError):
        ctx._commit(None)
    try:
        state = rt.queue.release(ctx.task_id, token=ctx.lease.token, worker=rt.worker_name,
                                 count_stall=False, reason=reason)
    except redis.RedisError as exc:
        log.warning("could not release task %s (%s): its lease will expire", ctx.task_id, exc)
        return "abandoned"
    log.warning("task %s handed back (%s): %s", ctx.task_id, reason, state)
    return "released"


def _fail(ctx: DurableContext, rt: Runtime, error: str, retry: bool) -> str:
    try:
        result = rt.queue.fail(ctx.lease, error, retry=retry)
    except LeaseLost:
        return "lost"
    log.warning("task %s failed (%s): %s", ctx.task_id, result, error)
    return f"failed:{result}"


def durable_task(name: str | None = None, *, queue: str = "crawl", item_key: str | None = None,
                 **celery_options: Any) -> Callable[[Callable[[DurableContext], Any]], Any]:
    """Declare a durable task; ``name`` is both the queue's task name and the Celery task name.

    ``item_key`` names the item field that keys emitted items (default: a content hash). Extra
    keyword arguments go to Celery (e.g. ``soft_time_limit``). The task is a shared task, so any
    Celery app that imports the module (the ``celery_ha`` app does) can run it.
    """

    def decorate(fn: Callable[[DurableContext], Any]) -> Any:
        task_name = name or fn.__name__
        spec = DurableTask(name=task_name, fn=fn, queue=queue, item_key=item_key)
        options = {"acks_late": True, "ignore_result": True, "reject_on_worker_lost": False,
                   **celery_options}

        def run(self: Any, task_id: str) -> str:
            return run_message(spec, self, task_id)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        celery_task = shared_task(name=task_name, bind=True, queue=queue, **options)(run)
        spec.celery_task = celery_task
        REGISTRY[task_name] = spec
        fn.durable = spec  # type: ignore[attr-defined]
        return celery_task

    return decorate


def is_durable(celery_task: Any) -> bool:
    """Whether a Celery task object is one of ours (by name: the registry fills at import)."""
    return getattr(celery_task, "name", None) in REGISTRY
