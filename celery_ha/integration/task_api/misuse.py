"""A durable task used the Celery way, and a plain Celery task queued as a durable one: refused at
once, in one line that says what to do instead, never dropped in silence.

- ``.delay(url)``, ``.apply_async``, ``.apply``, a signature's ``.delay()`` / ``.apply_async()`` (a
  chain, a group, a beat entry naming the task) or a direct call ``task(url)``: the message would
  carry the URL where the runner expects a durable task id, and the runner could only drop it. Each
  raises :class:`DurableTaskCallError` (an ``InvalidInput`` and a ``TypeError``) naming
  ``TaskQueue.enqueue``. The task class gets ``apply_async`` and ``apply`` of its own
  (:data:`TASK_CLASS_OVERRIDES`); ``__call__`` is left alone, since Celery's tracer calls it (or
  ``run``) to execute a message: the direct call is refused in ``run`` (``decorator.py``).
- A plain task's name in a durable task (``TaskQueue.enqueue(url, task="proj.tasks.scrape_title")``,
  refused there while live workers run no durable task of that name, but queued with
  ``allow_unknown_task``, by ``enqueue_many_with_status`` or before the workers came): the pump's
  message names a task the worker has, so Celery would run the plain function with the durable id
  as its argument, and again after every ``CELERY_HA_REDISPATCH_AFTER`` for ever, since nothing
  claims the task. :class:`PlainTaskGuard`, a consumer step that every app binding a durable task
  gets (:func:`_on_bound`), takes such a message before Celery runs it: its durable tasks end dead
  with the reason, one WARNING each, and the message is rejected.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import redis

from celery_ha.base.errors import InvalidInput
from celery_ha.base.settings import MAX_BATCH_IDS
from celery_ha.integration.core.services import Services, namespace_of_queue, services
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.pump import pump_quietly
from celery_ha.integration.patches.strategy_guard import StrategyGuard
from celery_ha.integration.running.runner import looks_like_task_id
from celery_ha.state.ids import ID_LEN

log = logging.getLogger(__name__)

#: The Celery message id celery-ha gives a durable task's message: the (first) task id, a dot and
#: a nonce (``dispatch/pump.py`` ``message_id``; the script push's ``<nonce>-<n>``).
PUMP_MESSAGE_ID = re.compile(rf"[0-9A-Za-z]{{{ID_LEN}}}\.[\w-]+")


class DurableTaskCallError(InvalidInput, TypeError):
    """A durable task was called the Celery way (see the module docstring): nothing was queued."""


def not_enqueued(name: str, how: str) -> DurableTaskCallError:
    """The error for durable task ``name`` used through ``how`` (one line: what to do instead)."""
    return DurableTaskCallError(
        f"{name!r} is a @durable_task, not called with arguments ({how} runs nothing: its messages "
        f"carry durable task ids); enqueue the URL instead: TaskQueue.from_url(REDIS_URL, namespace=...)"
        f".enqueue(url, task={name!r}) or `celery-ha enqueue --task {name} URL`; the pump sends the message")


def _refuse_apply_async(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise not_enqueued(self.name, ".delay() / .apply_async() (or a signature's)")


def _refuse_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise not_enqueued(self.name, ".apply()")


def _on_bound(cls: Any, app: Any) -> None:
    """Celery's hook when a task class is bound to an app (at the app's finalize, before a worker
    builds its consumer): the app gets the plain-task guard. The base class's hook runs first."""
    owner = next(k for k in cls.__mro__ if k.__dict__.get("on_bound") is _ON_BOUND)
    super(owner, cls).on_bound(app)
    app.steps["consumer"].add(PlainTaskGuard)


_ON_BOUND = classmethod(_on_bound)

#: Methods of every durable task's Celery class (``shared_task`` makes options class attributes).
TASK_CLASS_OVERRIDES: dict[str, Any] = {"apply_async": _refuse_apply_async, "apply": _refuse_apply,
                                        "on_bound": _ON_BOUND}


def argument_ids(message: Any) -> list[str]:
    """The string arguments of a Celery message: a durable task's id, or a batch's ids; [] when the
    message has none or its body cannot be read."""
    try:
        payload = message.payload  # protocol 2: (args, kwargs, embed); protocol 1: a dict
        args = payload.get("args", ()) if isinstance(payload, dict) else payload[0]
        return [a for a in args if isinstance(a, str)][:MAX_BATCH_IDS]  # no more than a batch carries
    except Exception:  # a body this worker cannot decode: the Celery task id is all there is
        return []


def fail_named(rt: Services, name: str, durable_id: str, error: str, retry: bool) -> str | None:
    """Claim durable task ``durable_id`` and fail it with ``error`` when it is a task of ``name``
    waiting for its claim; its result ('retry' or 'dead'), None when it is none of ours, not
    claimable, or Redis refused (its message is then sent again after the redispatch timeout)."""
    try:
        info = rt.queue.get(durable_id)
        if info is None or info.task != name:  # another task's id, or a string argument of a foreign task
            return None
        lease = rt.queue.claim(durable_id, rt.worker_name)
        if lease is None:
            return None
        return rt.queue.fail(lease, error, retry=retry)
    except redis.RedisError as exc:
        log.warning("could not fail task %s of %r (it will be sent again): %s", durable_id, name, exc)
        return None


class PlainTaskGuard(StrategyGuard):
    """Consumer step: a message of celery-ha's pump (its id has the pump's shape and it came from a
    served namespace's queue) whose task name is a plain Celery task is never run (module docstring).
    Any other message of a plain task (the user's own, celery-ha's maintenance jobs) runs as always."""

    without = ("a durable task queued under a plain Celery task's name runs that plain task with its "
               "task id, again after every CELERY_HA_REDISPATCH_AFTER")

    def guards(self, name: str) -> bool:
        return name not in REGISTRY

    def intercept(self, consumer: Any, message: Any, name: str) -> bool:
        headers = getattr(message, "headers", None)
        message_id = headers.get("id") if isinstance(headers, dict) else None
        if not isinstance(message_id, str) or not PUMP_MESSAGE_ID.fullmatch(message_id):
            return False
        info = getattr(message, "delivery_info", None)
        namespace = namespace_of_queue(info.get("routing_key") if isinstance(info, dict) else None)
        if namespace is None:
            return False
        rt = services(namespace)
        ids = [i for i in argument_ids(message) if looks_like_task_id(i)] or [message_id.split(".", 1)[0]]
        error = (f"{name!r} is a plain Celery task, not a @durable_task: not run (decorate a function of "
                 f"ctx with @durable_task and queue its name)")
        failed = 0
        try:
            for durable_id in ids:
                result = fail_named(rt, name, durable_id, error, retry=False)
                if result is not None:
                    failed += 1
                    log.warning("task %s: %s; the task is %s", durable_id, error, result)
        finally:  # never left to Celery, even when Redis refused: the pump sends it again
            message.reject_log_error(log, getattr(consumer, "connection_errors", ()))
        if failed:
            pump_quietly(consumer.app, rt)  # the window slots are free
        else:
            log.warning("a message of celery-ha (%s, namespace %r) names the plain Celery task %r: "
                        "dropped, not run (no task of it waited for a claim)", message_id, namespace, name)
        return True
