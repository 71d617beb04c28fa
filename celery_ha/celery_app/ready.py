"""The ready-made app, built when first imported (``celery -A celery_ha``, ``celery_ha.app``)."""

from celery_ha.celery_app.build import build_app

app = build_app()
