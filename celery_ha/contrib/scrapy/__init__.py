"""Scrapy on celery-ha's central proxy pool (``pip install 'celery-ha[scrapy]'``).

Two downloader middlewares, enabled in a project's ``settings.py`` (README "Scrapy")::

    DOWNLOADER_MIDDLEWARES = {
        "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        "celery_ha.contrib.scrapy.CeleryHARetryMiddleware": 550,
        "celery_ha.contrib.scrapy.CeleryHAProxyMiddleware": 950,
    }

Modules: ``middleware`` (borrow per request, return with the outcome), ``retry`` (retries that switch
proxy first), ``book`` (which request holds which lease), ``outcome`` (a Scrapy response or failure
in the pool's words), ``body`` (the start of a still-compressed body, for the captcha scan),
``download_start`` (the moment a download leaves its slot, and the lease left then), ``proxy_auth``
(meta['proxy'] and Proxy-Authorization), ``config`` (Scrapy settings → celery-ha settings and the
pool), ``refusal`` (a configuration error stops the crawl with one line), ``wiring`` (start-up checks
of the middleware order and slot delays), ``clock`` (non-blocking waits), ``keys`` (meta and stats
names).
"""

from __future__ import annotations

try:
    import scrapy  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("celery_ha.contrib.scrapy needs Scrapy: pip install 'celery-ha[scrapy]'") from exc

from celery_ha.contrib.scrapy.middleware import CeleryHAProxyMiddleware
from celery_ha.contrib.scrapy.retry import CeleryHARetryMiddleware

__all__ = ["CeleryHAProxyMiddleware", "CeleryHARetryMiddleware"]
