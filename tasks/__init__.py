"""Shipped Celery task modules: ``fetch`` (one page), ``crawl`` (paginated list) and
``maintenance`` (sweep, dead letters, proxy health). The ``celery_ha`` app imports all three."""
