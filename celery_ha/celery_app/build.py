"""Build the ready-made celery-ha Celery app (``celery -A celery_ha worker``): one ``init_app`` call."""

from __future__ import annotations

from celery import Celery

from celery_ha.celery_app.attach import _attach


def build_app() -> Celery:
    """A Celery app attached to celery-ha with the process's settings (environment, Django's
    ``CELERY_HA`` dict), whose only queues are the namespace's crawl and maintenance queues."""
    return _attach(Celery("celery_ha"), {}, standalone=True)
