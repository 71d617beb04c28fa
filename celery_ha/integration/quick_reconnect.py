"""A worker consumer that reconnects to the broker within a second of it coming back.

Celery's consumer retries a lost broker connection after 2 s, then 4 s, 6 s … (kombu's defaults).
After a Sentinel failover the new master is usually promoted 1–3 s after the old one died, so the
second retry, 6 s after the loss, is where the crawl resumed. Here the retries start at
``RETRY_START`` and never wait longer than ``RETRY_MAX``: the worker is back about as soon as
Sentinel is. Installed by ``celeryconfig.py`` (``worker_consumer``).
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer

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
        return super().ensure_connected(conn)
