"""A worker consumer that reconnects to the broker within a second of it coming back.

Celery's consumer retries a lost broker connection after 2 s, then 4 s, 6 s … (kombu's defaults).
After a Sentinel failover the new master is usually promoted 1–3 s after the old one died, so the
second retry, 6 s after the loss, is where the crawl resumed. Here the retries start at
``RETRY_START`` and never wait longer than ``RETRY_MAX``: the worker is back about as soon as
Sentinel is. Installed by ``celeryconfig.py`` (``worker_consumer``).

Every reconnection after the first also starts a sweep at once (in a thread, so the consumer is not
held up): when the broker came back empty, the sweep notices it and re-sends the dispatched tasks
within a second or two instead of after ``CELERY_HA_REDISPATCH_AFTER`` (see ``broker_epoch``).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from celery.worker.consumer import Consumer

from celery_ha.integration.maintenance import sweep

log = logging.getLogger(__name__)

RETRY_START = 0.2
RETRY_STEP = 0.5
RETRY_MAX = 2.0


class QuickReconnectConsumer(Consumer):
    """Celery's consumer with shorter broker reconnect intervals (everything else unchanged)."""

    def ensure_connected(self, conn: Any) -> Any:
        original = conn.ensure_connection

        @functools.wraps(original)
        def ensure_connection(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("interval_start", RETRY_START)
            kwargs.setdefault("interval_step", RETRY_STEP)
            kwargs.setdefault("interval_max", RETRY_MAX)
            return original(*args, **kwargs)

        conn.ensure_connection = ensure_connection
        connection = super().ensure_connected(conn)
        if getattr(self, "_celery_ha_connected_before", False):
            threading.Thread(target=sweep_after_reconnect, args=(self.app,),
                             name="celery-ha-reconnect-sweep", daemon=True).start()
        self._celery_ha_connected_before = True
        return connection


def sweep_after_reconnect(app: Any) -> None:
    """One sweep right after the broker is back (a sweep already running elsewhere does it)."""
    try:
        result = sweep(app, source="reconnect")
        log.info("sweep after the broker reconnection: %s", result or "another process is sweeping")
    except Exception as exc:  # a thread of its own: log, the next regular sweep runs anyway
        log.warning("sweep after the broker reconnection failed: %s", exc)
