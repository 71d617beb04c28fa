"""The proxy pool's metrics, read in two round trips whatever the number of leases served.

Zone sizes and the pool's lifetime counters (``stats``: ``out_<outcome>`` per release, bans by
kind, refusals, reaped leases) come with one pipeline. Per domain, ``acquire.lua`` counts leases
granted and refusals (``dom``); for the busiest domains a second pipeline reads how many proxies
are at their rate limit for it right now (the cool-down zset ``cd:<domain>``, whose entries say when
a full window reopens) and how many are banned for it (``dban:<domain>``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import redis

from celery_ha.proxy.keys import ProxyKeys
from celery_ha.proxy.outcomes import OUTCOMES

#: Ban counters of ``stats`` -> the kind metrics name. A block bans the proxy for one domain on every
#: blocked release (release.lua), so ``out_blocked`` counts those bans.
BAN_KINDS = {"banned_temporarily": "temporary", "banned_permanently": "permanent",
             "out_blocked": "domain", "banned_manual": "manual"}


@dataclass
class DomainMetrics:
    domain: str
    acquired: int = 0
    refused: int = 0
    rate_limited: int = 0  # proxies whose rate window for the domain is full now
    banned: int = 0  # proxies banned for this domain now (after a block)
    in_use: int = 0  # leases held on it now


@dataclass
class PoolMetrics:
    namespace: str
    zones: dict[str, int]
    counters: dict[str, int]
    domains: list[DomainMetrics] = field(default_factory=list)
    other_domains: int = 0  # domains beyond ``max_domains`` (not listed, to bound label values)

    def releases(self) -> dict[str, int]:
        return {outcome: self.counters.get(f"out_{outcome}", 0) for outcome in OUTCOMES}

    def bans(self) -> dict[str, int]:
        return {kind: self.counters.get(name, 0) for name, kind in BAN_KINDS.items()}

    @property
    def total(self) -> int:
        return sum(v for zone, v in self.zones.items() if zone != "in_use")


def _domain_counts(fields: dict[str, str]) -> dict[str, DomainMetrics]:
    out: dict[str, DomainMetrics] = {}
    for name, value in fields.items():
        kind, _, domain = name.partition(":")
        if kind in ("a", "n") and domain:
            entry = out.setdefault(domain, DomainMetrics(domain))
            if kind == "a":
                entry.acquired += int(value)
            else:
                entry.refused += int(value)
    return out


def read_pool_metrics(client: redis.Redis, namespace: str, max_domains: int = 50) -> PoolMetrics:
    """Zones, counters and the ``max_domains`` busiest domains of one namespace's pool."""
    k = ProxyKeys(namespace)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for zone in (k.available, k.new, k.temp_banned, k.perm_banned, k.in_use):
        pipe.zcard(zone)
    pipe.hgetall(k.stats)
    pipe.hgetall(k.domains)
    pipe.zrange(k.in_use, 0, -1)  # bounded by the leases held at once (the workers' concurrency)
    clock, av, new, tb, pb, iu, stats, dom, leases = pipe.execute()
    now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
    counters = {name: int(v) for name, v in stats.items() if v.lstrip("-").isdigit()}
    domains = _domain_counts(dom)
    held = Counter(member.split("|")[1] for member in leases if member.count("|") >= 2)
    for domain, n in held.items():
        domains.setdefault(domain, DomainMetrics(domain)).in_use = n
    ranked = sorted(domains.values(), key=lambda d: (-(d.acquired + d.refused + d.in_use), d.domain))
    shown = ranked[:max_domains]
    if shown:
        pipe = client.pipeline(transaction=False)
        for d in shown:
            pipe.zcount(f"{k.prefix}cd:{d.domain}", f"({now_ms}", "+inf")
            pipe.zcount(f"{k.prefix}dban:{d.domain}", f"({now_ms}", "+inf")
        replies = pipe.execute()
        for d, limited, banned in zip(shown, replies[0::2], replies[1::2], strict=True):
            d.rate_limited, d.banned = int(limited), int(banned)
    return PoolMetrics(
        namespace=namespace,
        zones={"avail": av, "new": new, "tban": tb, "pban": pb, "in_use": iu},
        counters=counters,
        domains=shown,
        other_domains=max(0, len(ranked) - len(shown)),
    )
