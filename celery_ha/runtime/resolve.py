"""Which Redis the state layer uses: the configured URL, else the embedded one — only when asked for.

A missing ``CELERY_HA_REDIS_URL`` fails closed: a worker, beat or web process does not quietly start a
private Redis (two hosts configured alike would then crawl two different queues). The embedded Redis is
for development on one machine and is used only when ``CELERY_HA_EMBEDDED=1`` says so (``celery-ha
demo`` and ``up`` set it for their children), or, for the operator's CLI, when one is already running.
"""

from __future__ import annotations

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings
from celery_ha.runtime.embedded import EmbeddedRedis

#: The one line a process without a Redis URL stops with.
NO_REDIS_URL = ("no Redis configured: set CELERY_HA_REDIS_URL (e.g. redis://host:6379/0), or "
                "CELERY_HA_EMBEDDED=1 to use the local embedded Redis (development on one machine)")


def resolve_redis_url(settings: Settings | None = None, *, start: bool | None = None,
                      attach: bool = False) -> str:
    """The state-layer URL: ``CELERY_HA_REDIS_URL``; else the embedded Redis, started on demand when
    ``start`` (default: ``CELERY_HA_EMBEDDED``), or attached to when ``attach`` and it already runs;
    else :class:`ConfigurationError` with :data:`NO_REDIS_URL`."""
    settings = settings or Settings.from_env()
    if settings.redis_url:
        return settings.redis_url
    embedded = EmbeddedRedis(settings.data_dir)
    if settings.embedded if start is None else start:
        return embedded.ensure_running()
    if attach and (url := embedded.url) is not None:
        return url
    if attach and _holds_data(embedded):  # after `celery-ha demo`, which stops the Redis it started
        raise ConfigurationError(f"{NO_REDIS_URL}; the embedded Redis in {embedded.data_dir} is stopped "
                                 f"and holds data: `celery-ha redis start` brings it back")
    raise ConfigurationError(NO_REDIS_URL)


def _holds_data(embedded: EmbeddedRedis) -> bool:
    """Whether a stopped embedded Redis left its append-only file or a snapshot behind."""
    folder = embedded.data_dir
    return (folder / "appendonlydir").is_dir() or any(folder.glob("*.aof")) or (folder / "dump.rdb").exists()
