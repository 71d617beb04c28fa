"""A worker consumer that reconnects to the broker within a second of it coming back.

Celery's consumer retries a lost broker connection after 2 s, then 4 s, 6 s … (kombu's defaults).
After a Sentinel failover the new master is usually promoted 1–3 s after the old one died, so the
second retry, 6 s after the loss, is where the crawl resumed. Here the retries start at
``RETRY_START`` and never wait longer than ``RETRY_MAX``: the worker is back about as soon as
Sentinel is. Installed by ``celeryconfig.py`` (``worker_consumer``).

It overrides ``Consumer.ensure_connected`` (a Celery internal: where the consumer connects and
reconnects) and passes kombu's ``ensure_connection`` the retry intervals Celery leaves unset. When
either has changed shape, the consumer is Celery's own, unchanged, and one WARNING says so.

Celery gives up after ``broker_connection_max_retries`` retries (default 100) and the worker exits.
At Celery's intervals 100 retries last about 46 minutes; at the quick ones they would last about 3,
so a longer Redis outage would leave no worker to resume the crawl. The retry count is therefore
raised to as many quick retries as wait as long in all (:func:`quick_retries`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from celery.worker.consumer import Consumer
from kombu import Connection

from celery_ha.integration.patches import registry

#: The releases this patch was verified on.
VERIFIED = "celery 5.6.3-5.7.0, kombu 5.6.0-5.7.0"

RETRY_START = 0.2
RETRY_STEP = 0.5
RETRY_MAX = 2.0
_INTERVALS = ("interval_start", "interval_step", "interval_max")
#: kombu's reconnect intervals (start, step, most), which Celery's consumer leaves at their defaults.
CELERY_INTERVALS = (2.0, 2.0, 30.0)


def _interval(retry: int, start: float, step: float, most: float) -> float:
    """Seconds kombu waits before reconnect ``retry`` (0-based): start, start + step, … at most ``most``."""
    return min(start + retry * step, most)


def quick_retries(max_retries: int | None) -> int | None:
    """How many retries at the quick intervals wait, in all, as long as ``max_retries`` at Celery's own:
    the worker gives up on a lost broker no sooner than Celery would. None or 0 (for ever) stays."""
    if not max_retries:
        return max_retries
    budget = sum(_interval(i, *CELERY_INTERVALS) for i in range(max_retries))
    retries, waited = 0, 0.0
    while waited < budget:
        waited += _interval(retries, RETRY_START, RETRY_STEP, RETRY_MAX)
        retries += 1
    return max(retries, max_retries)


def shape_problem() -> str:
    """'' when Celery's consumer still connects through ``ensure_connected`` and kombu's
    ``Connection._ensure_connection`` (what ``ensure_connection`` calls) takes the retry intervals."""
    if not callable(getattr(Consumer, "ensure_connected", None)):
        return f"{registry.installed('celery')}'s worker Consumer has no ensure_connected"
    target = getattr(Connection, "_ensure_connection", None) or Connection.ensure_connection
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        parameters = {}
    missing = [name for name in _INTERVALS if name not in parameters]
    if missing:
        return f"{registry.installed('kombu')}'s Connection.ensure_connection takes no {', '.join(missing)}"
    return ""


class QuickReconnectConsumer(Consumer):
    """Celery's consumer with shorter broker reconnect intervals (everything else unchanged)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        problem = shape_problem()  # decided once per worker, as it starts
        self._quick = not problem
        if problem:
            registry.switched_off("quick_reconnect", VERIFIED,
                                  f"{problem}: a lost broker is retried after 2 s, 4 s, 6 s ... (Celery's)")
        else:
            registry.applied("quick_reconnect", VERIFIED)

    def ensure_connected(self, conn: Any) -> Any:
        if not getattr(self, "_quick", False):
            return super().ensure_connected(conn)
        original = conn.ensure_connection

        @functools.wraps(original)
        def ensure_connection(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("interval_start", RETRY_START)
            kwargs.setdefault("interval_step", RETRY_STEP)
            kwargs.setdefault("interval_max", RETRY_MAX)
            if len(args) > 1:  # Celery passes (errback, broker_connection_max_retries)
                args = (args[0], quick_retries(args[1]), *args[2:])
            elif "max_retries" in kwargs:
                kwargs["max_retries"] = quick_retries(kwargs["max_retries"])
            return original(*args, **kwargs)

        conn.ensure_connection = ensure_connection
        return super().ensure_connected(conn)
