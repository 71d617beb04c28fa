"""The composition root: where celery-ha is attached to Celery apps.

- :func:`init_app` attaches celery-ha to an app of your own (``proj/celery.py``);
- ``celery_ha.celery_app.app`` is the ready-made app (``celery -A celery_ha worker``), built with the
  same call on first use;
- :func:`pump_now` sends queued tasks to the broker now.

Nothing below this package imports it; every hook and job is handed the app. ``celery_ha`` exposes
it lazily, so ``from celery_ha import TaskQueue`` never imports Celery, and ``from celery_ha import
init_app`` does not build the ready-made app.
"""

from __future__ import annotations

from typing import Any

from celery_ha.celery_app.attach import attached_app, init_app
from celery_ha.integration.core.services import services
from celery_ha.integration.dispatch.pump import pump


def pump_now(window: int | None = None, app: Any = None, namespace: str | None = None) -> int:
    """Send this process's namespace's queued tasks (or ``namespace``'s, one of those it serves) to the
    broker now, up to the window (workers and beat pump anyway; this spares a freshly queued batch the
    wait), through ``app`` (default: the app ``init_app`` attached, else the ready-made one). Returns
    how many were sent."""
    rt = services(namespace)
    return pump(rt.queue, app or attached_app() or ready_app(), rt.settings, window)


def ready_app() -> Any:
    """The ready-made app (built on first use)."""
    from celery_ha.celery_app.ready import app

    return app


def __getattr__(name: str) -> Any:
    if name == "app":
        return ready_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "init_app", "pump_now"]
