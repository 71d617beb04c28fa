"""Maintenance work: reclaim sweep + pump, dead-letter summary, proxy health hook.

Every job takes a short Redis lock first, so two beats (or a beat and a worker watchdog) running
the same job at once are harmless: the loser skips. The sweep stamps ``last_sweep`` (Redis time)
in the namespace's meta hash; worker watchdogs read it to notice that beat is down.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import redis

from .keys import QueueKeys
from .pump import pump
from .runtime import Runtime, runtime
from .settings import raw_setting
from .workers import prune, redis_now_ms

log = logging.getLogger(__name__)

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@contextlib.contextmanager
def short_lock(client: redis.Redis, key: str, ttl: float) -> Iterator[bool]:
    """``SET NX PX`` lock; yields whether we got it. Released by compare-and-delete, so a lock that
    expired and was taken by someone else is never deleted by us."""
    token = secrets.token_hex(8)
    got = bool(client.set(key, token, nx=True, px=max(1, int(ttl * 1000))))
    try:
        yield got
    finally:
        if got:
            with contextlib.suppress(redis.RedisError):
                client.eval(_UNLOCK, 1, key, token)


def last_sweep_age(rt: Runtime) -> float:
    """Seconds since the last completed sweep (Redis clock); infinity if none was ever recorded."""
    keys = QueueKeys(rt.settings.namespace)
    pipe = rt.client.pipeline(transaction=False)
    pipe.hget(keys.meta, "last_sweep")
    pipe.time()
    last, (sec, usec) = pipe.execute()
    if not last:
        return float("inf")
    now = int(sec) * 1000 + int(usec) // 1000
    return max(0.0, (now - int(last)) / 1000.0)


def sweep(app: Any, rt: Runtime | None = None, source: str = "beat") -> dict[str, Any] | None:
    """Reclaim expired leases, promote due retries, re-dispatch lost messages and refill the window.

    Returns a summary, or None when another process holds the sweep lock.
    """
    rt = rt or runtime()
    s = rt.settings
    keys = QueueKeys(s.namespace)
    with short_lock(rt.client, keys.lock("sweep"), ttl=max(2.0, s.reclaim_interval)) as got:
        if not got:
            return None
        reclaimed = rt.queue.reclaim_expired()
        sent = pump(rt.queue, app, s)
        now = redis_now_ms(rt.client)
        rt.client.hset(keys.meta, mapping={"last_sweep": now, "last_sweep_by": f"{source}:{rt.worker_name}"})
        prune(rt.client, s.namespace, older_than=max(60.0, 10 * s.lease_ttl))
    if reclaimed:
        log.warning("sweep (%s): reclaimed %d expired lease(s), sent %d message(s)", source, reclaimed, sent)
    else:
        log.debug("sweep (%s): sent %d message(s)", source, sent)
    return {"reclaimed": reclaimed, "sent": sent, "source": source}


def dead_letter_summary(rt: Runtime | None = None, sample: int = 5) -> dict[str, Any] | None:
    """Log how many tasks are dead and why (a few examples); None when the lock is taken."""
    rt = rt or runtime()
    keys = QueueKeys(rt.settings.namespace)
    with short_lock(rt.client, keys.lock("deadletters"), ttl=30) as got:
        if not got:
            return None
        total = int(rt.client.zcard(keys.dead))
        examples = [{"id": t.id, "url": t.url, "task": t.task, "error": t.error}
                    for t in rt.queue.dead(limit=sample)]
    if total:
        log.warning("dead letters in %r: %d task(s); e.g. %s", rt.settings.namespace, total,
                    "; ".join(f"{e['id']} {e['url']}: {e['error']}" for e in examples))
    return {"dead": total, "examples": examples}


def proxy_health(rt: Runtime | None = None) -> dict[str, Any] | None:
    """Run the proxy pool's health check when that module exists, proxies are configured and a
    check URL is set (``CELERY_HA_PROXY_CHECK_URL``); None when another process holds the lock."""
    rt = rt or runtime()
    try:
        from .proxy import ProxyPool
        from .proxy.health import check_proxies
    except ImportError:
        return {"skipped": "proxy health module not available"}
    check_url = raw_setting("CELERY_HA_PROXY_CHECK_URL")
    if not check_url:
        return {"skipped": "CELERY_HA_PROXY_CHECK_URL not set"}
    keys = QueueKeys(rt.settings.namespace)
    with short_lock(rt.client, keys.lock("proxyhealth"), ttl=60) as got:
        if not got:
            return None
        pool = ProxyPool.from_url(rt.redis_url, namespace=rt.settings.namespace)
        counts = pool.stats()
        if not any(counts.get(zone, 0) for zone in ("available", "new", "temp_banned", "in_use")):
            return {"skipped": "no proxies configured"}
        report = check_proxies(pool, check_url)
    return {"checked": report.checked, "restored": len(report.restored), "demoted": len(report.demoted)}
