"""The composition root: the one place the Celery app is built (``celery -A celery_ha worker``).

Nothing below this package imports it; every hook and job is handed the app. Importing it has side
effects on purpose (``celeryconfig`` resolves the Redis URL, which may start the embedded Redis), so
``celery_ha`` exposes it lazily: ``from celery_ha import TaskQueue`` never imports Celery.
"""

from celery_ha.celery_app.build import build_app

app = build_app()

__all__ = ["app", "build_app"]
