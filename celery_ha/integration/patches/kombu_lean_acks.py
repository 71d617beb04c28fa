"""No copy of a durable task's message in kombu's ``unacked`` hash: its ack emulation is the durable
layer's already.

kombu's Redis transport emulates acknowledgements: every message it delivers is copied into the
broker's ``unacked`` hash and its ``unacked_index`` sorted set (``MULTI``/``ZADD``/``HSET``/``EXEC``),
and removed at the ack (``MULTI``/``ZREM``/``HDEL``/``EXEC``), so that a consumer that dies leaves the
message to be restored after the visibility timeout. A durable task's message needs none of it: the
task's state is in the durable layer, which sends a dispatched task that nobody claimed within
``CELERY_HA_REDISPATCH_AFTER`` again (sooner than the visibility timeout, which must exceed the task
time limit), and whose claim drops a second message for a task already claimed or finished. The copy
cost the broker two round trips and eight commands per task, the whole message written once more.

With the patch, a message whose ``task`` header names a durable task (the predicate ``install`` is
given: the registry of ``@durable_task``) is held in the consumer's memory only, as kombu's
transports without ack emulation hold every message: prefetch counting as before; a requeue
(``reject(requeue=True)``) and the restore of unacknowledged messages when the channel closes (a
warm shutdown, a lost connection) push it back onto its list from memory. What changes: a worker
killed with such messages reserved (at most its prefetch, one per pool process) loses them, and the
durable layer sends those tasks again after ``CELERY_HA_REDISPATCH_AFTER``, as it already did for
any message kombu had not restored by then. Every other message (the user's own Celery tasks,
celery-ha's maintenance jobs) keeps kombu's emulation.

Patches ``kombu.transport.redis.QoS``: ``append``, ``ack``, ``reject`` and ``restore_by_tag``;
verified on the releases ``kombu_fixes.VERIFIED`` names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from celery_ha.integration.patches import registry
from celery_ha.integration.patches.kombu_fixes import VERIFIED

NAME = "kombu_lean_acks"
_MARK = "celery_ha_lean"
_LEAN = "_celery_ha_lean_tags"  # per QoS: the delivery tags of messages held in memory only
_WITHOUT = ("every durable task's message is also copied into kombu's unacked hash (two more round "
            "trips per task; nothing else changes)")
#: method -> the parameters it must still take for the patch to know what it wraps.
_SHAPE = {"append": ("message", "delivery_tag"), "ack": ("delivery_tag",),
          "reject": ("delivery_tag", "requeue"), "restore_by_tag": ("tag", "client", "leftmost")}


def _no_durable_tasks(name: object) -> bool:
    """Before ``install``: no message is a durable task's."""
    return False


#: Whether a task name is a durable task's (set by ``install``: the registry lives a layer above).
_durable: Callable[[object], bool] = _no_durable_tasks


def is_lean(message: Any) -> bool:
    """Whether ``message`` carries a durable task (its ``task`` header)."""
    headers = getattr(message, "headers", None)
    return isinstance(headers, dict) and _durable(headers.get("task"))


def _lean_tags(qos: Any) -> set[Any]:
    tags = qos.__dict__.get(_LEAN)
    if tags is None:
        tags = qos.__dict__[_LEAN] = set()
    return tags


def _shape_problem() -> str:
    """'' when kombu's Redis QoS still has the methods and parameters the patch wraps, and the channel
    still restores a message with ``_do_restore_message``; else what differs."""
    qos = getattr(kombu_redis, "QoS", None)
    if qos is None or not issubclass(qos, virtual.QoS):
        return f"{registry.installed('kombu')} has no kombu.transport.redis.QoS"
    for method, wanted in _SHAPE.items():
        try:
            parameters = inspect.signature(getattr(qos, method)).parameters
        except (AttributeError, TypeError, ValueError):
            return f"{registry.installed('kombu')}'s redis QoS has no {method}()"
        if tuple(parameters)[1:1 + len(wanted)] != wanted:
            return f"{registry.installed('kombu')}'s redis QoS.{method} takes {tuple(parameters)[1:]}"
    if not callable(getattr(kombu_redis.Channel, "_do_restore_message", None)):
        return f"{registry.installed('kombu')}'s redis Channel has no _do_restore_message"
    return ""


def _push_back(qos: Any, tag: Any, client: Any, leftmost: bool) -> None:
    """Put a lean message back onto its list from memory (kombu's restore reads the unacked hash)."""
    message = qos._delivered.get(tag)
    if message is None:  # acked meanwhile (kombu marks acks from other threads as dirty first)
        return
    info = message.delivery_info
    with qos.channel.conn_or_acquire(client) as conn:
        pipe = conn.pipeline()
        qos.channel._do_restore_message(message._raw, info["exchange"], info["routing_key"], pipe, leftmost)
        pipe.execute()


def install(durable: Callable[[object], bool]) -> bool:
    """Patch kombu's Redis QoS (see the module docstring); ``durable(task_name)`` tells a durable
    task's message. Returns whether the patch is on."""
    global _durable
    _durable = durable
    qos: Any = kombu_redis.QoS
    if getattr(qos.append, _MARK, False):
        registry.applied(NAME, VERIFIED)
        return True
    problem = _shape_problem()
    if problem:
        registry.switched_off(NAME, VERIFIED, f"{problem}: {_WITHOUT}")
        return False
    originals = {method: getattr(qos, method) for method in _SHAPE}

    def append(self: Any, message: Any, delivery_tag: Any) -> None:
        if not is_lean(message):
            return originals["append"](self, message, delivery_tag)
        _lean_tags(self).add(delivery_tag)
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self: Any, delivery_tag: Any) -> None:
        tags = _lean_tags(self)
        if delivery_tag not in tags:
            return originals["ack"](self, delivery_tag)
        tags.discard(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def reject(self: Any, delivery_tag: Any, requeue: bool = False) -> None:
        tags = _lean_tags(self)
        if delivery_tag not in tags:
            return originals["reject"](self, delivery_tag, requeue)
        if requeue:
            _push_back(self, delivery_tag, None, leftmost=True)
        tags.discard(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)

    def restore_by_tag(self: Any, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        tags = _lean_tags(self)
        if tag not in tags:
            return originals["restore_by_tag"](self, tag, client, leftmost)
        _push_back(self, tag, client, leftmost)
        tags.discard(tag)

    replacements: dict[str, Callable[..., Any]] = {"append": append, "ack": ack, "reject": reject,
                                                   "restore_by_tag": restore_by_tag}
    for method, replacement in replacements.items():
        replacement.__wrapped__ = originals[method]  # type: ignore[attr-defined]
        replacement.__name__ = method
        setattr(replacement, _MARK, True)
        setattr(qos, method, replacement)
    registry.applied(NAME, VERIFIED)
    return True
