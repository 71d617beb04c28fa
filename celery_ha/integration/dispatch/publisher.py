"""Publish one Celery message of durable task ids at the lowest CPU cost Celery's public API allows.

A worker publishes a refill message after every completion, so what ``app.send_task`` spends per
message is paid once per task, on the pool process that ran it. Two parts of it repeat work whose
result never changes for a message that carries only task ids:

- ``argsrepr``: Celery renders the arguments with ``saferepr`` for monitors (Flower shows it). For
  a list of id strings ``repr`` gives the same text at a fraction of the cost; it is passed in.
- the queue declaration: Celery binds a copy of the queue to the producer's channel before every
  publish (kombu then finds the declaration in its per-connection cache and does nothing else).
  :class:`HeldProducer` keeps one bound copy per queue for as long as it keeps its producer, and a
  publish passes it; kombu still declares it on a connection that has not seen it (after a reconnect).
- the parent trail: a message sent from inside a task is added to that task's ``request.children``
  (for result backends); a refill is no child of the task whose completion dispatched it.

Measured on this machine kind (Redis broker, one id per message, ``benchmarks/publish_bench.py``):
0.75-0.85x the client CPU of ``send_task`` without task-sent events, about half of it with them (how
refills were published before). Everything else goes through Celery as usual:
routing, the ``before_task_publish`` / ``after_task_publish`` signals, retries of the publish.
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery_ha.base.settings import Settings


class HeldProducer:
    """A producer taken from an app's pool and kept across publishes; given back when idle, when the
    app changes, and after a publish failed (the next publish takes a fresh one). Taking one from the
    pool per message binds it to a pooled connection and a new channel each time: about a third of
    what a publish costs."""

    def __init__(self) -> None:
        self._app: Any = None
        self._context: Any = None
        self._declared: dict[str, list[Any]] = {}  # queue name -> [queue bound to the producer's channel]
        self.producer: Any = None

    @property
    def held(self) -> bool:
        return self._context is not None

    def get(self, app: Any) -> Any:
        if self._context is not None and self._app is not app:
            self.release()
        if self._context is None:
            context = app.producer_or_acquire()
            self.producer = context.__enter__()
            self._app, self._context = app, context
        return self.producer

    def declare(self, queue: str) -> list[Any]:
        """What a publish on ``queue`` with the held producer declares: its app's queue, bound once to
        the producer's channel (see the module docstring). Call after :meth:`get`."""
        bound = self._declared.get(queue)
        if bound is None:
            bound = self._declared[queue] = [self._app.amqp.queues[queue].bind(self.producer.channel)]
        return bound

    def release(self) -> None:
        context, self._context, self._app, self.producer = self._context, None, None, None
        self._declared = {}
        if context is not None:
            with contextlib.suppress(Exception):  # a broken connection goes back to be revived
                context.__exit__(None, None, None)


def batch_time_limits(app: Any, task: str, n: int, settings: Settings | None) -> dict[str, float]:
    """The time limits of a message that carries ``n`` ids of ``task``: the task's own (its Celery
    attributes where this app has registered it, else the app's, else ``CELERY_HA_TASK_TIME_LIMIT``'s),
    ``n`` times over, since a batch's ids run one after the other under the one message's limits.
    Empty for a message of one id (Celery applies the task's own)."""
    if n <= 1:
        return {}
    registered = app.tasks.get(task) if getattr(app, "finalized", False) else None
    hard = (getattr(registered, "time_limit", None) or getattr(app.conf, "task_time_limit", None)
            or (settings.task_time_limit if settings is not None else None))
    soft = (getattr(registered, "soft_time_limit", None) or getattr(app.conf, "task_soft_time_limit", None)
            or (settings.task_soft_time_limit if settings is not None else None))
    limits = {}
    if hard:
        limits["time_limit"] = float(hard) * n
    if soft:
        limits["soft_time_limit"] = float(soft) * n
    return limits


def publish_ids(app: Any, task: str, ids: list[str], *, queue: str, priority: int, message_id: str,
                producer: Any, declare: list[Any] | None = None,
                limits: dict[str, float] | None = None) -> None:
    """Send one Celery message of ``task`` carrying ``ids`` (its only arguments) on ``queue``.
    ``declare``: the bound queue from :meth:`HeldProducer.declare` (None: Celery declares it);
    ``limits``: the message's own time limits (a batch's, :func:`batch_time_limits`)."""
    options: dict[str, Any] = {} if declare is None else {"declare": declare}
    options.update(limits or {})
    app.send_task(task, args=ids, queue=queue, priority=priority, task_id=message_id, producer=producer,
                  argsrepr=repr(ids), kwargsrepr="{}", add_to_parent=False, **options)
