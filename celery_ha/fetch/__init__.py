"""Proxy-aware HTTP fetching for durable tasks (``ctx.fetch``).

Modules: ``fetcher`` (the :class:`~celery_ha.fetch.fetcher.Fetcher` rotation loop), ``classify``
(response → outcome), ``headers`` (browser headers), ``robots`` (the robots.txt cache), ``errors``
(what a fetch raises), ``process_fetcher`` (one fetcher per worker process) and the sitemap reader
(``sitemap``, ``sitemap_parse``) with its batched ingestion into the queue (``sitemap_ingest``).
Nothing is imported here, so ``celery_ha.fetch.errors`` stays cheap for the task layer to import.
"""
