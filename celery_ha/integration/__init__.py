"""The Celery integration: durable tasks, their runner, the lease keeper, the pump, failover and
shutdown hooks, maintenance jobs and per-namespace broker queues.

Sub-packages by job, each importing only from those below it (import-linter's contract in
pyproject.toml): ``worker`` (the worker's main process) > ``task_api`` (``@durable_task``) >
``running`` (one message in a pool process) > ``upkeep`` (sweep, watchdog, broker epoch) >
``dispatch`` (pump, sender, publisher, script push, broker) > ``core`` (services, task spec,
errors, queue names, tracing) > ``patches`` (other libraries' internals).

Nothing here builds or imports the Celery app: every hook and job is handed the app (see
``celery_ha.celery_app``, the composition root). Task modules import :func:`durable_task` from here.
"""

from celery_ha.integration.core.task_errors import (
           FetchError,
           GracefulStop,
           PermanentError,
           PermanentFetchError,
)
from celery_ha.integration.core.task_spec import DurableTask, is_durable
from celery_ha.integration.running.context import DurableContext
from celery_ha.integration.task_api.decorator import durable_task

__all__ = ["DurableContext", "DurableTask", "FetchError", "GracefulStop", "PermanentError",
           "PermanentFetchError", "durable_task", "is_durable"]
