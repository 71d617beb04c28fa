"""A deployment's own task modules go here (list them in ``CELERY_HA_EXTRA_IMPORTS``, e.g.
``tasks.prices``). This folder is not part of the installed package: celery-ha's shipped tasks live in
``celery_ha.tasks`` and are imported by their full names; ``tasks.fetch`` and ``tasks.crawl`` re-export
them for code that imported them from here."""
