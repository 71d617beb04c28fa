"""Maintenance tasks run by beat on the namespace's maintenance queue (each under a short Redis lock).

A worker serving several namespaces runs each job for the namespace whose queue
(``<namespace>.maintenance``) its message came from."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from celery_ha.integration.core.queues import MAINTENANCE, broker_queue
from celery_ha.integration.core.services import discovered, namespace_of_request, serving
from celery_ha.integration.dispatch.pump import pump as pump_window
from celery_ha.integration.upkeep import maintenance

# The queue comes from the app's task_routes (``<namespace>.maintenance``), so no queue option here.
_OPTS: dict[str, Any] = {"ignore_result": True, "acks_late": False, "bind": True}


@shared_task(name="celery_ha.maintenance.sweep", **_OPTS)
def sweep(self: Any) -> dict[str, Any] | None:
    """Reclaim expired leases, promote due retries, re-dispatch lost messages, refill the window."""
    with serving(namespace_of_request(self.request)) as rt:
        return maintenance.sweep(self.app, rt, source="beat")


@shared_task(name="celery_ha.maintenance.pump", **_OPTS)
def pump(self: Any) -> int:
    """Refill the broker window now (also promotes due retries)."""
    with serving(namespace_of_request(self.request)) as rt:
        return pump_window(rt.queue, self.app, rt.settings)


@shared_task(name="celery_ha.maintenance.dead_letters", **_OPTS)
def dead_letters(self: Any) -> dict[str, Any] | None:
    """Log a summary of dead tasks."""
    with serving(namespace_of_request(self.request)) as rt:
        return maintenance.dead_letter_summary(rt)


@shared_task(name="celery_ha.maintenance.proxy_health", **_OPTS)
def proxy_health(self: Any) -> dict[str, Any] | None:
    """Probe proxies that are due, if the proxy pool has proxies and a check URL is set."""
    with serving(namespace_of_request(self.request)) as rt:
        return maintenance.proxy_health(rt)


#: The jobs beat's entries of a namespace pattern fan out (``celery_app/config.py``).
FAN_OUT_JOBS = ("sweep", "dead_letters", "proxy_health")


@shared_task(name="celery_ha.maintenance.fan_out", **_OPTS)
def fan_out(self: Any, job: str) -> int:
    """Send the maintenance ``job`` to every namespace this worker's patterns match now
    (``CELERY_HA_NAMESPACES=crawl-*``): beat's schedule is fixed at its start, the namespaces are not.
    Each runs on its namespace's own maintenance queue, under its own lock. Returns how many."""
    if job not in FAN_OUT_JOBS:
        raise ValueError(f"fan_out: unknown maintenance job {job!r}; one of {', '.join(FAN_OUT_JOBS)}")
    names = discovered(refresh=True)
    for ns in names:
        queue = broker_queue(ns, MAINTENANCE)
        self.app.send_task(f"celery_ha.maintenance.{job}", queue=queue, routing_key=queue)
    return len(names)
