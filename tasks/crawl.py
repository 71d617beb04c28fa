"""``crawl_list`` (re-exported from ``celery_ha.tasks.crawl``, where it is defined and registered)."""

from celery_ha.tasks.crawl import crawl_list, page_url

__all__ = ["crawl_list", "page_url"]
