"""Worker main-process hooks: fast failover when a pool child dies, and graceful shutdown.

Fast failover. When a prefork child is SIGKILLed or OOM-killed, Celery's main process reports the
task with ``task_failure`` / ``WorkerLostError``. The message carried the durable task id; the task
record names the lease holder ``node:pid``. If that holder is a process of this node that is no
longer alive, the lease is released at once (fenced by token and holder, stall counted) and the
pump sends the task again, so it re-runs within about a second instead of after the lease TTL.
A lease another process has since taken is never touched: the holder string would differ.

Graceful shutdown. On SIGTERM Celery stops consuming and waits for running tasks. After
``CELERY_HA_SOFT_SHUTDOWN_TIMEOUT`` seconds the children still holding leases get SIGTERM: the
durable runner commits what it has (keyed, so safe), releases the lease without counting a stall
and returns. At ``worker_shutdown`` any lease still held by a dead child of this node is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import redis

from .processes import pid_alive
from .runtime import Runtime, runtime
from .workers import running_by_worker, unregister

log = logging.getLogger(__name__)


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _split_holder(holder: str) -> tuple[str, int | None]:
    node, _, pid = holder.rpartition(":")
    return node, int(pid) if pid.isdigit() else None


def release_dead_holder(rt: Runtime, task_id: str, count_stall: bool, reason: str) -> str | None:
    """Release ``task_id`` if its lease is held by a dead process of this node; returns the state."""
    try:
        info = rt.queue.get(task_id)
    except Exception:
        return None
    if info.state != "running" or not info.worker:
        return None
    node, pid = _split_holder(info.worker)
    if node != rt.node or pid is None or pid == os.getpid() or pid_alive(pid):
        return None
    return rt.queue.release(task_id, token=info.token, worker=info.worker, count_stall=count_stall,
                            reason=reason)


def on_task_failure(sender: Any = None, task_id: str | None = None, exception: BaseException | None = None,
                    args: Any = None, **_: Any) -> None:
    """``task_failure`` receiver (main process): release the lease of a child that died."""
    from billiard.exceptions import WorkerLostError
    from celery.exceptions import TimeLimitExceeded

    from .durable import is_durable

    if not isinstance(exception, (WorkerLostError, TimeLimitExceeded)) or not is_durable(sender):
        return
    if not args:
        return
    durable_id = str(args[0])
    try:
        rt = runtime()
        state = release_dead_holder(rt, durable_id, count_stall=True,
                                    reason=f"pool child died: {type(exception).__name__}")
        if state is not None:
            log.warning("fast failover: task %s released (%s) after its pool child died", durable_id, state)
            _pump(sender.app, rt)
    except redis.RedisError as exc:
        log.warning("fast failover for %s failed (lease expiry will cover it): %s", durable_id, exc)


def _pump(app: Any, rt: Runtime) -> None:
    from .pump import pump

    try:
        pump(rt.queue, app, rt.settings)
    except Exception as exc:
        log.warning("pump failed: %s", exc)


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Fill the window as soon as a worker is up (queued work need not wait for beat)."""
    app = getattr(sender, "app", None)
    if app is None:
        from .celery_app import app
    with contextlib.suppress(Exception):
        _pump(app, runtime())


def our_held_leases(rt: Runtime) -> dict[str, list[str]]:
    """Running tasks held by processes of this node: holder -> task ids."""
    return {holder: tids for holder, tids in running_by_worker(rt.client, rt.settings.namespace).items()
            if _split_holder(holder)[0] == rt.node}


_shutdown_started = threading.Event()


def on_worker_shutting_down(sig: str = "", how: str = "", **_: Any) -> None:
    """SIGTERM/SIGINT in the main process: after the grace period, stop children holding leases."""
    if _shutdown_started.is_set():
        return
    _shutdown_started.set()
    threading.Thread(target=_stop_children_after_grace, name="celery-ha-graceful", daemon=True).start()


def _stop_children_after_grace() -> None:
    try:
        rt = runtime()
        deadline = time.monotonic() + rt.settings.soft_shutdown_timeout
        me = os.getpid()
        while True:
            held = {holder: tids for holder, tids in our_held_leases(rt).items()
                    if (pid := _split_holder(holder)[1]) is not None and _parent_of(pid) == me}
            if not held:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        for holder, tids in held.items():
            pid = _split_holder(holder)[1]
            if pid is not None and _parent_of(pid) == me:
                log.warning("graceful shutdown: asking child %s to hand back %s", pid, ", ".join(tids))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
    except Exception as exc:
        log.warning("graceful shutdown helper failed: %s", exc)


def on_worker_shutdown(**_: Any) -> None:
    """Last step of the main process: release leases its (now dead) children still hold."""
    try:
        rt = runtime()
        for holder, tids in our_held_leases(rt).items():
            pid = _split_holder(holder)[1]
            if pid is None or pid == os.getpid() or pid_alive(pid):
                continue
            for tid in tids:
                state = release_dead_holder(rt, tid, count_stall=False, reason="worker shut down")
                if state:
                    log.warning("shutdown: released task %s held by %s (%s)", tid, holder, state)
        from .keys import QueueKeys

        mine = [m for m in rt.client.zrange(QueueKeys(rt.settings.namespace).workers, 0, -1)
                if _split_holder(m)[0] == rt.node]
        unregister(rt.client, rt.settings.namespace, *mine)
    except Exception as exc:
        log.warning("shutdown lease release failed: %s", exc)
