"""``@durable_task``: declare a task whose runs are claimed, fenced and completed in Redis.

A Celery message carries only the durable task id; the Celery task made here runs it through
:func:`celery_ha.integration.running.runner.run_message`. Example::

    @durable_task(name="fetch_page", item_key="url")
    def fetch_page(ctx):
        page = ctx.fetch(ctx.url)
        ctx.emit({"url": ctx.url, "size": len(page.content)})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import shared_task

from celery_ha.integration.core.queues import CRAWL
from celery_ha.integration.core.services import namespace_of_request, serving
from celery_ha.integration.core.task_spec import REGISTRY, DurableTask
from celery_ha.integration.running.batch import run_batch, summary
from celery_ha.integration.running.celery_outcome import DurableTaskDead, report
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.running.runner import run_message


def durable_task(name: str | None = None, *, queue: str = CRAWL, item_key: str | None = None,
                 **celery_options: Any) -> Callable[[Callable[[DurableContext], Any]], Any]:
    """Declare a durable task; ``name`` is both the queue's task name and the Celery task name.

    ``queue`` is the logical queue: its messages travel on ``<namespace>.<queue>`` (workers consume
    ``<namespace>.crawl`` and ``<namespace>.maintenance`` by default, for each namespace they serve;
    another queue needs ``-Q``). A message runs in the namespace of the queue it came from.
    ``item_key`` names the item field that keys emitted items (default: a content hash). Extra keyword
    arguments go to Celery (e.g. ``soft_time_limit``). The task is a shared task, so any Celery app
    that imports the module (the ``celery_ha`` app does) can run it.
    """

    def decorate(fn: Callable[[DurableContext], Any]) -> Any:
        task_name = name or fn.__name__
        spec = DurableTask(name=task_name, fn=fn, queue=queue, item_key=item_key)
        # throws: a dead letter is an expected outcome, logged in one line without a traceback.
        options = {"acks_late": True, "ignore_result": True, "reject_on_worker_lost": False,
                   "throws": (DurableTaskDead,), **celery_options}

        def run(self: Any, task_id: str, *more_ids: str) -> str:
            # The namespace of the queue the message came from (a worker may serve several).
            with serving(namespace_of_request(self.request)):
                if not more_ids:
                    return report(run_message(spec, self, task_id))
                ids = [task_id, *more_ids]
                return summary(run_batch(spec, self, ids), len(ids))

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        celery_task = shared_task(name=task_name, bind=True, **options)(run)
        spec.celery_task = celery_task
        REGISTRY[task_name] = spec
        fn.durable = spec  # type: ignore[attr-defined]
        return celery_task

    return decorate
