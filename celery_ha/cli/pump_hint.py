"""Ask a running worker to pump now, so freshly queued tasks start at once.

Without it, new tasks wait for the next pump: after some task finishes, or beat's sweep (every
``CELERY_HA_RECLAIM_INTERVAL``). The CLI sends one ``celery_ha.maintenance.pump`` message (idempotent,
and without a Celery expiry, which would depend on the clocks of this host and the worker's) — only
when a live worker exists, so an idle broker never piles them up.
"""

from __future__ import annotations

import logging

import redis

from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import MAINTENANCE, broker_queue
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.state.worker_registry import alive_count

log = logging.getLogger(__name__)

PUMP_TASK = "celery_ha.maintenance.pump"


def kick_pump(client: redis.Redis, namespace: str, broker_url: str, settings: Settings,
              max_age: float = 30.0) -> bool:
    """Send one pump message if a worker of ``namespace`` is alive; True if sent. Never raises."""
    try:
        if alive_count(client, namespace, max_age=max_age) == 0:
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
