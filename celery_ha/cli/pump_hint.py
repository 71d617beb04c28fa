"""Ask a running worker to pump now, so freshly queued tasks start at once.

Without it, new tasks wait for the next pump: after some task finishes, or beat's sweep (every
``CELERY_HA_RECLAIM_INTERVAL``). The CLI sends one ``celery_ha.maintenance.pump`` message (idempotent,
and without a Celery expiry, which would depend on the clocks of this host and the worker's) — only
when a live worker exists, so an idle broker never piles them up, and only to a broker a live worker
consumes: each worker records where its broker is against the state Redis (the state Redis's own
database, another database of its server, or elsewhere: ``integration/dispatch/script_push.py``,
``broker_place``). A command whose broker is plainly not theirs (the state Redis, where the team's own
Celery app uses another broker and ``CELERY_BROKER_URL`` is not set for the CLI) says so on stderr
instead of sending a message no worker will read.
"""

from __future__ import annotations

import logging
from typing import Any

import click
import redis

from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import MAINTENANCE, broker_queue
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.integration.dispatch.script_push import broker_db, place_words
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.state.keys import QueueKeys
from celery_ha.state.worker_registry import alive_count, node_infos, split_worker

log = logging.getLogger(__name__)

PUMP_TASK = "celery_ha.maintenance.pump"


def kick(obj: Any) -> bool:
    """:func:`kick_pump` for a CLI command's context (``cli/context.py``): its broker is
    ``CELERY_BROKER_URL``, else the state Redis."""
    broker = obj.settings.broker_url or obj.redis_url
    return kick_pump(obj.client, obj.namespace, broker, obj.settings, max_age=obj.settings.lease_ttl,
                     state_url=obj.redis_url)


def _place(broker_url: str, settings: Settings, state_url: str) -> str:
    """Where this command's broker is, in the words of ``broker_place``."""
    if settings.broker_url is None:
        return "state"  # built from the state Redis's own URL (Sentinel included)
    return place_words(*broker_db(broker_url, state_url))


def _worker_places(client: redis.Redis, namespace: str, max_age: float) -> set[str]:
    """Where the brokers of the live workers of ``namespace`` are (those that recorded it)."""
    cutoff = redis_now_ms(client) - int(max_age * 1000)
    members = client.zrangebyscore(QueueKeys(namespace).workers, cutoff, "+inf")
    nodes = sorted({split_worker(m.decode() if isinstance(m, bytes) else m)[0] for m in members})
    return {info["broker"] for info in node_infos(client, namespace, nodes).values()
            if info.get("broker") not in (None, "unknown")}


def kick_pump(client: redis.Redis, namespace: str, broker_url: str, settings: Settings,
              max_age: float = 30.0, state_url: str | None = None) -> bool:
    """Send one pump message if a worker of ``namespace`` is alive and, as far as the workers' records
    tell (``state_url`` given), consumes ``broker_url``; True if sent. Never raises."""
    try:
        if alive_count(client, namespace, max_age=max_age) == 0:
            return False
        places = _worker_places(client, namespace, max_age) if state_url is not None else set()
        if places:
            mine = _place(broker_url, settings, state_url)
            if mine not in places and not (mine == "elsewhere" and "elsewhere" in places):
                click.echo(f"celery-ha: the live workers of namespace {namespace!r} consume another broker "
                           f"than this command's ({mask_url(broker_url)}): no start-now message sent; the "
                           "new tasks start at the next sweep (set CELERY_BROKER_URL to your Celery app's "
                           "broker)", err=True)
                return False
        from celery import Celery

        broker = kombu_broker(broker_url, settings)
        app = Celery("celery_ha_cli", broker=broker.url, set_as_current=False)
        app.conf.update(broker_connection_retry_on_startup=False, broker_connection_timeout=3,
                        task_serializer="json", accept_content=["json"],
                        broker_transport_options=broker.transport_options, broker_use_ssl=broker.use_ssl)
        with app.connection_for_write() as conn:
            queue = broker_queue(namespace, MAINTENANCE)
            app.send_task(PUMP_TASK, queue=queue, routing_key=queue, connection=conn, retry=False)
        return True
    except Exception as exc:  # a hint, not a requirement: the next sweep pumps anyway
        log.debug("pump kick failed: %s", exc)
        return False
