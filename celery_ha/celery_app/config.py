"""The Celery settings celery-ha needs, built from its validated :class:`Settings`.

:func:`celery_settings` splits them by how :func:`celery_ha.celery_app.attach.init_app` treats an app
that already has a configuration of its own:

- ``required``: what celery-ha cannot work without, for the whole worker: prefetch 1 (a worker
  reserves no message it cannot run now) and JSON among the accepted content types (celery-ha's
  messages are JSON). An explicit user value that differs is refused at start-up, with one line
  naming it. The broker's visibility timeout must exceed the task time limit (checked in attach.py).
- ``defaults``: sensible values celery-ha applies unless the user set the key (events, the quick
  reconnect consumer, the soft shutdown, the broker when the app has none).
- ``standalone``: the app-wide task settings of the ready-made app only (acks after the run, no
  requeue of a dead child's message, JSON only, the durable tasks' time limits): on a user's app
  those stay the user's, and celery-ha's own tasks carry their own (:class:`CeleryHaTaskOptions`).
- ``queues``, ``routes``, ``beat_schedule``, ``imports``: added to the user's own.

Every celery-ha task sets its acknowledgement itself: the durable tasks ``acks_late=True,
reject_on_worker_lost=False`` (``@durable_task``), the maintenance jobs ``acks_late=False``
(``celery_ha/tasks/maintenance.py``, the Django relay). What depends on the app's configuration,
the serializer, the retry of a task whose child died, the durable tasks' time limits, is set per task
by :class:`CeleryHaTaskOptions` and :class:`JsonRoutes`: celery-ha's messages are JSON on an app
whose own tasks use pickle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery.app.annotations import prepare as prepare_annotations
from celery.utils.functional import firstmethod
from kombu import Queue

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.namespace_lists import matches_namespace_pattern
from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import CRAWL, MAINTENANCE, broker_queue
from celery_ha.integration.core.task_spec import REGISTRY, is_durable

#: Seconds the broker's visibility timeout must exceed the hard task time limit by.
VISIBILITY_MARGIN = 60.0

#: The shipped task modules every app celery-ha is attached to imports (by full name: a user's own
#: ``tasks`` or ``celeryconfig`` module can never shadow them).
SHIPPED_TASKS = ("celery_ha.tasks.fetch", "celery_ha.tasks.crawl", "celery_ha.tasks.sitemap",
                 "celery_ha.tasks.maintenance")

#: The content type of celery-ha's messages.
JSON = "json"
#: The name prefix of celery-ha's maintenance jobs (``tasks/maintenance.py``, the Django relay).
MAINTENANCE_TASKS = "celery_ha.maintenance."


def _accepts_json(value: Any) -> bool:
    """An ``accept_content`` that lets a worker take celery-ha's JSON messages (a list of names or
    content types; one name alone counts as a list of one)."""
    values = [value] if isinstance(value, str) else list(value or ())
    return any(str(v).lower() in (JSON, "application/json") for v in values)


@dataclass(frozen=True)
class Requirement:
    """One worker-wide setting celery-ha cannot work without: the value it sets when the app leaves the
    setting unset, and which user values are fine."""

    value: Any
    accepts: Callable[[Any], bool]
    why: str
    needs: str = ""  # what a refusal says celery-ha needs (default: the value)


@dataclass(frozen=True)
class CelerySettings:
    """celery-ha's part of one Celery app's configuration (see the module docstring)."""

    required: dict[str, Requirement]
    defaults: dict[str, Any]
    #: The ready-made app's app-wide task settings (a user's app keeps its own; see the module docstring).
    standalone: dict[str, Any]
    queues: tuple[Queue, ...]
    routes: dict[str, dict[str, str]]  # the maintenance jobs' (a user's app adds :class:`JsonRoutes`)
    beat_schedule: dict[str, dict[str, Any]]
    imports: tuple[str, ...]
    crawl_queue: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    #: ``task_time_limit`` and ``task_soft_time_limit`` of the durable tasks: app-wide on the ready-made
    #: app, through :class:`CeleryHaTaskOptions` on a user's app (whose other tasks keep their own).
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
    # Worker-wide: one setting for every task the worker runs, so celery-ha's tasks cannot set it alone.
    required = {
        "worker_prefetch_multiplier": Requirement(1, lambda v: v == 1,
                                                  "a worker reserves no message it cannot run now"),
        "accept_content": Requirement([JSON], _accepts_json, "celery-ha's messages are JSON",
                                      needs="'json' among them"),
    }
    # The ready-made app's tasks are celery-ha's: at-least-once delivery (the durable layer makes
    # duplicates harmless), a dead child's task released by fast failover, JSON only.
    standalone: dict[str, Any] = {
        "task_acks_late": True,
        "task_reject_on_worker_lost": False,
        "task_serializer": JSON,
        "event_serializer": JSON,
        "result_serializer": JSON,
        "result_accept_content": [JSON],
    }
    defaults: dict[str, Any] = {
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
    routes = {f"{MAINTENANCE_TASKS}*": {"queue": maintenance, "routing_key": maintenance, "serializer": JSON}}
    extra = tuple(m.strip() for m in settings.extra_imports.split(",") if m.strip())
    limits = {"task_time_limit": settings.task_time_limit,
              "task_soft_time_limit": settings.task_soft_time_limit}
    return CelerySettings(required=required, defaults=defaults, standalone=standalone, queues=queues,
                          routes=routes, beat_schedule=beat, imports=(*SHIPPED_TASKS, *extra),
                          crawl_queue=crawl, transport_options=transport_options, time_limits=limits)


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


class CeleryHaTaskOptions:
    """A Celery task annotation, first in a user's app's ``task_annotations``: what celery-ha's own
    tasks need that the app's configuration would otherwise decide for them.

    - every celery-ha task (durable, maintenance): ``serializer='json'``, so its messages are JSON on
      an app whose ``task_serializer`` is another (a worker of the ready-made app, or of another app,
      may take them);
    - a durable task: ``retry_on_worker_lost=False`` (fast failover releases a dead child's task on
      ``task_failure``, which Celery does not send for a task it retries), and the hard and soft
      limits of ``CELERY_HA_TASK_TIME_LIMIT`` where the task sets none itself.

    Celery applies only the first annotation that matches a task: the user's own annotation of a
    celery-ha task (the first of the list that follows this one) is merged over these, so it still
    applies and wins. Every other task gets None here, and the user's annotations as before.
    """

    def __init__(self, limits: dict[str, float], user_annotations: Any = None) -> None:
        self.limits = {key.removeprefix("task_"): value for key, value in limits.items()}
        self.user = prepare_annotations(user_annotations)

    def annotate(self, task: Any) -> dict[str, Any] | None:
        durable = is_durable(task)
        if not (durable or str(getattr(task, "name", "")).startswith(MAINTENANCE_TASKS)):
            return None
        options: dict[str, Any] = {"serializer": JSON}
        if durable:
            options["retry_on_worker_lost"] = False
            options.update({key: value for key, value in self.limits.items()
                            if getattr(task, key, None) is None})
        return {**options, **(_first_annotation(self.user, task) or {})}

    def annotate_any(self) -> None:
        return None


_first_annotation = firstmethod("annotate")


class JsonRoutes:
    """A Celery router: a durable task's message is JSON also where its task is not registered (a web
    process's ``pump_now``, which publishes by name), recognised by its name or by the crawl queue of a
    namespace the process serves. Returns only the serializer: the queue is the one celery-ha gave."""

    def __init__(self, settings: Settings) -> None:
        self.queues = frozenset(broker_queue(ns, CRAWL) for ns in settings.served_namespaces)
        self.patterns = settings.namespace_patterns

    def __call__(self, name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None,
                 **_: Any) -> dict[str, str] | None:
        queue = options.get("queue")
        queue = str(getattr(queue, "name", queue) or "")
        namespace, _sep, logical = queue.rpartition(".")
        if name in REGISTRY or queue in self.queues or (
                logical == CRAWL and matches_namespace_pattern(namespace, self.patterns)):
            return {"serializer": JSON}
        return None
