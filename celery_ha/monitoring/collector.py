"""The Prometheus collector: every sample is computed from Redis at scrape time.

Nothing is kept between scrapes (run as many ``celery-ha web`` processes as you like: they report the
same numbers), and no Celery event is needed: the task layer's transition scripts count events and
histogram buckets themselves, so standalone ``claim_next`` workers and Celery workers both count. A
scrape costs a fixed number of Redis round trips whatever the number of tasks
(:mod:`celery_ha.state.metrics`, :mod:`celery_ha.proxy.metrics`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from celery_ha.base.masking import mask_url
from celery_ha.monitoring.broker_depth import BrokerDepth
from celery_ha.proxy.metrics import PoolMetrics, read_pool_metrics
from celery_ha.state.metrics import Histogram, QueueMetrics, read_queue_metrics

log = logging.getLogger(__name__)

#: Prometheus bucket bounds (seconds) of both histograms: all on the scripts' grid, so exact.
BUCKETS_SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                   300.0, 600.0, 1800.0, 3600.0]
STATES = ("queued", "dispatched", "running", "delayed", "completed", "dead")


@dataclass
class Source:
    """Where a scrape reads from: the state Redis, the namespace, the broker (None: not Redis)."""

    client: redis.Redis
    namespace: str
    worker_max_age: float
    broker: BrokerDepth | None = None
    max_domains: int = 50


def _histogram(name: str, doc: str, ns: str, per_task: dict[str, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["namespace", "task"])
    for task, hist in sorted(per_task.items()):
        buckets = [("+Inf" if le == float("inf") else repr(le), n)
                   for le, n in hist.cumulative(BUCKETS_SECONDS)]
        family.add_metric([ns, task], buckets, hist.estimated_sum_seconds())
    return family


def queue_families(m: QueueMetrics, worker_max_age: float) -> Iterator[Metric]:
    ns = m.namespace
    tasks = GaugeMetricFamily("celery_ha_tasks", "Tasks per state now (completed: lifetime count), "
                              "as TaskQueue.stats()", labels=["namespace", "state"])
    for state in STATES:
        tasks.add_metric([ns, state], m.states[state])
    yield tasks
    events = CounterMetricFamily("celery_ha_task_events", "Task transitions counted by the scripts",
                                 labels=["namespace", "event"])
    for event, n in m.events().items():
        events.add_metric([ns, event], n)
    yield events
    yield _histogram("celery_ha_task_wait_seconds", "Wait from ready (enqueued, retry due, handed back) "
                     "to claim, Redis clock; _sum estimated from 12-per-decade buckets", ns,
                     m.histograms["wait"])
    yield _histogram("celery_ha_task_runtime_seconds", "Runtime from claim to completion, Redis clock; "
                     "_sum estimated from 12-per-decade buckets", ns, m.histograms["runtime"])
    items = GaugeMetricFamily("celery_ha_items", "Items stored in the sink", labels=["namespace"])
    items.add_metric([ns], m.items)
    yield items
    for name, doc, field_ in (("celery_ha_items_committed", "New items committed", "items"),
                              ("celery_ha_items_duplicate", "Re-emitted items absorbed by the sink",
                               "items_duplicate")):
        family = CounterMetricFamily(name, doc, labels=["namespace"])
        family.add_metric([ns], m.counters.get(field_, 0))
        yield family
    for name, doc, since in (
            ("celery_ha_oldest_queued_seconds", "Age of the longest-waiting queued task (0: none)",
             m.oldest_ready_ms),
            ("celery_ha_oldest_dispatched_seconds", "Age of the oldest dispatched, unclaimed task",
             m.oldest_dispatched_ms)):
        family = GaugeMetricFamily(name, doc, labels=["namespace"])
        family.add_metric([ns], max(0.0, (m.now_ms - since) / 1000) if since is not None else 0.0)
        yield family
    hosts = GaugeMetricFamily("celery_ha_hosts", "Hosts of the host gate with queued tasks: eligible now, "
                              "waiting for a time (pacing, a block), parked until an event (a free slot, "
                              "a claim, more budget)", labels=["namespace", "zone"])
    for zone, n in m.hosts.items():
        hosts.add_metric([ns, zone], n)
    yield hosts
    refetch = GaugeMetricFamily("celery_ha_refetch", "Completed tasks waiting for their scheduled refetch: "
                                "all of them, and those due now (queued at the next sweep)",
                                labels=["namespace", "kind"])
    for kind, n in m.refetch.items():
        refetch.add_metric([ns, kind], n)
    yield refetch
    alive = GaugeMetricFamily("celery_ha_workers_alive", "Pool processes that heart-beat within the "
                              "lease TTL", labels=["namespace"])
    alive.add_metric([ns], len(m.alive_workers(worker_max_age)))
    yield alive


def pool_families(p: PoolMetrics) -> Iterator[Metric]:
    ns = p.namespace
    zones = GaugeMetricFamily("celery_ha_proxies", "Proxies per zone (in_use: leases held)",
                              labels=["namespace", "zone"])
    for zone, n in p.zones.items():
        zones.add_metric([ns, zone], n)
    yield zones
    for name, doc, label, values in (
            ("celery_ha_proxy_releases", "Proxy leases returned, by outcome", "outcome", p.releases()),
            ("celery_ha_proxy_bans", "Proxy bans, by kind (domain: after a block, for one domain)",
             "kind", p.bans())):
        family = CounterMetricFamily(name, doc, labels=["namespace", label])
        for key, n in values.items():
            family.add_metric([ns, key], n)
        yield family
    for name, doc, field_ in (
            ("celery_ha_proxy_refusals", "Acquires that found no usable proxy", "no_proxy"),
            ("celery_ha_proxy_reaped", "Proxy leases of borrowers that died (reaped)", "reaped"),
            ("celery_ha_proxy_expired", "Proxies that left the pool at their provider lifetime", "expired")):
        family = CounterMetricFamily(name, doc, labels=["namespace"])
        family.add_metric([ns], p.counters.get(field_, 0))
        yield family
    labels = ["namespace", "domain"]
    acquired = CounterMetricFamily("celery_ha_proxy_domain_acquires", "Leases granted per domain",
                                   labels=labels)
    refused = CounterMetricFamily("celery_ha_proxy_domain_refusals", "Refusals per domain", labels=labels)
    limited = GaugeMetricFamily("celery_ha_proxy_domain_rate_limited",
                                "Proxies whose rate window for the domain is full now", labels=labels)
    ratio = GaugeMetricFamily("celery_ha_proxy_domain_rate_limited_ratio",
                              "Share of available proxies at their rate limit for the domain", labels=labels)
    banned = GaugeMetricFamily("celery_ha_proxy_domain_banned", "Proxies banned for the domain now",
                               labels=labels)
    in_use = GaugeMetricFamily("celery_ha_proxy_domain_in_use", "Leases held on the domain now",
                               labels=labels)
    for d in p.domains:
        key = [ns, d.domain]
        acquired.add_metric(key, d.acquired)
        refused.add_metric(key, d.refused)
        limited.add_metric(key, d.rate_limited)
        ratio.add_metric(key, d.rate_limited / p.zones["avail"] if p.zones["avail"] else 0.0)
        banned.add_metric(key, d.banned)
        in_use.add_metric(key, d.in_use)
    yield from (acquired, refused, limited, ratio, banned, in_use)


class StateCollector(Collector):
    """A custom collector: ``collect()`` reads Redis each time it is called (each scrape), for every
    namespace served; each metric is one family whose samples carry the namespace label."""

    def __init__(self, sources: Source | Sequence[Source],
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.sources = [sources] if isinstance(sources, Source) else list(sources)
        self._now = now

    def describe(self) -> list[Metric]:
        return []  # no Redis read when the registry registers the collector

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("celery_ha_up", "1 when this scrape could read the state Redis",
                               labels=["namespace"])
        took = GaugeMetricFamily("celery_ha_scrape_duration_seconds", "Time this scrape spent reading Redis",
                                 labels=["namespace"])
        merged: dict[str, Metric] = {}  # one family per name, samples of every namespace in it
        for s in self.sources:
            started = self._now()
            try:
                families = self._read(s)
            except redis.RedisError as exc:
                log.warning("scrape of namespace %s failed: %s", s.namespace, mask_url(str(exc)))
                up.add_metric([s.namespace], 0)
                continue
            up.add_metric([s.namespace], 1)
            for family in families:
                kept = merged.setdefault(family.name, family)
                if kept is not family:
                    kept.samples.extend(family.samples)
            took.add_metric([s.namespace], self._now() - started)
        yield up
        yield from merged.values()
        if took.samples:
            yield took

    @staticmethod
    def _read(s: Source) -> list[Metric]:
        families = [*queue_families(read_queue_metrics(s.client, s.namespace), s.worker_max_age),
                    *pool_families(read_pool_metrics(s.client, s.namespace, s.max_domains))]
        if s.broker is not None:
            depth = GaugeMetricFamily("celery_ha_broker_messages", "Messages waiting in the broker, "
                                      "all priority lists counted", labels=["queue"])
            for queue, n in s.broker.read().items():
                depth.add_metric([queue], n)
            families.append(depth)
        return families
