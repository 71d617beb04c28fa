"""The Celery settings celery-ha needs, built from its validated :class:`Settings`.

:func:`celery_settings` splits them by how :func:`celery_ha.celery_app.attach.init_app` treats an app
that already has a configuration of its own:

- ``required``: what the guarantees rest on (acks after the run, prefetch 1, JSON only, a visibility
  timeout longer than the time limit, no requeue of a dead child's message). An explicit user value
  that differs is refused at start-up, with one line naming it.
- ``defaults``: sensible values celery-ha applies unless the user set the key (time limits, events,
  the broker when the app has none, the quick reconnect consumer).
- ``queues``, ``routes``, ``beat_schedule``, ``imports``: added to the user's own.

The ready-made ``celery_ha.app`` gets all of them, with the namespace's crawl queue as its default.
Only JSON crosses the broker: messages carry a task id and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kombu import Queue

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import CRAWL, MAINTENANCE, broker_queue
from celery_ha.integration.core.task_spec import is_durable

#: Seconds the broker's visibility timeout must exceed the hard task time limit by.
VISIBILITY_MARGIN = 60.0

#: The shipped task modules every app celery-ha is attached to imports (by full name: a user's own
#: ``tasks`` or ``celeryconfig`` module can never shadow them).
SHIPPED_TASKS = ("celery_ha.tasks.fetch", "celery_ha.tasks.crawl", "celery_ha.tasks.sitemap",
                 "celery_ha.tasks.maintenance")

#: The only content type celery-ha's messages may use.
JSON = "json"


def _is_json(value: Any) -> bool:
    return str(value).lower() == JSON


def _json_only(value: Any) -> bool:
    return bool(value) and all(str(v).lower() in (JSON, "application/json") for v in value)


@dataclass(frozen=True)
class Requirement:
    """One setting the guarantees rest on: the value celery-ha sets, and which user values are fine."""

    value: Any
    accepts: Callable[[Any], bool]
    why: str


@dataclass(frozen=True)
class CelerySettings:
    """celery-ha's part of one Celery app's configuration (see the module docstring)."""

    required: dict[str, Requirement]
    defaults: dict[str, Any]
    queues: tuple[Queue, ...]
    routes: dict[str, dict[str, str]]
    beat_schedule: dict[str, dict[str, Any]]
    imports: tuple[str, ...]
    crawl_queue: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    #: ``task_time_limit`` and ``task_soft_time_limit`` of the durable tasks: app-wide on the ready-made
    #: app, through :class:`DurableTimeLimits` on a user's app (whose other tasks keep their own).
    time_limits: dict[str, float] = field(default_factory=dict)


def check_visibility(settings: Settings) -> None:
    """The broker must not redeliver the message of a task that is still running."""
    if settings.visibility_timeout <= settings.task_time_limit + VISIBILITY_MARGIN:
        raise ConfigurationError(
            f"CELERY_HA_VISIBILITY_TIMEOUT ({settings.visibility_timeout:g}s) must exceed "
            f"CELERY_HA_TASK_TIME_LIMIT ({settings.task_time_limit:g}s) + {VISIBILITY_MARGIN:g}s, or the "
            "Redis broker redelivers messages of tasks that are still running"
        )


def celery_settings(settings: Settings) -> CelerySettings:
    """celery-ha's Celery settings for ``settings`` (the broker is ``attach``'s business)."""
    check_visibility(settings)
    crawl = broker_queue(settings.namespace, CRAWL)
    maintenance = broker_queue(settings.namespace, MAINTENANCE)
    required = {
        # at-least-once delivery; the durable layer makes duplicates harmless
        "task_acks_late": Requirement(True, lambda v: v is True,
                                      "a message is acknowledged only after its task ran"),
        "worker_prefetch_multiplier": Requirement(1, lambda v: v == 1,
                                                  "a worker reserves no message it cannot run now"),
        "task_reject_on_worker_lost": Requirement(False, lambda v: not v,
                                                  "a dead child's task is released by fast failover"),
        # JSON only (no pickle anywhere)
        "accept_content": Requirement([JSON], _json_only, "only JSON crosses the broker"),
        "task_serializer": Requirement(JSON, _is_json, "only JSON crosses the broker"),
        "event_serializer": Requirement(JSON, _is_json, "only JSON crosses the broker"),
    }
    defaults: dict[str, Any] = {
        "result_serializer": JSON,
        "result_accept_content": [JSON],
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_soft_shutdown_timeout": settings.soft_shutdown_timeout,
        # A lost broker connection is retried within a second, not after 2 s + 4 s (Sentinel failover).
        "worker_consumer": "celery_ha.integration.patches.quick_reconnect:QuickReconnectConsumer",
        "broker_connection_retry_on_startup": True,
        # Flower / monitoring: workers send task events. No task-sent events: the broker holds at
        # most the window's messages (the backlog is in Redis), and each refill message would cost
        # its publisher a second publish, about a third of the message's own CPU.
        "worker_send_task_events": True,
        "task_send_sent_event": False,
    }
    transport_options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout}
    # Crawl work and maintenance apart, so a backlog never delays a sweep; both named for the
    # namespace, so two namespaces sharing one broker database never take each other's messages.
    # A worker of several namespaces (CELERY_HA_NAMESPACES) consumes the queues of each, and its beat
    # schedules each one's maintenance on that namespace's queue (the job tells its namespace by it).
    queues: tuple[Queue, ...] = ()
    beat: dict[str, dict[str, Any]] = {}
    for ns in settings.served_namespaces:
        crawl_ns, maintenance_ns = broker_queue(ns, CRAWL), broker_queue(ns, MAINTENANCE)
        queues += (Queue(crawl_ns, routing_key=crawl_ns), Queue(maintenance_ns, routing_key=maintenance_ns))
        beat.update(_beat_entries(settings, maintenance_ns, "" if ns == settings.namespace else f"@{ns}"))
    for pattern in settings.namespace_patterns:  # the matches change while beat runs: a worker fans out
        beat.update(_fan_out_entries(_beat_entries(settings, maintenance, f"@{pattern}")))
    routes = {"celery_ha.maintenance.*": {"queue": maintenance, "routing_key": maintenance}}
    extra = tuple(m.strip() for m in settings.extra_imports.split(",") if m.strip())
    limits = {"task_time_limit": settings.task_time_limit,
              "task_soft_time_limit": settings.task_soft_time_limit}
    return CelerySettings(required=required, defaults=defaults, queues=queues, routes=routes,
                          beat_schedule=beat, imports=(*SHIPPED_TASKS, *extra), crawl_queue=crawl,
                          transport_options=transport_options, time_limits=limits)


def _beat_entries(settings: Settings, queue: str, suffix: str) -> dict[str, dict[str, Any]]:
    """One namespace's maintenance jobs, sent to its maintenance ``queue``. Each takes a short Redis
    lock, so two beats are harmless. No ``expires``: Celery would judge it by the clocks of beat and
    of the worker; a stale sweep skips itself instead."""
    options = {"queue": queue, "routing_key": queue}
    return {
        f"celery-ha-sweep{suffix}": {"task": "celery_ha.maintenance.sweep",
                                     "schedule": settings.reclaim_interval, "options": {**options}},
        f"celery-ha-dead-letters{suffix}": {"task": "celery_ha.maintenance.dead_letters", "schedule": 300.0,
                                            "options": {**options}},
        f"celery-ha-proxy-health{suffix}": {"task": "celery_ha.maintenance.proxy_health", "schedule": 60.0,
                                            "options": {**options}},
    }


def _fan_out_entries(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Beat entries of a namespace pattern: each sends ``celery_ha.maintenance.fan_out`` with its job's
    name to the process's own maintenance queue, and the worker that takes it sends the job to the
    maintenance queue of every namespace the pattern matches now (``tasks/maintenance.py``)."""
    return {name: {**entry, "task": "celery_ha.maintenance.fan_out",
                   "args": [entry["task"].rsplit(".", 1)[1]]} for name, entry in entries.items()}


class DurableTimeLimits:
    """A Celery task annotation: the durable tasks' hard and soft time limits (``CELERY_HA_TASK_TIME_LIMIT``)
    where the task sets none itself, leaving the user's other tasks alone."""

    def __init__(self, limits: dict[str, float]) -> None:
        self.limits = {key.removeprefix("task_"): value for key, value in limits.items()}

    def annotate(self, task: Any) -> dict[str, float] | None:
        if not is_durable(task):
            return None
        return {key: value for key, value in self.limits.items() if getattr(task, key, None) is None}

    def annotate_any(self) -> None:
        return None
