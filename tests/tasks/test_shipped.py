"""The shipped tasks' own helpers, and where the shipped tasks live."""

from __future__ import annotations

import requests

from celery_ha.demo import DemoSite
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.tasks.crawl import page_url
from celery_ha.tasks.fetch import parse_page
from celery_ha.tasks.sitemap import sitemap as _sitemap  # noqa: F401  (registers the task)


def test_parse_page_and_page_url() -> None:
    with DemoSite(total=20, page_size=10) as site:
        page = parse_page(requests.get(site.case_url(12), timeout=5).text)
    assert page["title"].startswith("Case 000012") and "Judgment in case 12" in page["text"]
    assert page_url("http://x.test/cases?sort=a&page=3", 7) == "http://x.test/cases?sort=a&page=7"


def test_shipped_tasks_register_under_their_full_module_names() -> None:
    """A user's own top-level ``tasks`` can never be mistaken for them."""
    assert REGISTRY["fetch_page"].fn.__module__ == "celery_ha.tasks.fetch"
    assert REGISTRY["crawl_list"].fn.__module__ == "celery_ha.tasks.crawl"
    assert REGISTRY["sitemap"].fn.__module__ == "celery_ha.tasks.sitemap"
