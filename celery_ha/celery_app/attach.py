"""``init_app``: attach celery-ha to a Celery app — the user's own, or the ready-made ``celery_ha.app``.

Attaching does four things, all scoped to that app:

1. the process's celery-ha settings: ``init_app(app, namespace="shop", ...)`` takes every knob by its
   short name (as Django's ``CELERY_HA`` dict does); the environment wins, then these, then Django's
   ``CELERY_HA`` dict, then the defaults (:meth:`Settings.from_overrides`);
2. the worker hooks (fast failover, the pump, the window, graceful hand-back, eviction refusal, ...),
   connected so that they act only for this app;
3. kombu's Redis transport fixes, once per process;
4. the Celery settings celery-ha needs (``celery_app/config.py``), applied when the app's own
   configuration is loaded, so a ``config_from_object`` before or after ``init_app`` is honoured: a
   required (worker-wide) setting the user set to something else is refused at start-up with one line
   naming it; the rest is added to (queues, routes, annotations, beat entries, imports) or fills in
   what the user left unset. The app's own tasks keep their acknowledgement and serializer: celery-ha's
   tasks set theirs per task.

A worker or beat of the app stops at start-up, with one line, when there is no state Redis to use
(the app's own broker does not stand in for it).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from celery import Celery
from kombu import Queue

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings, django_has, field_of_variable
from celery_ha.celery_app.config import (
    VISIBILITY_MARGIN,
    CeleryHaTaskOptions,
    CelerySettings,
    JsonRoutes,
    celery_settings,
)
from celery_ha.integration.core.services import configure, process_settings
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.integration.patches import kombu_client_reuse, kombu_fixes, kombu_lean_acks
from celery_ha.integration.worker.hooks import WorkerHooks
from celery_ha.integration.worker.start_checks import missing_modules
from celery_ha.runtime.resolve import resolve_redis_url

log = logging.getLogger(__name__)

#: The attribute an attached app carries (its :class:`Attachment`).
ATTRIBUTE = "celery_ha"
#: The apps attached in this process, oldest first (``pump_now`` uses the first).
_attached: list[Celery] = []


def attached_app() -> Celery | None:
    """The first app celery-ha was attached to in this process, or None."""
    return _attached[0] if _attached else None


def under_celery_cli() -> bool:
    """True in a process the ``celery`` command started (worker, beat, flower, inspect, ...)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("celery", "celery.exe") or \
        "celery.__main__" in sys.modules


def runs_tasks() -> bool:
    """True in a ``celery worker`` or ``celery beat`` process (which import the task modules)."""
    return under_celery_cli() and any(arg in ("worker", "beat") for arg in sys.argv[1:])


def refuse(message: str) -> None:
    """Stop a process of the ``celery`` command with one line (no traceback)."""
    print(f"celery-ha: configuration error: {message}", file=sys.stderr)
    raise SystemExit(2)


class Attachment:
    """celery-ha on one app: its settings and hooks."""

    def __init__(self, app: Celery, settings: Settings, standalone: bool) -> None:
        self.app = app
        self.settings = settings
        self.standalone = standalone  # the ready-made app: celery-ha's queues are its only ones
        self.hooks = WorkerHooks(app).install()

    def configure(self) -> dict[str, Any]:
        """Apply celery-ha's settings to the app's configuration as it is being loaded, and return the
        defaults (a layer below the user's own values). Registered with ``app.add_defaults``, whose
        promises run when the configuration is first read (after ``config_from_object``, whenever it
        was called) and whose errors, unlike a signal receiver's, reach the caller."""
        try:
            if (ignored := ignored_conf_keys(self.app.conf)):
                log.warning("celery-ha: %s", ignored)
            if runs_tasks():
                if missing := missing_modules(self.settings.extra_imports):
                    # Celery imports them before any signal: it would stop with a traceback
                    raise ConfigurationError(f"CELERY_HA_EXTRA_IMPORTS: no module named "
                                             f"{', '.join(map(repr, missing))}")
                # A worker or beat needs the state Redis even when the app has a broker of its own:
                # without one it would start, then fail at every hook and sweep.
                resolve_redis_url(self.settings)
            return _apply(self.app.conf, self.settings, self.standalone)
        except ConfigurationError as exc:
            if under_celery_cli():
                refuse(str(exc))
            raise


def init_app(app: Celery, **settings: Any) -> Celery:
    """Attach celery-ha to ``app`` (see the module docstring) and return it.

    ``settings`` are celery-ha knobs by short name (``redis_url``, ``namespace``, ``lease_ttl``, ...);
    an unknown name or a bad value raises :class:`ConfigurationError` now, a Celery setting that
    breaks the guarantees when the app's configuration is loaded. Calling it again for the same app
    does nothing.
    """
    return _attach(app, settings, standalone=False)


def _attach(app: Celery, overrides: dict[str, Any], standalone: bool) -> Celery:
    if isinstance(getattr(app, ATTRIBUTE, None), Attachment):
        return app
    try:
        resolved = Settings.from_overrides(overrides) if overrides else process_settings()
        configure(resolved)
    except ConfigurationError as exc:
        if under_celery_cli():
            refuse(str(exc))
        raise
    kombu_fixes.install()
    kombu_client_reuse.install()
    kombu_lean_acks.install(REGISTRY.__contains__)
    attachment = Attachment(app, resolved, standalone)
    setattr(app, ATTRIBUTE, attachment)
    _attached.append(app)
    app.add_defaults(attachment.configure)  # now if the app is configured already, else on first read
    return app


def ignored_conf_keys(conf: Any) -> str | None:
    """The warning for ``CELERY_HA_*`` keys in a Celery app's configuration (``app.conf.update(
    CELERY_HA_REDIS_URL=...)``, a config module), which celery-ha never reads there, or None. Keys that
    Django's settings hold are read there (``django.conf:settings``): not named."""
    keys = sorted(k for k in conf.keys() if isinstance(k, str) and (k.upper() == "CELERY_HA" or
                                                                       k.upper().startswith("CELERY_HA_"))
                  and not django_has(k))
    if not keys:
        return None
    known = [f"{name}=..." for k in keys if (name := field_of_variable(k.upper()))]
    how = f"init_app(app, {', '.join(known)})" if known else "init_app's keywords"
    return (f"this Celery app's configuration holds {', '.join(keys)}, which celery-ha does not read "
            f"there (ignored): pass them as {how}, or set them in the environment")


# ---------------------------------------------------------------------------------------- applying
def _broker_url(conf: Any, settings: Settings) -> tuple[str, bool]:
    """The broker this app uses, and whether celery-ha chose it: ``CELERY_BROKER_URL`` (or
    ``broker_url=`` given to init_app), else the app's own, else the state Redis."""
    if settings.broker_url:
        return settings.broker_url, True
    if conf.value_set_for("broker_url") and conf.broker_url:
        return str(conf.broker_url), False
    return resolve_redis_url(settings), True


def _conflicts(conf: Any, wanted: CelerySettings) -> list[str]:
    found = []
    for key, req in wanted.required.items():
        if conf.value_set_for(key) and not req.accepts(conf[key]):
            found.append(f"{key}={conf[key]!r} (celery-ha needs {req.needs or repr(req.value)}: {req.why})")
    return found


def _routers(routes: Any) -> list[Any]:
    """A router or annotation setting (one, a list, or None) as a list."""
    if routes is None:
        return []
    if isinstance(routes, (list, tuple)):
        return list(routes)
    return [routes]


def _queues(conf: Any, wanted: CelerySettings, standalone: bool) -> list[Queue]:
    if standalone:
        return list(wanted.queues)
    mine = list(conf.task_queues or [])
    if not mine:  # Celery would make the default queue: keep it beside celery-ha's
        default = str(conf.task_default_queue)
        mine = [Queue(default, routing_key=str(conf.task_default_routing_key or default))]
    names = {q.name for q in mine}
    return mine + [q for q in wanted.queues if q.name not in names]


def _merged(first: Iterable[str], then: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*first, *then]))


def _apply(conf: Any, settings: Settings, standalone: bool) -> dict[str, Any]:
    """Check and update ``conf`` in place; return the defaults to add below the user's values."""
    url, chosen = _broker_url(conf, settings)
    broker = kombu_broker(url, settings)
    wanted = celery_settings(settings)
    problems = _conflicts(conf, wanted)
    if problems:
        raise ConfigurationError("this Celery app's settings break celery-ha's guarantees: "
                                 + "; ".join(problems) + " — remove them or set the values celery-ha needs")
    updates: dict[str, Any] = {key: req.value for key, req in wanted.required.items()
                               if not conf.value_set_for(key)}
    options = {**wanted.transport_options, **broker.transport_options,
               **(conf.broker_transport_options or {})}
    if chosen:  # celery-ha picked the broker: its normalized URL, whatever the app said
        updates.update(broker_url=broker.url, broker_read_url=broker.url, broker_write_url=broker.url)
    if broker.use_ssl is not None and not conf.value_set_for("broker_use_ssl"):
        updates["broker_use_ssl"] = broker.use_ssl
    limit = conf.task_time_limit if conf.value_set_for("task_time_limit") else settings.task_time_limit
    if limit and float(options["visibility_timeout"]) <= float(limit) + VISIBILITY_MARGIN:
        raise ConfigurationError(
            f"the broker's visibility_timeout ({options['visibility_timeout']}s) must exceed the task time "
            f"limit ({limit}s) + {VISIBILITY_MARGIN:g}s, or the Redis broker redelivers messages of tasks "
            f"that are still running (broker {mask_url(url)})")
    updates["broker_transport_options"] = options
    updates["task_queues"] = _queues(conf, wanted, standalone)
    if standalone:
        updates["task_default_queue"] = wanted.crawl_queue
    defaults = dict(wanted.defaults)
    if standalone:  # celery-ha's tasks are the app's: app-wide
        updates["task_routes"] = [wanted.routes, *_routers(conf.task_routes)]
        defaults.update(wanted.standalone)
        defaults.update(wanted.time_limits)
    else:  # celery-ha's tasks only: the user's own keep the app's settings
        updates["task_routes"] = [wanted.routes, JsonRoutes(settings), *_routers(conf.task_routes)]
        user = _routers(conf.task_annotations)
        updates["task_annotations"] = [CeleryHaTaskOptions(wanted.time_limits, user), *user]
    updates["beat_schedule"] = {**(conf.beat_schedule or {}), **wanted.beat_schedule}
    updates["imports"] = _merged(conf.imports or (), wanted.imports)
    conf.update(updates)
    return defaults
