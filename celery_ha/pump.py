"""The pump: keep at most ``window`` task messages in the broker, the backlog stays in Redis.

``q.dispatch`` moves up to ``window - dispatched`` tasks ready -> dispatched in one Lua step (and
promotes due retries, and hands back dispatched tasks nobody claimed within ``redispatch_after``);
the pump then sends exactly one Celery message per returned id. Messages carry only the task id.

Called after every task completion or failure, by the failover handler, by beat's sweep and by the
worker watchdog. It is safe to call from many processes at once: dispatch is atomic, and a
duplicate message is dropped by the claim.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Iterable
from typing import Any

import redis

from .connection import mask_url, redis_client
from .queue import Dispatched, TaskQueue
from .settings import Settings
from .workers import alive_count

log = logging.getLogger(__name__)

DEFAULT_PRIORITY_STEPS = (0, 3, 6, 9)
DEFAULT_SEP = "\x06\x16"

_broker_clients: dict[tuple[int, str], redis.Redis] = {}


def celery_priority(priority: int) -> int:
    """Map a queue priority (-1000..1000, higher runs first) to a Redis-broker priority (0..9,
    0 runs first). Queue priority 0 maps to 3; 3 and above to 0; -6 and below to 9."""
    return max(0, min(9, 3 - int(priority)))


def effective_window(q: TaskQueue, settings: Settings) -> int:
    """``CELERY_HA_WINDOW``, else 2 x the concurrency of the live workers (at least 2)."""
    if settings.window > 0:
        return settings.window
    alive = alive_count(q.client, q.namespace, max_age=max(settings.lease_ttl,
                                                            3 * settings.heartbeat_interval))
    return max(2, 2 * alive)


def message_id(task_id: str) -> str:
    """Celery message id: the durable task id plus a nonce (Flower shows which task it carries)."""
    return f"{task_id}.{secrets.token_hex(4)}"


def broker_lists(queue: str, transport_options: dict[str, Any] | None = None) -> list[str]:
    """The Redis lists kombu uses for ``queue`` (one per priority step)."""
    opts = transport_options or {}
    steps = opts.get("priority_steps", DEFAULT_PRIORITY_STEPS)
    sep = opts.get("sep", DEFAULT_SEP)
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in steps]


def broker_backlog(client: redis.Redis, queue: str, transport_options: dict[str, Any] | None = None
                   ) -> int:
    """How many messages wait in the broker for ``queue`` (sum over priority lists)."""
    pipe = client.pipeline(transaction=False)
    for name in broker_lists(queue, transport_options):
        pipe.llen(name)
    return sum(pipe.execute())


def _broker_client(app: Any) -> redis.Redis | None:
    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    key = (os.getpid(), url)
    client = _broker_clients.get(key)
    if client is None:
        client = _broker_clients[key] = redis_client(url)
    return client


def _queue_of(app: Any, name: str) -> str:
    task = app.tasks.get(name) if getattr(app, "finalized", False) else None
    return getattr(task, "queue", None) or app.conf.task_default_queue or "celery"


def _waiting_ids(app: Any, queues: Iterable[str]) -> set[str] | None:
    """Task ids whose message still sits in the broker lists, or None when unknowable.

    The lists are bounded by the window, so reading them is cheap; it keeps a slow backlog (all
    workers busy with long tasks) from being re-sent every ``redispatch_after`` seconds.
    """
    client = _broker_client(app)
    if client is None:
        return None
    opts = dict(app.conf.broker_transport_options or {})
    out: set[str] = set()
    try:
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            for name in broker_lists(queue, opts):
                pipe.lrange(name, 0, 100_000)
        for raws in pipe.execute():
            for raw in raws:
                try:
                    mid = json.loads(raw)["headers"]["id"]
                except (ValueError, KeyError, TypeError):
                    continue
                out.add(str(mid).split(".", 1)[0])
    except redis.RedisError as exc:
        log.warning("cannot inspect broker %s: %s", mask_url(str(app.conf.broker_url)), exc)
        return None
    return out


def send(app: Any, batch: list[Dispatched]) -> int:
    """Send one Celery message per dispatched task. A re-sent task whose first message is still
    waiting in the broker is skipped; only then are the broker lists read (fresh tasks have none)."""
    resent = {d.task for d in batch if d.resent}
    waiting = (_waiting_ids(app, {_queue_of(app, name) for name in resent}) or set()) if resent else set()
    sent = 0
    for d in batch:
        if d.resent and d.task_id in waiting:
            continue
        app.send_task(d.task, args=[d.task_id], queue=_queue_of(app, d.task),
                      priority=celery_priority(d.priority), task_id=message_id(d.task_id))
        sent += 1
    return sent


def pump(q: TaskQueue, app: Any, settings: Settings, window: int | None = None) -> int:
    """Dispatch up to the window and send the messages; returns how many were sent."""
    size = window if window is not None else effective_window(q, settings)
    batch = q.dispatch(size, redispatch_after=settings.redispatch_after)
    sent = send(app, batch)
    if batch:
        log.debug("pump: window %d, dispatched %d, sent %d", size, len(batch), sent)
    return sent


def pump_here(window: int | None = None) -> int:
    """Pump with this process's runtime and the celery-ha app (workers, beat, CLI)."""
    from .celery_app import app
    from .runtime import runtime

    rt = runtime()
    return pump(rt.queue, app, rt.settings, window)
