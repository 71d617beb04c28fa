"""``fetch_page`` (re-exported from ``celery_ha.tasks.fetch``, where it is defined and registered)."""

from celery_ha.tasks.fetch import MAX_TEXT_CHARS, fetch_page, parse_page

__all__ = ["MAX_TEXT_CHARS", "fetch_page", "parse_page"]
