"""Maintenance tasks run by beat on the ``maintenance`` queue (each under a short Redis lock)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from celery_ha import maintenance
from celery_ha.pump import pump_here

_OPTS: dict[str, Any] = {"ignore_result": True, "acks_late": False, "queue": "maintenance"}


@shared_task(name="celery_ha.maintenance.sweep", bind=True, **_OPTS)
def sweep(self: Any) -> dict[str, Any] | None:
    """Reclaim expired leases, promote due retries, re-dispatch lost messages, refill the window."""
    return maintenance.sweep(self.app, source="beat")


@shared_task(name="celery_ha.maintenance.pump", **_OPTS)
def pump() -> int:
    """Refill the broker window now (also promotes due retries)."""
    return pump_here()


@shared_task(name="celery_ha.maintenance.dead_letters", **_OPTS)
def dead_letters() -> dict[str, Any] | None:
    """Log a summary of dead tasks."""
    return maintenance.dead_letter_summary()


@shared_task(name="celery_ha.maintenance.proxy_health", **_OPTS)
def proxy_health() -> dict[str, Any] | None:
    """Probe proxies that are due, if the proxy pool is installed and has proxies."""
    return maintenance.proxy_health()
