"""Every worker lifecycle hook celery-ha needs, declared in one object and installed in one place.

Each method is one Celery signal receiver; :meth:`WorkerHooks.install` connects them all to the app
it is given (the composition root calls it once). A failing hook is logged, never fatal: the lease
TTL and the sweep cover whatever a hook could not do.

- ``celeryd_init``: remember the node name (lease holders are ``node:pid``); refuse to start on a
  state Redis that may evict keys (unless ``CELERY_HA_ALLOW_EVICTION=1``).
- ``beat_init``: warn when the state Redis may evict keys.
- ``worker_process_init`` (pool child): start the lease keeper, registering the child at once.
- ``worker_process_shutdown`` (pool child): send the refill messages still queued, leave the
  worker registry.
- ``worker_ready``: register the task names this node runs; fill the window at once.
- ``task_failure``: fast failover when a pool child died.
- ``task_unknown``: a message for a task name this worker does not know counts a failed attempt.
- ``worker_shutting_down`` / ``worker_shutdown``: graceful shutdown.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import redis
from celery import signals

from celery_ha.integration.broker_epoch import broker_lost_messages
from celery_ha.integration.celery_outcome import quiet_reject_tracebacks
from celery_ha.integration.child_reaper import FastChildReaper
from celery_ha.integration.failover import on_child_lost
from celery_ha.integration.lease_keeper import keeper
from celery_ha.integration.pump import pump_quietly
from celery_ha.integration.sender import flush_sends
from celery_ha.integration.services import services, set_node
from celery_ha.integration.shutdown import GracefulShutdown
from celery_ha.integration.task_spec import REGISTRY
from celery_ha.integration.unknown_tasks import on_unknown_task
from celery_ha.redisio.memory_policy import eviction_policy, eviction_warning
from celery_ha.state.worker_registry import register_task_names, unregister

log = logging.getLogger(__name__)


def _logged(hook: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as exc:
            log.warning("celery-ha hook %s failed: %s", hook.__name__, exc)

    return run


class WorkerHooks:
    """The hooks of one Celery app (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.shutdown = GracefulShutdown()

    def install(self) -> WorkerHooks:
        """Connect every hook to the app's signals and add the fast child reaper bootstep."""
        self.app.steps["worker"].add(FastChildReaper)
        for signal, hook in (
            (signals.celeryd_init, self.celeryd_init),
            (signals.beat_init, self.beat_init),
            (signals.worker_process_init, self.worker_process_init),
            (signals.worker_process_shutdown, self.worker_process_shutdown),
            (signals.worker_ready, self.worker_ready),
            (signals.task_failure, self.task_failure),
            (signals.task_unknown, self.task_unknown),
            (signals.worker_shutting_down, self.worker_shutting_down),
            (signals.worker_shutdown, self.worker_shutdown),
        ):
            signal.connect(_logged(hook), weak=False)
        return self

    def celeryd_init(self, sender: str | None = None, **_: Any) -> None:
        if sender:
            set_node(sender)
        quiet_reject_tracebacks()  # before the fork: every pool child inherits it
        warning = self._eviction_warning()
        if warning and not services().settings.allow_eviction:
            # SystemExit passes through Celery's signal dispatch: the worker stops before consuming.
            print(f"celery-ha: refusing to start: {warning} (or set CELERY_HA_ALLOW_EVICTION=1)",
                  file=sys.stderr)
            raise SystemExit(2)
        if warning:
            log.warning("%s (CELERY_HA_ALLOW_EVICTION=1: starting anyway)", warning)

    def beat_init(self, **_: Any) -> None:
        warning = self._eviction_warning()
        if warning:
            log.warning(warning)

    def _eviction_warning(self) -> str | None:
        try:
            return eviction_warning(eviction_policy(services().client))
        except redis.RedisError as exc:  # unreachable now: the worker's own retries will say so
            log.warning("could not read the state Redis' maxmemory-policy: %s", exc)
            return None

    def worker_process_init(self, **_: Any) -> None:
        # The keeper thread starts after the fork; its first tick registers this child (window
        # sizing, `celery-ha workers`). The SIGTERM handler is installed per task instead, because
        # billiard sets its own after this signal.
        keeper(self.app).tick()

    def worker_process_shutdown(self, **_: Any) -> None:
        flush_sends()  # the refill messages still queued in this child go out before it exits
        rt = services()
        unregister(rt.client, rt.settings.namespace, rt.worker_name)

    def worker_ready(self, **_: Any) -> None:
        rt = services()
        # What this node can run, so `celery-ha enqueue` can refuse a misspelt task name.
        register_task_names(rt.client, rt.settings.namespace, rt.node, list(REGISTRY))
        # Plants the broker marker before any message of this worker's era can be lost, and
        # re-sends at once what a broker that came back empty while no worker ran has lost.
        lost = broker_lost_messages(self.app, rt)
        if lost:
            log.warning("the broker lost its messages (restarted empty?): re-sending dispatched tasks")
        pump_quietly(self.app, rt, redispatch_after=0 if lost else None)

    def task_failure(self, sender: Any = None, exception: BaseException | None = None, args: Any = None,
                     **_: Any) -> None:
        on_child_lost(services(), self.app, sender, exception, args)

    def task_unknown(self, name: str = "", id: str = "", **_: Any) -> None:
        on_unknown_task(services(), self.app, name, id)

    def worker_shutting_down(self, **_: Any) -> None:
        self.shutdown.begin(services())

    def worker_shutdown(self, **_: Any) -> None:
        flush_sends()  # a solo or threads pool ran its tasks (and their sender) in this process
        self.shutdown.finish(services())
