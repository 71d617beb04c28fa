"""``quick_reconnect`` retries a lost broker sooner, not for a shorter time: Celery's consumer gives up
(and the worker exits) after ``broker_connection_max_retries`` retries, which at the quick intervals
came about 15 times sooner than at Celery's own (100 retries: 3 minutes instead of 46), so a Redis
outage of a few minutes stopped every worker of the fleet for good (seen with a real worker: a
broker down for 4 minutes, ``Unrecoverable error: OperationalError`` after 3 min 16 s).

Celery's real ``Consumer.ensure_connected`` and kombu's real retry loop against a loopback port
where nothing listens, with ``broker_connection_max_retries=2``: the waits Celery announces before it
gives up must add up to at least Celery's own two (2 s + 4 s)."""

from __future__ import annotations

import inspect
import logging
import re

import pytest
from celery import Celery
from kombu import Connection
from kombu.exceptions import OperationalError

from celery_ha.integration.patches.quick_reconnect import QuickReconnectConsumer
from celery_ha.runtime.redis_process import free_port

pytestmark = pytest.mark.slow


def _consumer(app: Celery) -> QuickReconnectConsumer:
    """The patched consumer with only what ``ensure_connected`` reads (a whole one needs a worker)."""
    consumer = QuickReconnectConsumer.__new__(QuickReconnectConsumer)
    consumer.app = app
    consumer.hub = None
    consumer.first_connection_attempt = False
    consumer.broker_connection_retry_attempt = 0
    consumer._quick = True
    return consumer


def test_a_lost_broker_is_retried_as_long_as_celery_would(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("quick_reconnect_endurance", broker=f"redis://127.0.0.1:{free_port()}/0")
    app.conf.broker_connection_max_retries = 2
    app.conf.broker_connection_timeout = 1
    try:
        with caplog.at_level(logging.ERROR, logger="celery.worker.consumer.consumer"), \
                pytest.raises(OperationalError):
            _consumer(app).ensure_connected(app.connection_for_read())
    finally:
        app.close()
    # Each retry Celery announces: "Trying again in 1.20 seconds", or "now" for a wait under a second
    # (counted as 0: the sum is at most what was waited).
    waits = [float(w or 0) for w in re.findall(r"Trying again (?:now|in ([0-9.]+) seconds)", caplog.text)]
    assert waits, caplog.text
    # kombu's defaults, which Celery's consumer leaves: its own two retries wait 2 s, then 4 s.
    defaults = inspect.signature(Connection._ensure_connection).parameters
    start, step = defaults["interval_start"].default, defaults["interval_step"].default
    assert waits[0] < start  # the quick intervals are still the patch's
    celery_own = start + (start + step)
    assert sum(waits) >= celery_own, \
        f"gave up after {sum(waits):.1f}s of waits {waits}; Celery's own two retries wait {celery_own:g}s"
