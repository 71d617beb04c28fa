"""A fix for kombu's Redis transport: a command on a channel whose broker connection was closed.

When Celery's consumer loses the broker it closes that connection and reconnects. A task that was
finishing at that instant (Celery's cancel of acks-late tasks on connection loss races with it) acks
its message on the old channel, whose pool is gone: kombu rebuilds it from the closed connection's
settings, which are gone too (``Channel.connection.client`` is None), and raises AttributeError. That
is no connection error, so it escapes Celery's "Couldn't ack" handling and the worker process exits
(seen during Sentinel failovers, kombu 5.7). Raised as redis' ConnectionError instead, it is the failed
ack it really is: Celery logs it and goes on, the broker restores the message after its visibility
timeout, and the durable layer drops that message as a duplicate of a task already completed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

CLOSED = ("the broker connection of this channel was closed (the consumer reconnected); its message "
          "comes back after the visibility timeout")


def patch_channel(attribute: str, make: Callable[[Any], Any], marker: str) -> None:
    """Replace ``kombu.transport.redis.Channel.<attribute>`` by ``make(original)`` once per process
    (the app may be built more than once; the Sentinel channel inherits the patch). The replacement
    keeps the original as ``__wrapped__``, which the tests use to compare with and without."""
    channel: Any = kombu_redis.Channel
    original = getattr(channel, attribute)
    if getattr(original, marker, False):
        return
    patched = functools.wraps(original)(make(original))
    setattr(patched, marker, True)
    setattr(channel, attribute, patched)


def install() -> None:
    """Patch ``Channel._connparams``: a closed connection raises redis' ConnectionError."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def connparams(self: Any, asynchronous: bool = False) -> Any:
            if getattr(self.connection, "client", None) is None:
                raise redis.ConnectionError(CLOSED)
            return original(self, asynchronous=asynchronous)

        return connparams

    patch_channel("_connparams", make, "celery_ha_fixed")
