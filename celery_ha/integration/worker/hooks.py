"""Every worker lifecycle hook celery-ha needs, declared in one object and installed in one place.

Each method is one Celery signal receiver; :meth:`WorkerHooks.install` connects them all for the app
it is given (``init_app`` calls it once per app). Celery's signals are process-wide, so each receiver
first checks that the signal is about its app (the sender's ``app``, else the process's current app,
which a worker and its pool children set to the app they run): two apps in one process never run each
other's hooks. A failing hook is logged, never fatal: the lease TTL and the sweep cover whatever a hook
could not do.

- ``celeryd_init``: remember the node name (lease holders are ``node:pid``); refuse to start on a
  state Redis that may evict keys (unless ``CELERY_HA_ALLOW_EVICTION=1``).
- ``beat_init``: warn when the state Redis may evict keys.
- ``worker_process_init`` (pool child): start the lease keeper, registering the child at once.
- ``worker_process_shutdown`` (pool child): send the refill messages still queued, stop the lease
  keeper (no heartbeat after this), leave the worker registry.
- ``worker_ready``: register the task names this node runs; fill the window at once (a namespace a
  pattern matches later gets the same from the consumer step ``discovery.NamespaceDiscovery``).
- ``task_received`` (main process of a worker of several namespaces): remember which namespace a
  message came from.
- ``task_failure``: fast failover when a pool child died, in its message's namespace.
- ``task_unknown``: a message for a task name this worker does not know counts a failed attempt.
- ``worker_shutting_down`` / ``worker_shutdown``: graceful shutdown.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import redis
from celery import signals
from celery._state import get_current_app

from celery_ha.base import tracing
from celery_ha.integration.core.consumed import record_worker_queues
from celery_ha.integration.core.services import namespace_of_queue, served, services, set_node
from celery_ha.integration.dispatch.sender import flush_sends
from celery_ha.integration.patches.child_reaper import FastChildReaper
from celery_ha.integration.running.celery_outcome import quiet_reject_tracebacks
from celery_ha.integration.running.chain import set_recycle_after
from celery_ha.integration.running.lease_keeper import keeper, stop_keeper
from celery_ha.integration.worker.discovery import NamespaceDiscovery, namespace_ready
from celery_ha.integration.worker.failover import on_child_lost
from celery_ha.integration.worker.shutdown import GracefulShutdown
from celery_ha.integration.worker.start_checks import queue_warnings, start_refusal
from celery_ha.integration.worker.startup_report import StartupReport
from celery_ha.integration.worker.unknown_tasks import argument_ids, on_unknown_task
from celery_ha.redisio.memory_policy import eviction_policy, eviction_warning
from celery_ha.state.worker_registry import unregister

log = logging.getLogger(__name__)

#: Messages whose namespace the worker's main process remembers for fast failover (a few per pool
#: process are enough: a message fails while it runs, soon after it was received).
MESSAGE_MEMORY = 10_000


def _logged(hook: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(hook)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as exc:
            log.warning("celery-ha hook %s failed: %s", hook.__name__, exc)

    return run


def recycle_bound(options: dict[str, Any], conf: Any) -> int | None:
    """Tasks a pool process may run before Celery replaces it (``--max-tasks-per-child`` or
    ``worker_max_tasks_per_child``), where Celery does: a prefork pool; None elsewhere (a solo
    process is never replaced, so its chains must not stop for it)."""
    pool = options.get("pool_cls") or getattr(conf, "worker_pool", None) or "prefork"
    if "prefork" not in (pool if isinstance(pool, str) else getattr(pool, "__module__", "")):
        return None
    bound = options.get("max_tasks_per_child") or getattr(conf, "worker_max_tasks_per_child", None)
    return bound if isinstance(bound, int) and bound > 0 else None


class WorkerHooks:
    """The hooks of one Celery app (see the module docstring)."""

    def __init__(self, app: Any, start_check: Callable[[], None] | None = None) -> None:
        self.app = app
        self.shutdown = GracefulShutdown()
        #: Celery message id -> the served namespace of its queue, for the messages this worker took
        #: lately (the newest MESSAGE_MEMORY): fast failover then reads one namespace, not each served.
        self.message_namespaces: OrderedDict[str, str] = OrderedDict()
        #: Called first when a worker or beat of this app starts: ``init_app`` refuses there a
        #: configuration it could not apply (raises SystemExit with one line).
        self.start_check = start_check or (lambda: None)

    def serves(self, sender: Any, kwargs: dict[str, Any]) -> bool:
        """Whether a signal is about this hook's app: its sender's (or the sending worker's) app, else
        the process's current app (pool children and the worker's main process set it)."""
        for holder in (sender, kwargs.get("instance")):
            app = getattr(holder, "app", None)
            if app is not None:
                return app is self.app
        return get_current_app() is self.app

    def _scoped(self, hook: Callable[..., None]) -> Callable[..., None]:
        logged = _logged(hook)

        @functools.wraps(hook)
        def receive(sender: Any = None, **kwargs: Any) -> None:
            if self.serves(sender, kwargs):
                logged(sender=sender, **kwargs)

        return receive

    def install(self) -> WorkerHooks:
        """Connect every hook to the app's signals and add the fast child reaper bootstep."""
        self.app.steps["worker"].add(FastChildReaper)
        self.app.steps["worker"].add(StartupReport)  # after the reaper: the patches' line
        self.app.steps["consumer"].add(NamespaceDiscovery)  # CELERY_HA_NAMESPACES patterns
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
            signal.connect(self._scoped(hook), weak=False)
        return self

    def celeryd_init(self, sender: str | None = None, options: dict[str, Any] | None = None,
                     conf: Any = None, **_: Any) -> None:
        self.start_check()
        self._refuse_bad_start()
        record_worker_queues(options)  # before the fork: a -Q of other queues beats no registry
        set_recycle_after(recycle_bound(options or {}, conf))  # before the fork too
        for warning in queue_warnings(served(), options):
            log.warning("celery-ha: %s", warning)
        if sender:
            set_node(sender)
        quiet_reject_tracebacks()  # before the fork: every pool child inherits it
        if services().settings.namespaces:  # several namespaces: note each message's for failover
            signals.task_received.connect(self._scoped(self.task_received), weak=False,
                                          dispatch_uid=f"celery-ha-received-{id(self)}")
        warning = self._eviction_warning()
        if warning and not services().settings.allow_eviction:
            # SystemExit passes through Celery's signal dispatch: the worker stops before consuming.
            print(f"celery-ha: refusing to start: {warning} (or set CELERY_HA_ALLOW_EVICTION=1)",
                  file=sys.stderr)
            raise SystemExit(2)
        if warning:
            log.warning("%s (CELERY_HA_ALLOW_EVICTION=1: starting anyway)", warning)

    def beat_init(self, **_: Any) -> None:
        self.start_check()
        self._refuse_bad_start()
        warning = self._eviction_warning()
        if warning:
            log.warning(warning)

    def _refuse_bad_start(self) -> None:
        refusal = start_refusal(served())
        if refusal:  # SystemExit passes through Celery's signal dispatch
            print(f"celery-ha: refusing to start: {refusal}", file=sys.stderr)
            raise SystemExit(2)

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
        stop_keeper()  # before leaving the registry: a later heartbeat would register the child again
        tracing.flush()  # the spans a batch processor still buffers
        for rt in served():
            unregister(rt.client, rt.settings.namespace, rt.worker_name)

    def worker_ready(self, **_: Any) -> None:
        for rt in served():  # each namespace this worker serves (CELERY_HA_NAMESPACES)
            namespace_ready(self.app, rt)

    def task_received(self, request: Any = None, **_: Any) -> None:
        info = getattr(request, "delivery_info", None) or {}
        namespace = namespace_of_queue(info.get("routing_key")) if isinstance(info, dict) else None
        if namespace is not None and getattr(request, "id", None):
            self.message_namespaces[request.id] = namespace
            if len(self.message_namespaces) > MESSAGE_MEMORY:
                self.message_namespaces.popitem(last=False)

    def task_failure(self, sender: Any = None, exception: BaseException | None = None, args: Any = None,
                     task_id: str | None = None, **_: Any) -> None:
        namespace = self.message_namespaces.pop(task_id, None) if task_id else None
        # The message's namespace; unknown (taken long ago): each served one, where the others find no
        # lease of the dead child's task.
        for rt in [services(namespace)] if namespace is not None else served():
            on_child_lost(rt, self.app, sender, exception, args)

    def task_unknown(self, name: str = "", id: str = "", message: Any = None, **_: Any) -> None:
        info = getattr(message, "delivery_info", None) or {}
        namespace = namespace_of_queue(info.get("routing_key")) if isinstance(info, dict) else None
        on_unknown_task(services(namespace), self.app, name, id, argument_ids(message))

    def worker_shutting_down(self, **_: Any) -> None:
        self.shutdown.begin(served())

    def worker_shutdown(self, **_: Any) -> None:
        flush_sends()  # a solo or threads pool ran its tasks (and their sender) in this process
        self.shutdown.finish(served())
        tracing.flush()
