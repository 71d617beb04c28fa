"""A message for a task name this worker does not know: count it as a failed attempt, never loop.

Celery drops such a message ("Received unregistered task"), so without this the durable task (every
id of a batch message) would stay dispatched, be sent again every ``CELERY_HA_REDISPATCH_AFTER``
seconds for ever, and hold a window slot the whole time, starving valid tasks behind it. Here the
worker's main process claims each task and fails it with the reason: the slot is free at once, a
retry waits its backoff (another worker of a rolling upgrade may know the name), and after
``max_attempts`` the task is dead, with the name and the names this worker does know in its error.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.pump import pump_quietly
from celery_ha.integration.task_api.misuse import argument_ids, fail_named

__all__ = ["argument_ids", "on_unknown_task"]

log = logging.getLogger(__name__)


def on_unknown_task(rt: Services, app: Any, name: str, message_id: str,
                    carried: list[str] | None = None) -> list[str]:
    """Fail the durable tasks a message for the unknown task ``name`` carried (``carried``: the ids
    of its arguments, several for a batch; else the id in its Celery task id); returns each one's
    result ('retry' or 'dead'), leaving out ids that are none of ours or not waiting for a claim."""
    ids = carried or [str(message_id).split(".", 1)[0]]
    results = [result for task_id in ids if (result := _fail_one(rt, name, task_id)) is not None]
    if results:
        pump_quietly(app, rt)
    return results


def _fail_one(rt: Services, name: str, durable_id: str) -> str | None:
    known = ", ".join(sorted(REGISTRY)) or "none"
    result = fail_named(rt, name, durable_id, f"unknown task name {name!r}: this worker runs {known}",
                        retry=True)
    if result is not None:
        log.warning("task %s names the unknown task %r: attempt counted (%s)", durable_id, name, result)
    return result
