"""Maintenance work: reclaim sweep + pump, dead-letter summary, proxy health hook.

Every job takes a short Redis lock first, so two beats (or a beat and a worker watchdog) running
the same job at once are harmless: the loser skips. The sweep stamps ``last_sweep`` (Redis time)
in the namespace's meta hash; worker watchdogs read it to notice that beat is down.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_ha.integration.core.services import Services, services
from celery_ha.integration.dispatch.pump import arm_host_timer, pump, resend_dispatched
from celery_ha.integration.upkeep.broker_epoch import broker_lost_messages
from celery_ha.proxy import ProxyPool, check_proxies
from celery_ha.redisio.clock import redis_now_ms
from celery_ha.redisio.lock import short_lock
from celery_ha.state.keys import QueueKeys
from celery_ha.state.worker_registry import newest_silent_beat, prune, quiet_after, quiet_window

log = logging.getLogger(__name__)


def last_sweep_age(rt: Services) -> float:
    """Seconds since the last completed sweep (Redis clock); infinity if none was ever recorded."""
    last = rt.client.hget(QueueKeys(rt.settings.namespace).meta, "last_sweep")
    if not last:
        return float("inf")
    return max(0.0, (redis_now_ms(rt.client) - int(last)) / 1000.0)


def a_process_fell_silent(rt: Services, now_ms: int) -> bool:
    """Whether a pool process of the namespace stopped beating since the last sweep (``now_ms``:
    this sweep's time, the one it stamps, so the next sweep's look starts where this one ended).

    A worker's main process keeps the messages it reserved (one per pool process) in memory only, so
    a worker SIGKILLed with messages reserved strands their tasks ``dispatched``. Rather than wait
    ``CELERY_HA_REDISPATCH_AFTER`` for them, the sweep that sees its processes fall silent sends every
    dispatched task again whose message is not waiting in the broker. A live worker's reserved message
    (at most one per pool process) and a message still being published get a second one, which the
    claim drops; that happens once per process that dies."""
    s = rt.settings
    last = rt.client.hget(QueueKeys(s.namespace).meta, "last_sweep")
    return newest_silent_beat(rt.client, s.namespace, int(last) if last else 0,
                              quiet_after(s.heartbeat_interval), now_ms) is not None


def sweep(app: Any, rt: Services | None = None, source: str = "beat") -> dict[str, Any] | None:
    """Reclaim expired leases, queue the scheduled refetches that are due, promote due retries,
    re-dispatch lost messages, refill the window and forget dedup ids past their TTL.

    Returns a summary, or None when another process holds the sweep lock. Beat's messages carry no
    expiry (that would be judged by the clocks of beat and of the worker); instead a beat sweep that
    arrives within half a reclaim interval of the last sweep (Redis clock) is skipped, so a backlog of
    them after an outage costs two reads each.
    """
    rt = rt or services()
    s = rt.settings
    keys = QueueKeys(s.namespace)
    if source == "beat" and last_sweep_age(rt) < s.reclaim_interval / 2:
        return {"skipped": "a sweep ran less than half a reclaim interval ago", "source": source}
    with short_lock(rt.client, keys.lock("sweep"), ttl=max(2.0, s.reclaim_interval)) as got:
        if not got:
            return None
        silence = quiet_window(rt.client, s.namespace, quiet_after(s.heartbeat_interval))
        reclaimed = rt.queue.reclaim_expired(spare=silence)
        refetched = rt.queue.refetch_due()  # scheduled runs whose time came, bounded per sweep
        broker_lost = broker_lost_messages(app, rt)
        now = redis_now_ms(rt.client)
        silent = not broker_lost and a_process_fell_silent(rt, now)
        if broker_lost or silent:
            sent = resend_dispatched(rt.queue, app, s)
        else:
            sent = pump(rt.queue, app, s)
        if broker_lost:
            log.warning("sweep (%s): the broker lost its messages (restarted empty?): re-sent %d "
                        "dispatched task(s) at once", source, sent)
        elif silent:
            log.warning("sweep (%s): a worker process stopped beating: dispatched tasks whose message is "
                        "not in the broker were sent again (%d sent)", source, sent)
        # A host the sweep's pump had to pass over (a slot the reclaim held for a request that may
        # still be in flight, a spacing, a block) may hand out its task at a time no event marks: this
        # process pumps then, as after any other pump, rather than the next sweep.
        arm_host_timer(app, rt)
        rt.client.hset(keys.meta, mapping={"last_sweep": now, "last_sweep_by": f"{source}:{rt.worker_name}"})
        prune(rt.client, s.namespace, older_than=max(60.0, 10 * s.lease_ttl))
        forgotten = rt.queue.forget_finished()  # dedup ids past CELERY_HA_DEDUP_TTL, bounded per sweep
    if reclaimed:
        log.warning("sweep (%s): reclaimed %d expired lease(s), sent %d message(s)", source, reclaimed, sent)
    else:
        log.debug("sweep (%s): sent %d message(s)", source, sent)
    return {"reclaimed": reclaimed, "sent": sent, "source": source, "broker_lost": broker_lost,
            "forgotten": forgotten, "refetched": refetched}


def dead_letter_summary(rt: Services | None = None, sample: int = 5) -> dict[str, Any] | None:
    """Log how many tasks are dead and why (a few examples); None when the lock is taken."""
    rt = rt or services()
    keys = QueueKeys(rt.settings.namespace)
    with short_lock(rt.client, keys.lock("deadletters"), ttl=30) as got:
        if not got:
            return None
        total = int(rt.queue.stats()["dead"])  # every shard's (CELERY_HA_SHARDS)
        examples = [{"id": t.id, "url": t.url, "task": t.task, "error": t.error}
                    for t in rt.queue.dead(limit=sample)]
    if total:
        log.warning("dead letters in %r: %d task(s); e.g. %s", rt.settings.namespace, total,
                    "; ".join(f"{e['id']} {e['url']}: {e['error']}" for e in examples))
    return {"dead": total, "examples": examples}


def proxy_health(rt: Services | None = None) -> dict[str, Any] | None:
    """Probe the proxies that are due when the pool holds any and ``CELERY_HA_PROXY_CHECK_URL`` is
    set; None when another process holds the lock."""
    rt = rt or services()
    check_url = rt.settings.proxy_check_url
    if not check_url:
        return {"skipped": "CELERY_HA_PROXY_CHECK_URL not set"}
    keys = QueueKeys(rt.settings.namespace)
    with short_lock(rt.client, keys.lock("proxyhealth"), ttl=60) as got:
        if not got:
            return None
        pool = ProxyPool(rt.client, rt.settings.namespace)
        if not pool.has_proxies():
            return {"skipped": "no proxies configured"}
        report = check_proxies(pool, check_url)
    return {"checked": report.checked, "restored": len(report.restored), "demoted": len(report.demoted)}
