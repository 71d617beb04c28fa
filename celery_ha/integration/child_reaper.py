"""A worker bootstep that notices a dead pool child within ``REAP_INTERVAL`` instead of 5 seconds.

Celery learns of a dead child from its sentinel pipe, but that pipe can turn readable before the
kernel lets the child be reaped; the pool then falls back to a 5-second timer. Running the same
``maintain_pool`` check more often makes ``WorkerLostError`` (and so fast failover) arrive within a
fraction of a second.
"""

from __future__ import annotations

from celery import bootsteps

#: How often the worker main process checks for dead pool children (Celery's own check is 5 s).
REAP_INTERVAL = 0.25


class FastChildReaper(bootsteps.StartStopStep):
    """See the module docstring."""

    requires = ("celery.worker.components:Hub", "celery.worker.components:Pool")

    def start(self, worker: object) -> None:
        hub = getattr(worker, "hub", None)
        pool = getattr(getattr(worker, "pool", None), "_pool", None)
        maintain = getattr(pool, "maintain_pool", None)
        if hub is not None and callable(maintain):
            hub.call_repeatedly(REAP_INTERVAL, maintain)
