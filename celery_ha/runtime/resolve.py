"""Which Redis the state layer uses: the configured URL, else the embedded one (started on demand)."""

from __future__ import annotations

from celery_ha.base.settings import Settings
from celery_ha.runtime.embedded import EmbeddedRedis


def resolve_redis_url(settings: Settings | None = None) -> str:
    """The state-layer URL: ``CELERY_HA_REDIS_URL``, else the embedded Redis (started on demand)."""
    settings = settings or Settings.from_env()
    if settings.redis_url:
        return settings.redis_url
    return EmbeddedRedis(settings.data_dir).ensure_running()
