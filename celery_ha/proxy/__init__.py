"""The centralized proxy pool: borrow → use → return, with locks, rate windows, scores and bans in Redis.

See ``docs/proxy_pool.md`` for the user guide.
"""

from __future__ import annotations

from celery_ha.proxy.health import HealthReport, check_proxies
from celery_ha.proxy.pool import OUTCOMES, PoolConfig, ProxyInfo, ProxyLease, ProxyPool, outcome_for
from celery_ha.proxy.providers import (
    ApiProvider,
    FreeListProvider,
    StaticProvider,
    TunnelProvider,
    install_all,
    parse_alive,
)
from celery_ha.proxy.validation import ProxySpec, normalize_domain, parse_proxy_url, parse_rate

__all__ = [
    "OUTCOMES",
    "ApiProvider",
    "FreeListProvider",
    "HealthReport",
    "PoolConfig",
    "ProxyInfo",
    "ProxyLease",
    "ProxyPool",
    "ProxySpec",
    "StaticProvider",
    "TunnelProvider",
    "check_proxies",
    "install_all",
    "normalize_domain",
    "outcome_for",
    "parse_alive",
    "parse_proxy_url",
    "parse_rate",
]
