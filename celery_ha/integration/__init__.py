"""The Celery integration: durable tasks, their runner, the lease keeper, the pump, failover and
shutdown hooks, maintenance jobs and per-namespace broker queues.

Nothing here builds or imports the Celery app: every hook and job is handed the app (see
``celery_ha.celery_app``, the composition root). Task modules import :func:`durable_task` from here.
"""

from celery_ha.integration.context import DurableContext
from celery_ha.integration.decorator import durable_task
from celery_ha.integration.task_errors import FetchError, GracefulStop, PermanentError, PermanentFetchError
from celery_ha.integration.task_spec import DurableTask, is_durable

__all__ = ["DurableContext", "DurableTask", "FetchError", "GracefulStop", "PermanentError",
           "PermanentFetchError", "durable_task", "is_durable"]
