"""Which pool process a hard time limit is killing: read from Celery's call stack.

Celery's ``task_failure`` signal names neither the request nor its pool process, but on a hard time
limit it is sent from inside the request's own ``Request.on_timeout`` (an internal of
``celery.worker.request``), whose ``worker_pid`` is the process that ran the message and is about to
be killed. Fast failover (``integration/worker/failover.py``) releases only that process's leases:
another id of a batch may be running in a sibling process by then (a message of it re-sent while it
waited), alive and holding its own lease.

When the request is not on the stack any more (a Celery that sends the signal from elsewhere), the
answer is None and one WARNING per process says so: no lease is released at a time limit then, and
the killed process's leases expire as any dead holder's do.
"""

from __future__ import annotations

import sys
from types import FrameType

from celery.worker.request import Request

from celery_ha.integration.patches import registry

#: The releases this reading was verified on.
VERIFIED = "celery 5.6.3-5.7.0"


def timed_out_child() -> int | None:
    """The pid of the pool process a hard time limit is about to kill, or None if it is unknown."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        request = frame.f_locals.get("self")
        if isinstance(request, Request) and isinstance(request.worker_pid, int):
            registry.applied("timeout_pid", VERIFIED)
            return request.worker_pid
        frame = frame.f_back
    registry.switched_off(
        "timeout_pid", VERIFIED,
        f"{registry.installed('celery')}: task_failure on a hard time limit no longer comes from "
        "Request.on_timeout: no lease is released at a time limit, the killed process's leases expire")
    return None
