"""One redis-py client per kombu Redis channel for its synchronous commands, instead of one per command.

kombu's Redis transport wraps every command it sends outside the consumer's event loop in a new
``redis.Redis`` object: every publish (a task message, each ``task-*`` event), every ack and every
unacked-bookkeeping pipeline. Building one costs about 0.2 ms of CPU (redis-py fills a table of ~170
response callbacks each time), several times per task in the worker's main process and once per
message sent (twice with ``task-sent`` events): with tasks of a millisecond, that is a good part of
what a worker spends. The client object holds no connection of its own; each command takes one from
the channel's connection pool and gives it back, so one client per channel serves every command and
every thread alike.

The client is kept only while the channel keeps the same pool: when kombu drops the pool (a closed or
lost connection) the next command rebuilds the pool as before (and ``kombu_fixes`` still turns a
closed connection into a connection error there), then a client for the new pool. Verified on the
releases ``kombu_fixes.VERIFIED`` names (the same class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis

from celery_ha.integration.patches import registry
from celery_ha.integration.patches.kombu_fixes import VERIFIED, patch_channel

_CACHE = "_celery_ha_sync_client"
_WITHOUT = "kombu builds a redis-py client per command (slower, nothing else changes)"


def install() -> bool:
    """Patch ``Channel._create_client``: one synchronous client per channel and connection pool.
    Returns whether the patch is on (it needs the channel's ``pool`` too)."""
    if not isinstance(getattr(kombu_redis.Channel, "pool", None), property):
        registry.switched_off("kombu_client_reuse", VERIFIED,
                              f"{registry.installed('kombu')} has no Channel.pool: {_WITHOUT}")
        return False

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def create_client(self: Any, asynchronous: bool = False) -> Any:
            if asynchronous:  # the event loop's own client: kombu keeps it already
                return original(self, asynchronous=True)
            pool = self.pool  # rebuilt here when kombu dropped it
            cached = self.__dict__.get(_CACHE)
            if cached is not None and cached[0] is pool:
                return cached[1]
            client = original(self)
            setattr(self, _CACHE, (pool, client))
            return client

        return create_client

    return patch_channel("kombu_client_reuse", "_create_client", make, "celery_ha_reused", "asynchronous",
                         _WITHOUT)
