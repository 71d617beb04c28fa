"""The pump: keep at most ``window`` task messages in the broker, the backlog stays in Redis.

``q.dispatch`` moves up to ``window - dispatched`` tasks ready -> dispatched in one Lua step (and
promotes due retries, and hands back dispatched tasks nobody claimed within ``redispatch_after``);
the pump then sends exactly one Celery message per returned id, on the namespace's broker queue.
Messages carry only the task id.

Called after every task failure or hand-back, by the failover handler, by beat's sweep and by the
worker watchdog. With the host gate on, a paced or blocked host becomes eligible at a time no event
marks, so each process keeps one timer per namespace armed for the earliest such time (:func:`arm_host_timer`,
after every pump and every completion) that pumps then. A completion refills the window in its own
script (``complete_dispatch.lua``, the same fill as ``dispatch.lua``) and only sends what that
returned (``integration/dispatch/sender.py``). Safe to call from many processes at once: dispatch is atomic,
and a duplicate message is dropped by the claim.

A namespace that ``celery-ha migrate`` moved away (or is moving) is pumped no more, read with the
pause flag (:func:`celery_ha.state.migrate_marks.pump_marks`): its tasks run in the target, and every
message of the source would be dropped by its claim, so a worker still serving it by name would
otherwise re-send its dispatched tasks every ``CELERY_HA_REDISPATCH_AFTER`` only to drop them again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from typing import Any

from celery_ha.base.per_process import PerProcess
from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import broker_queue
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import logical_queue
from celery_ha.integration.dispatch.broker import waiting_ids
from celery_ha.integration.dispatch.publisher import HeldProducer, batch_time_limits, publish_ids
from celery_ha.state import Dispatched, TaskQueue
from celery_ha.state.list_push import message_priority
from celery_ha.state.migrate_marks import pump_marks
from celery_ha.state.worker_registry import alive_count

log = logging.getLogger(__name__)


def celery_priority(priority: int) -> int:
    """Map a queue priority (-1000..1000, higher runs first) to a Redis-broker priority (0..9,
    0 runs first). Queue priority 0 maps to 3; 3 and above to 0; -6 and below to 9: the same
    mapping a completion script's own push uses (``state/list_push.py``)."""
    return message_priority(priority)


class _WindowCache:
    """The live-worker count behind the window and the namespace's pause flag and migration marks,
    read at most once per heartbeat interval per process: the pump runs after every task, and reading
    them each time cost three round trips per task for figures that change only when workers come or
    go, or when an operator pauses or migrates the crawl."""

    def __init__(self) -> None:
        self.alive = 0
        self.paused = False
        self.moved: str | None = None  # where a migration moved (or is moving) the namespace's tasks
        self.gated = False  # the namespace's host gate is on (read with the rest)
        self.until = 0.0

    def refresh(self, q: TaskQueue, settings: Settings) -> _WindowCache:
        now = time.monotonic()
        if now >= self.until:
            self.paused, moved = pump_marks(q.client, q.namespace)
            if moved is not None and self.moved is None:
                log.warning("namespace %r was migrated to %r (celery-ha migrate): nothing of it is "
                            "dispatched or sent again here; serve %r instead", q.namespace, moved, moved)
            self.moved = moved
            self.gated = q.host_gate or q.hosts.enabled()
            self.alive = 0 if settings.window > 0 else alive_count(
                q.client, q.namespace, max_age=max(settings.lease_ttl, 3 * settings.heartbeat_interval))
            self.until = now + settings.heartbeat_interval
        return self


# One cache per namespace (and client) a process serves: a worker of several namespaces
# (CELERY_HA_NAMESPACES) alternates between them task by task.
_windows: PerProcess[dict[tuple[str, int], _WindowCache]] = PerProcess(dict)


def _window(q: TaskQueue) -> _WindowCache:
    caches = _windows.get()
    key = (q.namespace, id(q.client))
    cache = caches.get(key)
    if cache is None:
        cache = caches.setdefault(key, _WindowCache())
    return cache


def effective_window(q: TaskQueue, settings: Settings) -> int:
    """0 while the namespace is paused; else ``CELERY_HA_WINDOW``, else 2 x the concurrency of the
    live workers (at least 2) x the largest ``CELERY_HA_BATCH``, so every pool process has a
    second message waiting behind the one it runs."""
    current = _window(q).refresh(q, settings)
    if current.paused or current.moved is not None:
        return 0
    if settings.window > 0:
        return settings.window
    return max(2, 2 * current.alive) * settings.largest_batch


def moved_away(q: TaskQueue, settings: Settings) -> bool:
    """Whether a migration moved ``q``'s namespace away, or is moving it (as this process last read
    it, once per heartbeat interval, with the window): nothing of it is dispatched or sent."""
    return _window(q).refresh(q, settings).moved is not None


def message_id(task_id: str) -> str:
    """Celery message id: the durable task id plus a nonce (Flower shows which task it carries)."""
    return f"{task_id}.{secrets.token_hex(4)}"


def send(app: Any, namespace: str, batch: list[Dispatched], settings: Settings | None = None,
         held: HeldProducer | None = None) -> int:
    """Send the Celery messages for the dispatched tasks: one per task, or with ``CELERY_HA_BATCH``
    up to that many ids of one task name and priority per message. A re-sent task whose earlier
    message is still waiting in the broker is skipped; only then are the broker lists read (fresh
    tasks have none). ``held``: a producer the caller keeps across calls (else one is taken from the
    app's pool for this call). Returns how many task ids were sent."""
    queue_of = {d.task: broker_queue(namespace, logical_queue(d.task)) for d in batch}
    resent = {queue_of[d.task] for d in batch if d.resent}
    waiting = (waiting_ids(app, resent) or set()) if resent else set()
    groups: dict[tuple[str, int], list[str]] = {}
    for d in batch:
        if d.resent and d.task_id in waiting:
            continue
        groups.setdefault((d.task, celery_priority(d.priority)), []).append(d.task_id)
    if not groups:
        return 0
    sent = 0
    with contextlib.nullcontext(held.get(app)) if held else app.producer_or_acquire() as producer:
        for (task, priority), ids in groups.items():
            queue = queue_of[task]
            declare = held.declare(queue) if held else None
            size = settings.batch_size(task) if settings is not None else 1
            for start in range(0, len(ids), size):
                chunk = ids[start:start + size]
                publish_ids(app, task, chunk, queue=queue, priority=priority, message_id=message_id(chunk[0]),
                            producer=producer, declare=declare,
                            limits=batch_time_limits(app, task, len(chunk), settings))
                sent += len(chunk)
    return sent


def pump(q: TaskQueue, app: Any, settings: Settings, window: int | None = None,
         redispatch_after: float | None = None) -> int:
    """Dispatch up to the window and send the messages; returns how many were sent.

    ``redispatch_after`` overrides ``CELERY_HA_REDISPATCH_AFTER`` (one call re-sends at most
    STALE_PER_CALL stale tasks per shard: :func:`resend_dispatched` re-sends them all). Nothing for a
    namespace a migration moved away (see the module docstring)."""
    if moved_away(q, settings):
        return 0
    size = window if window is not None else effective_window(q, settings)
    after = settings.redispatch_after if redispatch_after is None else redispatch_after
    batch = q.dispatch(size, redispatch_after=after)
    sent = send(app, q.namespace, batch, settings)
    if batch:
        log.debug("pump: window %d, dispatched %d, sent %d", size, len(batch), sent)
    return sent


#: Most stale dispatched tasks one dispatch script re-stamps per shard (``_dispatch.lua``'s LIMIT).
STALE_PER_CALL = 1000


def resend_dispatched(q: TaskQueue, app: Any, settings: Settings, rounds: int = 100) -> int:
    """Send again every dispatched task whose message is not waiting in the broker (the broker lost
    its messages; a worker died with messages reserved), and fill the window; returns how many were
    sent. One dispatch call re-stamps at most STALE_PER_CALL stale tasks per shard, so this calls
    again while a call found that many. A later call takes only tasks dispatched before the first
    call began, give or take the longest dispatch: a shard's script may run that much later than the
    clock read here, so the margin covers it (a task re-stamped in an earlier call and taken again
    gets one more message, which the claim drops); past ``rounds`` calls the redispatch timeout
    covers the rest."""
    if moved_away(q, settings):
        return 0
    started = time.monotonic()
    sent, longest = 0, 0.0
    for _ in range(rounds):
        began = time.monotonic()
        after = began - started + longest + 0.005  # 5 ms: the Redis clock's whole ms
        batch = q.dispatch(effective_window(q, settings), redispatch_after=after)
        longest = max(longest, time.monotonic() - began)  # the dispatch alone: its shards' scripts
        sent += send(app, q.namespace, batch, settings)
        if sum(d.resent for d in batch) < STALE_PER_CALL:
            break
    return sent


def resend_waiting(app: Any, rt: Services, task_ids: list[str]) -> int:
    """Send again, at once, those of ``task_ids`` that still wait for their claim (dispatched): the
    rest of a batch whose pool process stopped or died before reaching them."""
    if moved_away(rt.queue, rt.settings):
        return 0
    waiting = [Dispatched(info.id, info.task, info.priority, False)
               for info in rt.queue.get_many(task_ids) if info is not None and info.state == "dispatched"]
    return send(app, rt.settings.namespace, waiting, rt.settings) if waiting else 0


def refill_window(rt: Services) -> int | None:
    """The window a completion refills in its own script (``complete_and_dispatch``), or None to
    leave the refill to a pump: a sharded namespace (its window spans every shard), or a window that
    could not be read now (a Redis error here must not fail a task that ran)."""
    if rt.queue.shard_count > 1:
        return None
    try:
        if moved_away(rt.queue, rt.settings):
            return None  # its pump sends nothing either
        return effective_window(rt.queue, rt.settings)
    except Exception as exc:
        log.warning("could not read the window (the pump after the task tries again): %s", exc)
        return None


def chain_window_open(rt: Services, window: int | None) -> bool:
    """Whether a chain may take a task after this completion: its namespace's window is above 0 (not
    paused, not moved away by a migration), as this process last read it. ``window``: what
    :func:`refill_window` gave for the completion's own refill (one shard); a sharded namespace's
    (no refill in the script) is read here."""
    if rt.queue.shard_count == 1:
        return bool(window)
    try:
        return not moved_away(rt.queue, rt.settings) and effective_window(rt.queue, rt.settings) > 0
    except Exception:  # not known now: no chain (the message path goes on as before)
        return False


def gate_on(rt: Services) -> bool:
    """Whether the namespace's host gate is on, as this process last read it (once per heartbeat
    interval, with the window): a completion then asks its script for the gate's first due time."""
    try:
        return _window(rt.queue).refresh(rt.queue, rt.settings).gated
    except Exception:  # a Redis error here must not fail a task that ran: the timer reads it later
        return False


def pump_quietly(app: Any, rt: Services, resend_all: bool = False) -> int:
    """Pump where a failure must not fail the caller (after a task, after a failover): the sweep of
    beat or of a worker watchdog pumps again later. ``resend_all``: send again every dispatched task
    whose message is not waiting in the broker (:func:`resend_dispatched`). Returns how many were
    sent (0 on failure)."""
    try:
        q, settings = rt.queue, rt.settings
        sent = resend_dispatched(q, app, settings) if resend_all else pump(q, app, settings)
    except Exception as exc:
        log.warning("pump failed (the next sweep pumps again): %s", exc)
        return 0
    arm_host_timer(app, rt)
    return sent


#: Longest a host timer waits (a later host is found again by the pump it fires).
HOST_TIMER_MAX = 30.0
SLOT = 9e15  # the host gate's "waits for an event" score (SLOT in state/_hosts.lua)


class _HostTimer:
    """One timer per namespace a process serves, armed for the earliest time one of its waiting
    hosts becomes eligible."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.due = float("inf")  # time.monotonic() the armed timer fires at

    def arm(self, app: Any, rt: Services, wait: tuple[int, int | None] | None = None) -> None:
        q = rt.queue
        cache = _window(q).refresh(q, rt.settings)
        if not cache.gated or cache.moved is not None:
            return
        if wait is not None:  # read by the completion's script (one shard): no round trip here
            now_ms, head = wait
            times = [head] if head is not None and head < SLOT else []
        else:
            pipe = q.client.pipeline(transaction=False)
            pipe.time()
            for keys in q.shard_keys():
                pipe.zrange(keys.hosts_wait, 0, 0, withscores=True)
            (now_s, now_us), *heads = pipe.execute()
            now_ms = now_s * 1000 + now_us // 1000
            times = [head[0][1] for head in heads if head and head[0][1] < SLOT]
        if not times:
            return
        delay = min(HOST_TIMER_MAX, max(0.002, (min(times) - now_ms) / 1000.0))
        due = time.monotonic() + delay
        with self.lock:
            if self.timer is not None and self.timer.is_alive() and self.due <= due + 0.001:
                return  # an earlier (or the same) pump is armed already
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(delay, self._fire, args=(app, rt))
            self.timer.daemon = True
            self.due = due
            self.timer.start()

    def _fire(self, app: Any, rt: Services) -> None:
        with self.lock:
            self.timer, self.due = None, float("inf")
        pump_quietly(app, rt)  # arms the next one


_host_timers: PerProcess[dict[str, _HostTimer]] = PerProcess(dict)


def host_timer(namespace: str) -> _HostTimer:
    """This process's timer for ``namespace``'s gate."""
    timers = _host_timers.get()
    timer = timers.get(namespace)
    if timer is None:
        timer = timers.setdefault(namespace, _HostTimer())
    return timer


def arm_host_timer(app: Any, rt: Services, wait: tuple[int, int | None] | None = None) -> None:
    """Arm this process's timer of ``rt``'s namespace for the earliest waiting host of its gate
    (nothing when the gate is off: a cached flag, no round trip). ``wait``: (now, the first waiting
    host's due time or None), both ms of the Redis clock, as a completion's script read them; else
    one round trip reads them. Never raises: the next pump or sweep arms it again."""
    try:
        host_timer(rt.queue.namespace).arm(app, rt, wait)
    except Exception as exc:
        log.debug("host timer not armed: %s", exc)
