"""One background thread per pool child: renews leases, heartbeats the registry, runs the watchdog.

Started after the fork (``worker_process_init``, or lazily by the first durable task), so no thread
or socket ever crosses a fork. Renewal happens every ``CELERY_HA_HEARTBEAT_INTERVAL`` seconds for
every lease the process holds. A renewal that finds the lease gone marks the task's context lost:
its next write raises ``LeaseLost`` and nothing it produces afterwards is committed (the writes are
fenced in Lua anyway; the flag just stops the task early). If renewals keep failing (Redis away)
for a whole TTL, the lease is treated as lost too, judged on the local monotonic clock only.

The watchdog: when beat's last sweep is older than three reclaim intervals, this thread runs the
sweep itself (under the same lock beat uses), so a dead beat does not stop failover.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import redis

from celery_ha.base.errors import LeaseLost
from celery_ha.base.per_process import PerProcess
from celery_ha.integration.maintenance import last_sweep_age, sweep
from celery_ha.integration.services import Services, services
from celery_ha.state import Lease
from celery_ha.state.worker_registry import heartbeat, quiet_after

log = logging.getLogger(__name__)


class Tracked(Protocol):
    lease: Lease

    def mark_lost(self, reason: str) -> None: ...


class LeaseKeeper:
    """Renews the leases of one process; see the module docstring."""

    def __init__(self, rt: Services, app: Any = None) -> None:
        self.rt = rt
        self.app = app
        self.interval = rt.settings.heartbeat_interval
        self._active: dict[int, tuple[Tracked, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next_watchdog = time.monotonic() + rt.settings.reclaim_interval
        self._thread = threading.Thread(target=self._run, name="celery-ha-lease-keeper", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def track(self, ctx: Tracked) -> None:
        with self._lock:
            self._active[id(ctx)] = (ctx, time.monotonic())

    def untrack(self, ctx: Tracked) -> None:
        with self._lock:
            self._active.pop(id(ctx), None)

    def held(self) -> list[Tracked]:
        with self._lock:
            return [ctx for ctx, _ in self._active.values()]

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.tick()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def tick(self) -> None:
        try:
            heartbeat(self.rt.client, self.rt.settings.namespace, self.rt.worker_name,
                      silence_after=quiet_after(self.rt.settings.heartbeat_interval))
        except redis.RedisError as exc:
            log.warning("worker heartbeat failed: %s", exc)
        self.renew_all()
        if time.monotonic() >= self._next_watchdog:
            self._next_watchdog = time.monotonic() + self.rt.settings.reclaim_interval
            self.watchdog()

    def renew_all(self) -> None:
        ttl = self.rt.settings.lease_ttl
        with self._lock:
            entries = list(self._active.items())
        for key, (ctx, last_ok) in entries:
            try:
                self.rt.queue.renew(ctx.lease)
            except LeaseLost:
                with self._lock:  # a task that finished since the snapshot above lost nothing
                    running = self._active.pop(key, None) is not None
                if running:
                    log.warning("lease on task %s lost: stopping its writes", ctx.lease.task_id)
                    ctx.mark_lost("lease lost (reclaimed or taken over)")
                continue
            except redis.RedisError as exc:
                if time.monotonic() - last_ok > ttl:
                    ctx.mark_lost(f"lease could not be renewed for {ttl:.0f}s: {exc}")
                    self.untrack(ctx)
                else:
                    log.warning("lease renewal for %s failed (will retry): %s", ctx.lease.task_id, exc)
                continue
            with self._lock:
                if key in self._active:
                    self._active[key] = (ctx, time.monotonic())

    def watchdog(self) -> None:
        """Run the sweep when beat has not for three reclaim intervals."""
        if self.app is None:
            return  # not bound to an app yet (the first durable task binds it)
        try:
            age = last_sweep_age(self.rt)
            if age > 3 * self.rt.settings.reclaim_interval:
                result = sweep(self.app, self.rt, source="watchdog")
                if result is not None:
                    log.debug("watchdog sweep (beat silent for %.0fs): %s", age, result)
        except Exception as exc:  # the thread must survive anything a sweep throws
            log.warning("watchdog sweep failed: %s", exc)


def _start() -> LeaseKeeper:
    return LeaseKeeper(services()).start()


_keeper: PerProcess[LeaseKeeper] = PerProcess(_start, valid=lambda k: k.alive)


def keeper(app: Any) -> LeaseKeeper:
    """This process's running keeper, started on first use (and again after a fork), bound to
    ``app`` (the watchdog's sweep sends messages through it)."""
    current = _keeper.get()
    current.app = app
    return current
