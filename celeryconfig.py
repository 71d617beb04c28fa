"""celery-ha's Celery settings as a module, for a deployment that keeps its Celery configuration in a file.

celery-ha does not read this file: ``celery -A celery_ha`` and every app given to
``celery_ha.init_app`` get their settings from ``celery_ha.celery_app.config`` (by full name, so a
``celeryconfig.py`` in the working directory never changes them). It is here for a deployment that
wants to see, edit or start from them: ``app.config_from_object("celeryconfig")`` on an app of your
own, followed by ``init_app(app)``, which keeps what you set here and refuses, at start-up, a
worker-wide value celery-ha cannot work with (e.g. ``worker_prefetch_multiplier = 4``). The app-wide
task settings below (acks after the run, JSON only, the time limits) are the ready-made app's; on an
app of your own they apply to your tasks too, and celery-ha's tasks set their own either way.
"""

from __future__ import annotations

from celery_ha.base.settings import Settings
from celery_ha.celery_app.config import celery_settings

_wanted = celery_settings(Settings.from_env())

globals().update({key: req.value for key, req in _wanted.required.items()})
globals().update(_wanted.defaults)
globals().update(_wanted.standalone)
globals().update(_wanted.time_limits)
broker_transport_options = dict(_wanted.transport_options)
task_default_queue = _wanted.crawl_queue
task_queues = _wanted.queues
task_routes = _wanted.routes
beat_schedule = _wanted.beat_schedule
imports = list(_wanted.imports)
