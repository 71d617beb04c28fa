"""Shipped Celery task modules: ``fetch`` (one page), ``crawl`` (paginated list), ``sitemap`` (sitemap
ingestion) and ``maintenance`` (sweep, pump, dead letters, proxy health). Every app celery-ha is attached
to (``init_app``, and the ready-made ``celery_ha.app``) imports all four by these full names
(``celery_app/config.py``), so a user's own top-level ``tasks`` package or ``tasks.py`` can never
shadow them."""
