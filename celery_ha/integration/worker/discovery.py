"""A worker of namespace patterns (``CELERY_HA_NAMESPACES=crawl-*``) starts serving a matching
namespace while it runs: every ``CELERY_HA_DISCOVERY_INTERVAL`` seconds its consumer reads the
registry of namespaces (``state/namespaces.py``), and for each new match consumes that namespace's
broker queues and gets it ready (:func:`namespace_ready`: task names, broker marker, a full window).

Its queues mirror the worker's own namespace's: every queue ``<own>.<logical>`` the consumer reads
(``crawl``, ``maintenance``, a ``@durable_task(queue=...)`` queue given with ``-Q``) becomes
``<new>.<logical>``, so a crawl-only worker stays crawl-only. The look runs on the consumer's timer,
in the event loop that owns the broker channel (adding a queue from another thread is not safe for
kombu); one ``SMEMBERS`` per look.
A namespace that matched stays served until the worker stops, even if it leaves the registry.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from celery_ha.integration.core.queues import CRAWL, MAINTENANCE, broker_queue
from celery_ha.integration.core.services import Services, discovered, own_services, services
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.pump import pump_quietly
from celery_ha.integration.upkeep.broker_epoch import broker_lost_messages
from celery_ha.state.worker_registry import register_task_names

log = logging.getLogger(__name__)


def namespace_ready(app: Any, rt: Services) -> None:
    """Get one served namespace ready on this worker: register the task names this node runs (so
    ``celery-ha enqueue`` can refuse a misspelt one), plant the broker marker (and re-send at once
    what a broker that came back empty lost), fill the window. One namespace's trouble is logged and
    never keeps the others from starting."""
    try:
        register_task_names(rt.client, rt.settings.namespace, rt.node, list(REGISTRY))
        lost = broker_lost_messages(app, rt)
        if lost:
            log.warning("the broker lost the messages of %r (restarted empty?): re-sending dispatched "
                        "tasks", rt.settings.namespace)
        pump_quietly(app, rt, resend_all=lost)
    except Exception as exc:
        log.warning("celery-ha could not get namespace %r ready: %s", rt.settings.namespace, exc)


def _logical_queues(consumer: Any, own: str) -> list[str]:
    """The logical queues the worker consumes for its own namespace (a crawl-only worker, ``-Q
    shop.crawl``, takes only the crawl queue of a new namespace too); crawl and maintenance when it
    consumes none of its own."""
    names = [q.name for q in consumer.app.amqp.queues.consume_from.values()] \
        if consumer.app.amqp.queues.consume_from else list(consumer.app.amqp.queues)
    logical = [name[len(own) + 1:] for name in names if name.startswith(own + ".")]
    return list(dict.fromkeys(name for name in logical if "." not in name)) or [CRAWL, MAINTENANCE]


class NamespaceDiscovery(bootsteps.StartStopStep):
    """Consumer step: look for namespaces the patterns match at start and then periodically."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.timer_ref: Any = None
        self.consuming: set[str] = set()

    def start(self, c: Any) -> None:
        settings = own_services().settings
        if not settings.namespace_patterns:
            return
        self.look(c)
        self.timer_ref = c.timer.call_repeatedly(settings.discovery_interval, self.look, (c,))

    def stop(self, c: Any) -> None:
        if self.timer_ref is not None:
            self.timer_ref.cancel()
            self.timer_ref = None

    shutdown = stop

    def look(self, c: Any) -> None:
        """Consume the queues of every matching namespace not consumed yet, and get each ready."""
        try:
            names = discovered(refresh=True)
            if not set(names) - self.consuming:
                return
            own = own_services().settings.namespace
            logical = _logical_queues(c, own)
            for ns in names:
                if ns in self.consuming:
                    continue
                for name in logical:
                    queue = broker_queue(ns, name)
                    c.add_task_queue(queue, routing_key=queue)
                self.consuming.add(ns)
                log.info("celery-ha: serving namespace %r (matches CELERY_HA_NAMESPACES=%s)", ns,
                         ",".join(own_services().settings.namespace_patterns))
                namespace_ready(c.app, services(ns))
        except Exception as exc:  # the next look tries again
            log.warning("celery-ha could not look for new namespaces: %s", exc)
