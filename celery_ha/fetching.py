"""The one place a durable task's HTTP request goes through (``ctx.fetch``).

Each process keeps one :class:`celery_ha.fetcher.Fetcher` (rebuilt after a fork). It borrows from the
namespace's proxy pool whenever the pool holds any proxy at all, and fetches directly only when no
proxy was ever configured (or ``CELERY_HA_DIRECT_WHEN_EMPTY=1`` allows it when every proxy is banned).
Errors come from the fetcher: the task runner only looks at ``exc.permanent``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import requests

from .fetcher import Fetcher, FetchError, PermanentFetchError, RobotsDisallowed
from .proxy import ProxyPool

__all__ = ["FetchError", "PermanentFetchError", "RobotsDisallowed", "fetch", "fetcher", "is_permanent"]

#: How long a process trusts its "the pool has proxies / has none" reading.
POOL_RECHECK_SECONDS = 10.0

_lock = threading.Lock()
_state: dict[str, Any] = {}


def is_permanent(exc: BaseException) -> bool:
    """True when ``exc`` says retrying cannot help (any exception with ``permanent = True``)."""
    return bool(getattr(exc, "permanent", False))


def _pool_has_proxies(pool: ProxyPool) -> bool:
    stats = pool.stats()
    return any(stats[zone] for zone in ("available", "new", "temp_banned", "perm_banned", "in_use"))


def fetcher() -> Fetcher:
    """This process's fetcher: through the pool when it has proxies, else direct."""
    from .runtime import runtime

    rt = runtime()
    now = time.monotonic()
    with _lock:
        if _state.get("pid") == os.getpid() and now - _state["checked"] < POOL_RECHECK_SECONDS:
            return _state["fetcher"]
        same_process = _state.get("pid") == os.getpid()
        pool: ProxyPool = _state["pool"] if same_process else ProxyPool(rt.client, rt.settings.namespace)
        use_pool = _pool_has_proxies(pool)
        current: Fetcher | None = _state.get("fetcher") if same_process else None
        if current is None or (current.pool is not None) != use_pool:
            current = Fetcher(pool if use_pool else None, worker=rt.worker_name,
                              obey_robots=rt.settings.obey_robots,
                              direct_when_empty=rt.settings.direct_when_empty)
        _state.update(pid=os.getpid(), checked=now, fetcher=current, pool=pool)
        return current


def fetch(url: str, method: str = "GET", **kwargs: Any) -> requests.Response:
    """Fetch ``url`` (proxy rotation, backoff, classification inside); raise a FetchError subclass."""
    return fetcher().fetch(url, method, **kwargs)
