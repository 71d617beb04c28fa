"""The composition root: the one place the Celery app is built (``celery -A celery_ha worker``).

Nothing below this package imports it; every hook and job is handed the app. Importing it has side
effects on purpose (``celeryconfig`` resolves the Redis URL, which may start the embedded Redis), so
``celery_ha`` exposes it lazily: ``from celery_ha import TaskQueue`` never imports Celery.
"""

from __future__ import annotations

from celery_ha.celery_app.build import build_app
from celery_ha.integration.pump import pump
from celery_ha.integration.services import services

app = build_app()


def pump_now(window: int | None = None) -> int:
    """Send this process's namespace's queued tasks to the broker now, up to the window (workers and
    beat pump anyway; this spares a freshly queued batch the wait). Returns how many were sent."""
    rt = services()
    return pump(rt.queue, app, rt.settings, window)


__all__ = ["app", "build_app", "pump_now"]
