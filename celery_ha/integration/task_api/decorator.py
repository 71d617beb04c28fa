"""``@durable_task``: declare a task whose runs are claimed, fenced and completed in Redis.

A Celery message carries only the durable task id; the Celery task made here runs it through
:func:`celery_ha.integration.running.runner.run_message`. Example::

    @durable_task(name="fetch_page", item_key="url")
    def fetch_page(ctx):
        page = ctx.fetch(ctx.url)
        ctx.emit({"url": ctx.url, "size": len(page.content)})

Work is queued with ``TaskQueue.enqueue(url, task=...)`` (or ``celery-ha enqueue``), and the pump
sends the messages. Calling the task the Celery way (``.delay``, ``.apply_async``, ``.apply``, a
signature, a direct call) would hand the runner a URL as a task id, which it can only drop: those
calls raise :class:`~celery_ha.integration.task_api.misuse.DurableTaskCallError` instead
(``misuse.py``). celery-ha's own messages never go through them: the pump and the refills use
``app.send_task`` (``integration/dispatch/publisher.py``), the script push writes them in Lua.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import shared_task

from celery_ha.base.errors import ConfigurationError
from celery_ha.integration.core.queues import CRAWL
from celery_ha.integration.core.services import namespace_of_request, services, serving
from celery_ha.integration.core.task_spec import REGISTRY, DurableTask
from celery_ha.integration.running.batch import run_batch, summary
from celery_ha.integration.running.celery_outcome import DurableTaskDead, report
from celery_ha.integration.running.chain import chain_summary, run_chain
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.running.runner import looks_like_task_id
from celery_ha.integration.task_api.misuse import TASK_CLASS_OVERRIDES, not_enqueued

#: Celery options celery-ha sets on every durable task, which a task may not override: its
#: guarantees rest on them (a message is acknowledged after its task ran; a task whose worker died is
#: recovered from Redis, not redelivered by the broker), and the app-level settings of the same names
#: are refused at start-up for the same reason.
FIXED_OPTIONS = {"acks_late": True, "reject_on_worker_lost": False}


def durable_task(name: str | None = None, *, queue: str = CRAWL, item_key: str | None = None,
                 **celery_options: Any) -> Callable[[Callable[[DurableContext], Any]], Any]:
    """Declare a durable task; ``name`` is both the queue's task name and the Celery task name.

    ``queue`` is the logical queue: its messages travel on ``<namespace>.<queue>`` (workers consume
    ``<namespace>.crawl`` and ``<namespace>.maintenance`` by default, for each namespace they serve;
    another queue needs ``-Q``). A message runs in the namespace of the queue it came from.
    ``item_key`` names the item field that keys emitted items (default: a content hash). Extra keyword
    arguments go to Celery (e.g. ``soft_time_limit``), except ``acks_late`` and
    ``reject_on_worker_lost`` (:data:`FIXED_OPTIONS`: ConfigurationError). The task is a shared task,
    so any Celery app that imports the module (the ``celery_ha`` app does) can run it.
    """
    fixed = [key for key in FIXED_OPTIONS if key in celery_options]
    if fixed:
        given = ", ".join(f"{key}={celery_options[key]!r}" for key in fixed)
        raise ConfigurationError(
            f"@durable_task({name or '...'}): {given} refused: celery-ha sets "
            + ", ".join(f"{k}={v}" for k, v in FIXED_OPTIONS.items())
            + " on every durable task (a message is acknowledged after its task ran; a task whose "
            "worker died is recovered from Redis, not redelivered by the broker)")

    def decorate(fn: Callable[[DurableContext], Any]) -> Any:
        task_name = name or fn.__name__
        spec = DurableTask(name=task_name, fn=fn, queue=queue, item_key=item_key)
        # throws: a dead letter is an expected outcome, logged in one line without a traceback.
        # The overrides come last: they refuse the Celery way of calling (misuse.py).
        options = {**FIXED_OPTIONS, "ignore_result": True, "throws": (DurableTaskDead,),
                   **celery_options, **TASK_CLASS_OVERRIDES}

        def run(self: Any, *task_ids: Any, **kwargs: Any) -> str:
            # A message of celery-ha carries durable task ids and nothing else. A direct call from
            # user code (``task(url)``: Celery marks its request called_directly) with anything but
            # ids is refused; a worker's message of a URL reaches the runner, which says what it is.
            if kwargs or not task_ids or not all(isinstance(i, str) for i in task_ids) or (
                    self.request.called_directly and not all(map(looks_like_task_id, task_ids))):
                raise not_enqueued(task_name, "a direct call" if self.request.called_directly
                                   else "a message of other arguments")
            # The namespace of the queue the message came from (a worker may serve several).
            with serving(namespace_of_request(self.request)):
                if len(task_ids) == 1:
                    first, chained = run_chain(spec, self, task_ids[0], services().settings.chain_seconds)
                    return chain_summary(report(first), chained)
                return summary(run_batch(spec, self, list(task_ids)), len(task_ids))

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        celery_task = shared_task(name=task_name, bind=True, **options)(run)
        spec.celery_task = celery_task
        REGISTRY[task_name] = spec
        fn.durable = spec  # type: ignore[attr-defined]
        return celery_task

    return decorate
