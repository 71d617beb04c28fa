"""One background thread per pool child: renews leases and heartbeats the worker registry.

Started after the fork (``worker_process_init``, or lazily by the first durable task), so no thread
or socket ever crosses a fork, and stopped by ``worker_process_shutdown`` (:func:`stop_keeper`), so
no heartbeat registers a process that has left the registry. Renewal happens every
``CELERY_HA_HEARTBEAT_INTERVAL`` seconds for every lease the process holds, each in its task's
namespace, and the heartbeat goes to the worker registry of every namespace the process serves
whose durable tasks it runs (a worker whose ``-Q`` leaves out their queues is not one of its
workers: ``core/consumed.py``). A renewal that finds the lease gone marks the task's context lost:
its next write raises ``LeaseLost`` and nothing it produces afterwards is committed (the writes are
fenced in Lua anyway; the flag just stops the task early). If renewals keep failing (Redis away, or
an unexpected error) for a whole TTL, the lease is treated as lost too, judged on the local monotonic
clock only.

The thread talks to the state Redis only (whose calls time out, ``services.socket_timeout``), never
to the broker: the sweep watchdog that used to run here runs in a thread of its own
(``integration/upkeep/watchdog.py``), so a hung broker cannot stop renewals. It survives any exception: an
unexpected one is logged with its traceback and the next tick goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import redis

from celery_ha.base.errors import LeaseLost
from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.consumed import runs_durable_tasks
from celery_ha.integration.core.services import Services, own_services, served, socket_timeout
from celery_ha.integration.upkeep.watchdog import stop_watchdog, watch
from celery_ha.state import Lease
from celery_ha.state.worker_registry import heartbeat, quiet_after

log = logging.getLogger(__name__)


class Tracked(Protocol):
    lease: Lease

    def mark_lost(self, reason: str) -> None: ...


class LeaseKeeper:
    """Renews the leases of one process; see the module docstring."""

    def __init__(self, rt: Services) -> None:
        self.rt = rt
        self.interval = rt.settings.heartbeat_interval
        #: id(ctx) -> (ctx, the services of its namespace, when its lease was last renewed)
        self._active: dict[int, tuple[Tracked, Services, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="celery-ha-lease-keeper", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self, timeout: float = 0.0) -> None:
        """Stop renewing; wait up to ``timeout`` seconds for a tick in progress to end (so that its
        heartbeat cannot land after the caller unregistered the process)."""
        self._stop.set()
        if timeout > 0 and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def track(self, ctx: Tracked, rt: Services | None = None) -> None:
        """Renew ``ctx``'s lease from now on, in ``rt``'s namespace (default: the process's own)."""
        with self._lock:
            self._active[id(ctx)] = (ctx, rt or self.rt, time.monotonic())

    def untrack(self, ctx: Tracked) -> None:
        with self._lock:
            self._active.pop(id(ctx), None)

    def held(self) -> list[Tracked]:
        with self._lock:
            return [ctx for ctx, _, _ in self._active.values()]

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # a bug of celery-ha's own: said loudly, and the leases still renewed
                log.exception("lease keeper: unexpected error in a tick (renewals go on)")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def tick(self) -> None:
        """Heartbeat, then renew every lease; a failed heartbeat never keeps the renewals from
        running."""
        own = self.rt.settings
        for rt in self.namespaces():  # the registry of every namespace whose durable tasks it runs
            if not runs_durable_tasks(rt.settings.namespace, own.namespace, own.served_namespaces):
                continue  # -Q leaves its queues out: not one of its workers (core/consumed.py)
            try:
                heartbeat(rt.client, rt.settings.namespace, rt.worker_name,
                          silence_after=quiet_after(rt.settings.heartbeat_interval))
            except redis.RedisError as exc:
                log.warning("worker heartbeat failed: %s", exc)
            except Exception:
                log.exception("worker heartbeat failed unexpectedly (renewals go on)")
        self.renew_all()

    def namespaces(self) -> list[Services]:
        """The services of every namespace this process serves (its own only, if they cannot be had)."""
        try:
            return served()
        except Exception as exc:
            log.warning("lease keeper: the served namespaces are unknown (%s): heartbeat of %r only", exc,
                        self.rt.settings.namespace)
            return [self.rt]

    def renew_all(self) -> None:
        ttl = self.rt.settings.lease_ttl
        with self._lock:
            entries = list(self._active.items())
        for key, (ctx, rt, last_ok) in entries:
            try:
                rt.queue.renew(ctx.lease)
            except LeaseLost:
                with self._lock:  # a task that finished since the snapshot above lost nothing
                    running = self._active.pop(key, None) is not None
                if running:
                    log.warning("lease on task %s lost: stopping its writes", ctx.lease.task_id)
                    ctx.mark_lost("lease lost (reclaimed or taken over)")
                continue
            except Exception as exc:  # Redis away, or a bug: retried until the lease would have expired
                if time.monotonic() - last_ok > ttl:
                    ctx.mark_lost(f"lease could not be renewed for {ttl:.0f}s: {exc}")
                    self.untrack(ctx)
                elif isinstance(exc, redis.RedisError):
                    log.warning("lease renewal for %s failed (will retry): %s", ctx.lease.task_id, exc)
                else:
                    log.exception("lease renewal for %s failed unexpectedly (will retry)", ctx.lease.task_id)
                continue
            with self._lock:
                if key in self._active:
                    self._active[key] = (ctx, rt, time.monotonic())


def _start() -> LeaseKeeper:
    return LeaseKeeper(own_services()).start()


_keeper: PerProcess[LeaseKeeper] = PerProcess(_start, valid=lambda k: k.alive)


def keeper(app: Any) -> LeaseKeeper:
    """This process's running keeper, started on first use (and again after a fork); starts the
    process's sweep watchdog beside it, bound to ``app`` (its sweep sends messages through it)."""
    current = _keeper.get()
    watch(app)
    return current


def stop_keeper() -> None:
    """Stop this process's keeper and watchdog, if they run (``worker_process_shutdown``): waits for
    a tick in progress, so no heartbeat follows. A process that exits holds no lease, so that tick is
    one heartbeat: one call, bounded by the state client's socket timeout."""
    current = _keeper.peek()
    if current is not None:
        current.stop(timeout=socket_timeout(current.rt.settings) + 1.0)
    stop_watchdog()
