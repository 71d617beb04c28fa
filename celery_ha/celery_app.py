"""The Celery application: ``celery -A celery_ha worker|beat|flower``.

Configuration lives in ``celeryconfig.py`` (repo root, installed as a module). This module wires the
signals that make workers highly available: the node name and lease keeper in pool children,
fast failover and graceful shutdown in the main process.
"""

from __future__ import annotations

import logging
import os
import sys

from celery import Celery, bootsteps, signals

from .errors import ConfigurationError

log = logging.getLogger(__name__)


def _under_celery_cli() -> bool:
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("celery", "celery.exe") or \
        "celery.__main__" in sys.modules


def make_app() -> Celery:
    """Build the app from ``celeryconfig`` (validated now: a bad knob fails here, not later)."""
    celery_app = Celery("celery_ha")
    try:
        import celeryconfig
    except ConfigurationError as exc:
        if _under_celery_cli():
            print(f"celery-ha: configuration error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    celery_app.config_from_object(celeryconfig)
    return celery_app


app = make_app()

#: How often the worker main process checks for dead pool children (Celery's own check is 5 s).
REAP_INTERVAL = 0.25


class FastChildReaper(bootsteps.StartStopStep):
    """Notice a dead pool child within ``REAP_INTERVAL`` instead of up to 5 seconds.

    Celery learns of a dead child from its sentinel pipe, but that pipe can turn readable before
    the kernel lets the child be reaped; the pool then falls back to a 5-second timer. Running the
    same ``maintain_pool`` check more often makes ``WorkerLostError`` (and so our fast failover)
    arrive within a fraction of a second.
    """

    requires = ("celery.worker.components:Hub", "celery.worker.components:Pool")

    def start(self, worker: object) -> None:
        hub = getattr(worker, "hub", None)
        pool = getattr(getattr(worker, "pool", None), "_pool", None)
        maintain = getattr(pool, "maintain_pool", None)
        if hub is not None and callable(maintain):
            hub.call_repeatedly(REAP_INTERVAL, maintain)


app.steps["worker"].add(FastChildReaper)


@signals.celeryd_init.connect
def _remember_node(sender: str | None = None, **_: object) -> None:
    from .runtime import set_node

    if sender:
        set_node(sender)


@signals.worker_process_init.connect
def _child_init(**_: object) -> None:
    """In each pool child, after the fork: start the lease keeper thread (the SIGTERM handler is
    installed per task, because billiard sets its own after this signal)."""
    from .lease_keeper import keeper

    try:
        keeper(app).tick()  # registers the child at once (window sizing, `celery-ha workers`)
    except Exception as exc:
        log.warning("lease keeper start failed (retried on first task): %s", exc)


@signals.worker_process_shutdown.connect
def _child_exit(**_: object) -> None:
    from .runtime import runtime
    from .workers import unregister

    try:
        rt = runtime()
        unregister(rt.client, rt.settings.namespace, rt.worker_name)
    except Exception:
        pass


def _connect_main_process_hooks() -> None:
    from . import failover

    signals.task_failure.connect(failover.on_task_failure, weak=False)
    signals.worker_ready.connect(failover.on_worker_ready, weak=False)
    signals.worker_shutting_down.connect(failover.on_worker_shutting_down, weak=False)
    signals.worker_shutdown.connect(failover.on_worker_shutdown, weak=False)


_connect_main_process_hooks()
