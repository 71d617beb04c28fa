"""The project's own Celery app, as a Django project has it (``celery -A djproj worker``).

celery-ha is attached with one call and takes its settings from ``CELERY_HA`` in settings.py, like
the project's web processes: no second copy in the environment.
"""

import os

from celery import Celery

import celery_ha

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
celery_ha.init_app(app)
