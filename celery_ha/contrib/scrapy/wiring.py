"""Check, at start-up, that the downloader middlewares are wired the way the pool needs.

Two mistakes pass silently otherwise: Scrapy's own ``RetryMiddleware`` left on (it retries through
whatever proxy comes next, may be the dead one, and counts proxy trouble as page retries), and a
middleware numbered above the pool's (it then sees answers before us; the sweep still returns the
leases, but a response it invents is judged late). A slot delay as long as the proxy lease works but
wastes leases (see ``download_start``). Each becomes one warning line at start.
"""

from __future__ import annotations

from typing import Any

from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

PROXY_MIDDLEWARE = "celery_ha.contrib.scrapy.middleware.CeleryHAProxyMiddleware"
RETRY_MIDDLEWARE = "celery_ha.contrib.scrapy.retry.CeleryHARetryMiddleware"
SCRAPY_RETRY = "scrapy.downloadermiddlewares.retry.RetryMiddleware"


def _name(component: Any) -> str:
    """The dotted name of a middleware given as a class or an import path ('' when unloadable:
    Scrapy reports that one itself)."""
    try:
        obj = load_object(component) if isinstance(component, str) else component
    except Exception:
        return ""
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def enabled_middlewares(settings: BaseSettings) -> dict[str, float]:
    """Enabled downloader middlewares (project + Scrapy's base list) by dotted name → priority."""
    components = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    out: dict[str, float] = {}
    for component, priority in components.items():
        name = _name(component)
        if name and priority is not None:
            out[name] = float(priority)
    return out


def check_wiring(settings: BaseSettings) -> list[str]:
    """Warnings about the downloader middleware order (empty when the README snippet is used)."""
    enabled = enabled_middlewares(settings)
    warnings: list[str] = []
    ours = enabled.get(PROXY_MIDDLEWARE)
    if SCRAPY_RETRY in enabled:
        warnings.append(
            f"Scrapy's RetryMiddleware is enabled: it retries through any proxy and counts proxy failures as "
            f"page retries; set it to None and enable {RETRY_MIDDLEWARE} at 550"
        )
    if ours is not None:
        later = sorted(name for name, prio in enabled.items() if prio > ours)
        if later:
            warnings.append(
                f"{', '.join(later)} run(s) after the celery-ha proxy middleware ({ours:g}); keep "
                "CeleryHAProxyMiddleware the highest-numbered downloader middleware (950)"
            )
    return warnings


def check_delays(settings: BaseSettings, lock_ttl: float) -> list[str]:
    """A warning when a download slot's delay can outlast the proxy lease: every request that waits
    for its turn would then reach the download handler with its lease run out and borrow again."""
    delay = settings.getfloat("DOWNLOAD_DELAY")
    name = "DOWNLOAD_DELAY"
    if settings.getbool("AUTOTHROTTLE_ENABLED") and settings.getfloat("AUTOTHROTTLE_MAX_DELAY") > delay:
        delay, name = settings.getfloat("AUTOTHROTTLE_MAX_DELAY"), "AUTOTHROTTLE_MAX_DELAY"
    if delay < 0.5 * lock_ttl:
        return []
    return [f"{name}={delay:g}s is not well below the proxy lease (lock_ttl={lock_ttl:g}s): requests waiting "
            f"in a download slot outlive their lease and borrow again when their download starts; raise "
            f"lock_ttl in CELERY_HA_SCRAPY_POOL"]
