"""A worker bootstep that notices a dead pool child within ``REAP_INTERVAL`` instead of 5 seconds.

Celery learns of a dead child from its sentinel pipe, but that pipe can turn readable before the
kernel lets the child be reaped; the pool then falls back to a 5-second timer. Running the same
``maintain_pool`` check more often makes ``WorkerLostError`` (and so fast failover) arrive within a
fraction of a second.

``maintain_pool`` is an internal of billiard's pool (``worker.pool._pool``), driven from the
worker's event loop (``worker.hub``). A prefork pool without it leaves the 5-second timer, with one
WARNING; a pool without child processes (solo, threads) or without an event loop (billiard then
supervises its children itself) has nothing to patch. It is the last patch to decide, in the
worker's main process: the start-up line (``integration/worker/startup_report.py``) is a step
that requires this one.
"""

from __future__ import annotations

import logging

from celery import bootsteps

from celery_ha.integration.patches import registry

log = logging.getLogger(__name__)

#: The releases this patch was verified on.
VERIFIED = "celery 5.6.3-5.7.0, billiard 4.2.1-4.3.2"

#: How often the worker main process checks for dead pool children (Celery's own check is 5 s).
REAP_INTERVAL = 0.25


class FastChildReaper(bootsteps.StartStopStep):
    """See the module docstring."""

    requires = ("celery.worker.components:Hub", "celery.worker.components:Pool")

    def start(self, worker: object) -> None:
        self.decide(worker)

    @staticmethod
    def decide(worker: object) -> bool:
        """Schedule ``maintain_pool`` on the worker's event loop when both are there; returns whether
        the patch is on."""
        hub = getattr(worker, "hub", None)
        task_pool = getattr(worker, "pool", None)
        pool = getattr(task_pool, "_pool", None)
        maintain = getattr(pool, "maintain_pool", None)
        if hub is not None and callable(maintain):
            hub.call_repeatedly(REAP_INTERVAL, maintain)
            registry.applied("child_reaper", VERIFIED)
            return True
        kind = type(task_pool).__module__ if task_pool is not None else "no"
        if not kind.endswith(".prefork"):
            registry.not_needed("child_reaper", VERIFIED, "a pool without child processes")
        elif hub is None:
            registry.not_needed("child_reaper", VERIFIED, "no event loop: billiard supervises its children")
        else:
            registry.switched_off(
                "child_reaper", VERIFIED,
                f"{registry.installed('billiard', 'celery')}: the prefork pool has no "
                f"{'maintain_pool' if pool is not None else '_pool'}: a dead pool child is noticed "
                "after up to 5 s, so fast failover waits that long")
        return False
