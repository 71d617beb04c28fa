"""The sweep watchdog: a pool process runs the maintenance sweep itself when beat has gone quiet.

When beat's last sweep is older than three reclaim intervals, this thread runs the sweep (under the
same lock beat uses, so two watchdogs or a watchdog and a late beat are harmless), so a dead beat
does not stop failover. It has a thread of its own, apart from the lease keeper, because a sweep
talks to the broker (it re-sends lost messages, reads the broker lists, checks the broker marker):
a broker that hangs may hold a sweep for a few broker timeouts, and must never hold the renewal of
the leases of every task the process runs.

Started after the fork by the first :func:`watch` of a process (``worker_process_init``, or the first
durable task), like the lease keeper, and stopped with it (:func:`stop_watchdog`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.services import Services, own_services, served
from celery_ha.integration.upkeep.maintenance import last_sweep_age, sweep

log = logging.getLogger(__name__)


class SweepWatchdog:
    """Checks every reclaim interval whether beat still sweeps; sweeps itself when it does not."""

    def __init__(self, rt: Services) -> None:
        self.rt = rt
        self.app: Any = None  # bound by watch(); nothing to send messages through before that
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="celery-ha-watchdog", daemon=True)

    def start(self) -> SweepWatchdog:
        self._thread.start()
        return self

    def stop(self, timeout: float = 0.0) -> None:
        """Stop the thread; wait up to ``timeout`` seconds for a sweep in progress to end."""
        self._stop.set()
        if timeout > 0 and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        interval = self.rt.settings.reclaim_interval
        while not self._stop.wait(interval):
            self.check()

    def check(self) -> None:
        """Run the sweep when beat has not for three reclaim intervals. Never raises: the thread
        must outlive anything a sweep throws (the next check tries again)."""
        if self.app is None:
            return
        try:
            namespaces = served()
        except Exception as exc:
            log.warning("watchdog: the served namespaces are unknown (the next check tries again): %s", exc)
            return
        for rt in namespaces:  # each namespace this process serves has its own sweep
            try:
                age = last_sweep_age(rt)
                if age > 3 * rt.settings.reclaim_interval:
                    result = sweep(self.app, rt, source="watchdog")
                    if result is not None:
                        log.debug("watchdog sweep of %r (beat silent for %.0fs): %s", rt.settings.namespace,
                                  age, result)
            except Exception as exc:
                log.warning("watchdog sweep of %r failed (the next check tries again): %s",
                            rt.settings.namespace, exc)


def _start() -> SweepWatchdog:
    return SweepWatchdog(own_services()).start()


_watchdog: PerProcess[SweepWatchdog] = PerProcess(_start, valid=lambda w: w.alive)


def watch(app: Any) -> SweepWatchdog:
    """This process's running watchdog, started on first use (and again after a fork), bound to
    ``app`` (its sweep sends messages through it)."""
    current = _watchdog.get()
    current.app = app
    return current


def stop_watchdog(timeout: float = 0.0) -> None:
    """Stop this process's watchdog if one runs (process shutdown); never starts one."""
    current = _watchdog.peek()
    if current is not None:
        current.stop(timeout)
