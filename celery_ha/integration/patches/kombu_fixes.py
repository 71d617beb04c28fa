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
import inspect
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from celery_ha.integration.patches import registry

#: The releases this patch (and ``kombu_client_reuse``, which patches the same class) was verified on.
VERIFIED = "kombu 5.6.0-5.7.0"

CLOSED = ("the broker connection of this channel was closed (the consumer reconnected); its message "
          "comes back after the visibility timeout")


def shape_problem(attribute: str, parameter: str) -> str:
    """'' when kombu's Redis ``Channel.<attribute>`` is still a method taking ``parameter``, else
    what differs (then the patch would wrap something it does not know: it stays off)."""
    method = getattr(kombu_redis.Channel, attribute, None)
    if not callable(method):
        return f"{registry.installed('kombu')} has no kombu.transport.redis.Channel.{attribute}"
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        parameters = {}
    if parameter not in parameters:
        return f"{registry.installed('kombu')}'s Channel.{attribute} takes no {parameter!r}"
    return ""


def patch_channel(name: str, attribute: str, make: Callable[[Any], Any], marker: str,
                  parameter: str, without: str) -> bool:
    """Replace ``kombu.transport.redis.Channel.<attribute>`` by ``make(original)`` once per process
    (the app may be built more than once; the Sentinel channel inherits the patch), when it still
    takes ``parameter``; else leave it and warn once that patch ``name`` is off (``without``: what
    is lost). The replacement keeps the original as ``__wrapped__``, which the tests use to compare
    with and without. Returns whether the patch is on."""
    channel: Any = kombu_redis.Channel
    original = getattr(channel, attribute, None)
    if getattr(original, marker, False):
        registry.applied(name, VERIFIED)
        return True
    problem = shape_problem(attribute, parameter)
    if problem:
        registry.switched_off(name, VERIFIED, f"{problem}: {without}")
        return False
    patched = functools.wraps(original)(make(original))
    setattr(patched, marker, True)
    setattr(channel, attribute, patched)
    registry.applied(name, VERIFIED)
    return True


def install() -> bool:
    """Patch ``Channel._connparams``: a closed connection raises redis' ConnectionError. Returns
    whether the patch is on."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def connparams(self: Any, asynchronous: bool = False) -> Any:
            if getattr(self.connection, "client", None) is None:
                raise redis.ConnectionError(CLOSED)
            return original(self, asynchronous=asynchronous)

        return connparams

    return patch_channel("kombu_fixes", "_connparams", make, "celery_ha_fixed", "asynchronous",
                         "an ack on a channel whose connection was closed can end the worker process")
