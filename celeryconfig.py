"""Celery settings for celery-ha (loaded by ``celery_ha.celery_app``, the composition root).

Everything comes from ``celery_ha.base.settings.Settings.from_env()`` (CELERY_HA_* variables, documented
defaults, validated once) plus ``CELERY_BROKER_URL``. Bad values stop the worker at start-up with
one clear line. Only JSON crosses the broker: messages carry a task id and nothing else.
"""

from __future__ import annotations

from kombu import Queue

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.integration.broker import kombu_broker
from celery_ha.integration.queues import CRAWL, MAINTENANCE, broker_queue
from celery_ha.runtime.resolve import resolve_redis_url

_settings = Settings.from_env()

#: Seconds the broker's visibility timeout must exceed the hard task time limit by.
VISIBILITY_MARGIN = 60.0

if _settings.visibility_timeout <= _settings.task_time_limit + VISIBILITY_MARGIN:
    raise ConfigurationError(
        f"CELERY_HA_VISIBILITY_TIMEOUT ({_settings.visibility_timeout:g}s) must exceed "
        f"CELERY_HA_TASK_TIME_LIMIT ({_settings.task_time_limit:g}s) + {VISIBILITY_MARGIN:g}s, or the "
        "Redis broker redelivers messages of tasks that are still running"
    )

# --- broker: the state-layer Redis unless CELERY_BROKER_URL says otherwise
_broker = kombu_broker(_settings.broker_url or resolve_redis_url(_settings), _settings)
# Celery prefers the raw CELERY_BROKER_URL variable over ``broker_url``; the read and write URLs are
# what workers, beat and producers connect with, and they take the normalized form.
broker_url = broker_read_url = broker_write_url = _broker.url
broker_connection_retry_on_startup = True
broker_transport_options: dict[str, object] = {"visibility_timeout": _settings.visibility_timeout,
                                               **_broker.transport_options}
if _broker.use_ssl is not None:
    broker_use_ssl = _broker.use_ssl
result_backend = None
task_ignore_result = True

# --- JSON only (no pickle anywhere)
accept_content = ["json"]
task_serializer = "json"
result_serializer = "json"
event_serializer = "json"
result_accept_content = ["json"]

# --- at-least-once delivery; the durable layer makes duplicates harmless
task_acks_late = True
task_acks_on_failure_or_timeout = True
task_reject_on_worker_lost = False  # a dead child is handled by fast failover in Redis instead
worker_prefetch_multiplier = 1
worker_cancel_long_running_tasks_on_connection_loss = True
task_time_limit = _settings.task_time_limit
task_soft_time_limit = max(1.0, _settings.task_time_limit - min(30.0, _settings.task_time_limit / 10))
worker_soft_shutdown_timeout = _settings.soft_shutdown_timeout
# A lost broker connection is retried within a second, not after 2 s + 4 s (Sentinel failover).
worker_consumer = "celery_ha.integration.quick_reconnect:QuickReconnectConsumer"

# --- Flower / monitoring: workers send task events (received, started, succeeded, ...). No task-sent
# events: the broker holds at most the window's messages (the backlog and its states are in Redis:
# `celery-ha stats`, the dashboard), and each refill message would cost its publisher a second
# publish, about a third of the message's own CPU.
worker_send_task_events = True
task_send_sent_event = False

# --- queues: crawl work and maintenance apart, so a backlog never delays a sweep; both named for the
# namespace, so two namespaces sharing one broker database never take each other's messages
_crawl_queue = broker_queue(_settings.namespace, CRAWL)
_maintenance_queue = broker_queue(_settings.namespace, MAINTENANCE)
task_default_queue = _crawl_queue
task_queues = (Queue(_crawl_queue, routing_key=_crawl_queue),
               Queue(_maintenance_queue, routing_key=_maintenance_queue))
task_routes = {"celery_ha.maintenance.*": {"queue": _maintenance_queue, "routing_key": _maintenance_queue}}

# --- task modules
imports = ["tasks.fetch", "tasks.crawl", "tasks.maintenance",
           *[m.strip() for m in _settings.extra_imports.split(",") if m.strip()]]

# --- beat: maintenance (each job takes a short Redis lock, so two beats are harmless). No `expires`:
# Celery would judge it by the clocks of beat and of the worker; a stale sweep skips itself instead.
beat_schedule = {
    "celery-ha-sweep": {
        "task": "celery_ha.maintenance.sweep",
        "schedule": _settings.reclaim_interval,
        "options": {"queue": _maintenance_queue},
    },
    "celery-ha-dead-letters": {
        "task": "celery_ha.maintenance.dead_letters",
        "schedule": 300.0,
        "options": {"queue": _maintenance_queue},
    },
    "celery-ha-proxy-health": {
        "task": "celery_ha.maintenance.proxy_health",
        "schedule": 60.0,
        "options": {"queue": _maintenance_queue},
    },
}
