"""Tell a fault of the infrastructure (Redis away, full or failing over) from a fault of the task.

A task that met such a fault did nothing wrong: counting it as a failed attempt would kill healthy
tasks during an outage (a full Redis once sent 109 of 200 tasks to dead in 8 s). The runner hands
such a task back instead, without an attempt or a stall, and retries its own calls with a short
backoff while the lease lives.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.exceptions import BusyLoadingError, OutOfMemoryError, ReadOnlyError

T = TypeVar("T")

#: Substrings of error replies that mean "the server cannot take writes now", whatever their class
#: (inside a script Redis 6.2 wraps them in a plain ResponseError).
_UNAVAILABLE_REPLIES = ("OOM command not allowed", "READONLY", "LOADING", "MASTERDOWN", "NOREPLICAS")


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for connection loss, timeouts, a full Redis, a read-only (demoted) or loading server."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OutOfMemoryError, ReadOnlyError,
                        BusyLoadingError)):
        return True
    return isinstance(exc, redis.ResponseError) and any(s in str(exc) for s in _UNAVAILABLE_REPLIES)


def with_patience(call: Callable[[], T], deadline: float, first_delay: float = 0.05,
                  max_delay: float = 1.0) -> T:
    """``call()``, retried with jittered backoff on infrastructure errors until ``deadline``
    (``time.monotonic()``); the last error is raised then. Other errors are raised at once.

    Only for calls that are safe to repeat: a claim (a repeat of a claim that did run finds the task
    running under this worker and adopts it in a pool process's main thread, else returns None) or
    a release fenced by token and holder.
    """
    delay = first_delay
    while True:
        try:
            return call()
        except redis.RedisError as exc:
            if not is_infrastructure_error(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay * random.uniform(0.5, 1.5))  # backoff between tries of a call, not a wait
        delay = min(max_delay, delay * 2)
