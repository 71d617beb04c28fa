"""Celery side of the Django app: the outbox relay as a beat job.

Listed in a worker's and beat's ``CELERY_HA_EXTRA_IMPORTS`` (``manage.py celery_ha up`` adds it), with
``DJANGO_SETTINGS_MODULE`` set: importing it sets Django up (so task modules listed after it may use
the ORM) and schedules ``celery_ha.maintenance.django_outbox`` every ``RELAY_INTERVAL`` seconds on the
namespace's maintenance queue. A project that runs its own Celery app and autodiscovers tasks gets
the same job in its own beat. Two beats relaying at once are harmless: relaying is idempotent.
"""

from __future__ import annotations

import os
from typing import Any

import django
from celery import current_app, shared_task
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections

from celery_ha.contrib.django.runtime import current_config

RELAY_TASK = "celery_ha.maintenance.django_outbox"
SCHEDULE_NAME = "celery-ha-django-outbox"


def ensure_django() -> None:
    """Set Django up in a Celery process (needs ``DJANGO_SETTINGS_MODULE``); a no-op once it is."""
    if apps.ready:
        return
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ImproperlyConfigured(f"{__name__} runs the outbox relay of a Django project: set "
                                   "DJANGO_SETTINGS_MODULE for the worker and beat (e.g. myproject.settings)")
    django.setup()


ensure_django()


@shared_task(name=RELAY_TASK, ignore_result=True, acks_late=False)
def relay_outbox() -> dict[str, Any]:
    """Push the outbox rows that the requests which wrote them could not push."""
    from celery_ha.contrib.django.outbox import relay  # the models need the app registry: after setup

    close_old_connections()  # a worker lives long; Django's request cycle is not there to do it
    try:
        return relay().as_dict()
    finally:
        close_old_connections()


current_app.add_periodic_task(current_config().relay_interval, relay_outbox.s(), name=SCHEDULE_NAME)
