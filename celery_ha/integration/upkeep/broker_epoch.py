"""Notice a Redis broker that lost its messages (restarted empty, flushed, replaced by a new node).

Every dispatched task has one message in the broker. A broker that comes back empty holds none of
them, and without this check those tasks would wait ``CELERY_HA_REDISPATCH_AFTER`` (60 s by
default) before the pump sends them again. The check is a marker: a key in the broker's database
whose value the state Redis remembers. While the broker keeps its data the marker is there and
matches; when it is gone (or different), every message the broker held is gone with it, and the
caller re-sends every dispatched task at once (the pump skips those whose message is still waiting,
and a duplicate message is dropped by the claim, so a false alarm costs only some messages).

Only Redis brokers are checked: RabbitMQ keeps the durable queues celery-ha declares on disk, and a
broker this module cannot read is simply not checked (the redispatch timeout still covers it).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import redis

from celery_ha.integration.core.services import Services
from celery_ha.integration.dispatch.broker import broker_client
from celery_ha.state.keys import QueueKeys

log = logging.getLogger(__name__)

#: The meta-hash field (state Redis) holding the marker value last seen in the broker.
EPOCH_FIELD = "broker_epoch"


def marker_key(namespace: str) -> str:
    """The marker's key in the broker database (one per namespace: they may share a broker)."""
    return f"celery-ha:broker-epoch:{namespace}"


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def broker_lost_messages(app: Any, rt: Services) -> bool:
    """True when the broker no longer holds the marker the state Redis remembers (it lost what it
    held). Plants the marker when it is missing, so the next call answers False. The first call on a
    namespace (nothing remembered yet) answers False. A broker or state Redis that cannot be read
    answers False: the caller's regular redispatch still covers the tasks."""
    broker = broker_client(app)
    if broker is None:
        return False
    meta = QueueKeys(rt.settings.namespace).meta
    key = marker_key(rt.settings.namespace)
    try:
        expected = _text(rt.client.hget(meta, EPOCH_FIELD))
        current = _text(broker.get(key))
        if current is not None and current == expected:
            return False
        if current is None:
            broker.set(key, secrets.token_hex(8), nx=True)  # nx: two processes agree on one marker
            current = _text(broker.get(key))
        rt.client.hset(meta, EPOCH_FIELD, current or "")
    except redis.RedisError as exc:
        log.debug("broker marker not checked: %s", exc)
        return False
    return expected is not None
