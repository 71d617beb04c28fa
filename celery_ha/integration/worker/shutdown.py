"""Graceful shutdown of a worker: tasks finish or are handed back, leases of dead children released.

On SIGTERM Celery stops consuming and waits for running tasks. After
``CELERY_HA_SOFT_SHUTDOWN_TIMEOUT`` seconds the children still holding leases get SIGTERM, and so does
any child that takes a lease later (a batch's next id), until the worker exits: the durable runner
commits what it has (keyed, so safe), releases the lease without counting a stall and returns
(``celery_ha.integration.running.graceful_stop``). At ``worker_shutdown`` any lease still held by a
dead child of this node is released, and this node's registry entries are removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

from celery_ha.base.procfs import parent_pid
from celery_ha.integration.core.services import Services
from celery_ha.integration.worker.failover import holder_is_dead_here, our_held_leases, release_dead_holder
from celery_ha.state.keys import QueueKeys
from celery_ha.state.worker_registry import split_worker, unregister

log = logging.getLogger(__name__)


class GracefulShutdown:
    """The main process's side of a shutdown; one per worker process."""

    def __init__(self) -> None:
        self._started = threading.Event()

    def begin(self, namespaces: list[Services]) -> None:
        """SIGTERM/SIGINT seen: after the grace period, stop children that still hold leases (in any
        of the ``namespaces`` the worker serves)."""
        if self._started.is_set():
            return
        self._started.set()
        threading.Thread(target=self._stop_children_after_grace, args=(namespaces,),
                         name="celery-ha-graceful", daemon=True).start()

    def _children_holding(self, namespaces: list[Services]) -> dict[str, list[str]]:
        me = os.getpid()
        held: dict[str, list[str]] = {}
        for rt in namespaces:
            for holder, tids in our_held_leases(rt).items():
                if (pid := split_worker(holder)[1]) is not None and parent_pid(pid) == me:
                    held.setdefault(holder, []).extend(tids)
        return held

    def _stop_children_after_grace(self, namespaces: list[Services]) -> None:
        """From the end of the grace period until the process exits, ask each child that holds a
        lease to hand it back, once per task it holds. It keeps looking: a batch's child may take its
        next id's lease after a look that found none, and a look that fails (Redis away a moment) is
        followed by the next."""
        time.sleep(max(0.0, namespaces[0].settings.soft_shutdown_timeout))
        asked: set[tuple[str, str]] = set()  # (holder, task id) already asked to hand back
        while True:
            try:
                for holder, tids in self._children_holding(namespaces).items():
                    new = [tid for tid in tids if (holder, tid) not in asked]
                    pid = split_worker(holder)[1]
                    if not new or pid is None:
                        continue
                    asked.update((holder, tid) for tid in new)
                    log.warning("graceful shutdown: asking child %s to hand back %s", pid, ", ".join(new))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
            except Exception as exc:  # the next look tries again
                log.warning("graceful shutdown: could not read the leases of this worker's children: %s",
                            exc)
            time.sleep(0.2)

    def finish(self, namespaces: list[Services]) -> None:
        """Last step of the main process: release leases its (now dead) children still hold, in each of
        the ``namespaces`` it serves."""
        for rt in namespaces:
            self._finish(rt)

    def _finish(self, rt: Services) -> None:
        try:
            for holder, tids in our_held_leases(rt).items():
                if not holder_is_dead_here(rt, holder):
                    continue
                for tid in tids:
                    state = release_dead_holder(rt, tid, count_stall=False, reason="worker shut down")
                    if state:
                        log.warning("shutdown: released task %s held by %s (%s)", tid, holder, state)
            mine = [m for m in rt.client.zrange(QueueKeys(rt.settings.namespace).workers, 0, -1)
                    if split_worker(m)[0] == rt.node]
            unregister(rt.client, rt.settings.namespace, *mine)
        except Exception as exc:
            log.warning("shutdown lease release failed: %s", exc)
