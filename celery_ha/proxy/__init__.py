"""The centralized proxy pool: borrow → use → return, with locks, rate windows, scores and bans in Redis.

Modules: ``pool`` (the :class:`ProxyPool` client), ``config`` (:class:`PoolConfig`), ``types`` (leases
and listings), ``outcomes`` (HTTP status → outcome), ``keys`` (Redis key names), ``tokens`` (lease
tokens), ``records`` (the stored proxy hash), ``scoring`` (the score formula), ``validation`` (proxy
URLs and domains), ``providers`` (where proxies come from) and ``health`` (probing banned and new
proxies). Each state change is one Lua script beside these modules.
"""

from __future__ import annotations

from celery_ha.base.validation import parse_rate
from celery_ha.proxy.config import PoolConfig
from celery_ha.proxy.health import HealthReport, check_proxies
from celery_ha.proxy.outcomes import (
    BLOCK_STATUSES,
    OUTCOMES,
    PERMANENT_STATUSES,
    outcome_for,
    status_outcome,
)
from celery_ha.proxy.pool import ProxyPool
from celery_ha.proxy.providers import (
    ApiProvider,
    FreeListProvider,
    StaticProvider,
    TunnelProvider,
    install_all,
    parse_alive,
)
from celery_ha.proxy.types import ProxyInfo, ProxyLease
from celery_ha.proxy.validation import ProxySpec, normalize_domain, parse_proxy_url

__all__ = [
    "BLOCK_STATUSES",
    "OUTCOMES",
    "PERMANENT_STATUSES",
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
    "status_outcome",
]
