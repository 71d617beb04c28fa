"""A message for a task name this worker does not know: count it as a failed attempt, never loop.

Celery drops such a message ("Received unregistered task"), so without this the durable task would
stay dispatched, be sent again every ``CELERY_HA_REDISPATCH_AFTER`` seconds for ever, and hold a
window slot the whole time, starving valid tasks behind it. Here the worker's main process claims
the task and fails it with the reason: the slot is free at once, a retry waits its backoff (another
worker of a rolling upgrade may know the name), and after ``max_attempts`` the task is dead, with the
name and the names this worker does know in its error.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.pump import pump_quietly

log = logging.getLogger(__name__)


def on_unknown_task(rt: Services, app: Any, name: str, message_id: str) -> str | None:
    """Fail the durable task a message for the unknown task ``name`` carried; returns 'retry',
    'dead', or None when the message was none of ours (or the task is not waiting for a claim)."""
    durable_id = str(message_id).split(".", 1)[0]
    try:
        lease = rt.queue.claim(durable_id, rt.worker_name)
        if lease is None or lease.task.task != name:
            return None
        known = ", ".join(sorted(REGISTRY)) or "none"
        result = rt.queue.fail(lease, f"unknown task name {name!r}: this worker runs {known}", retry=True)
    except redis.RedisError as exc:
        log.warning("could not fail task %s of unknown name %r (it will be sent again): %s",
                    durable_id, name, exc)
        return None
    log.warning("task %s names the unknown task %r: attempt counted (%s)", durable_id, name, result)
    pump_quietly(app, rt)
    return result
