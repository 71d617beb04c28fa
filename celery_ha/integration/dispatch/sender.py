"""Publish a completion's refill messages where they cost least: a background thread, or the task's own.

With ``acks_late`` and ``prefetch 1`` a pool process takes its next message only once the current
task returned, so the task's wall time sets the drain rate. Publishing a Celery message costs a few
tenths of a millisecond of kombu and Celery CPU and a round trip (``integration/dispatch/publisher.py``).
Where it runs matters more than what it costs:

- A task whose own code uses little CPU (a no-op, an I/O-bound fetch) leaves the process idle most
  of the time: the background thread publishes while the process waits (for its next message, for
  Redis), off the task's critical path. Publishing inside such tasks made no-op tasks ~0.65x plain
  Celery's rate; from the thread, ~1x.
- A task whose own code keeps the CPU busy (parsing) would have the thread fight it for the GIL:
  forced switches every ``sys.getswitchinterval()`` and cold caches on both sides cost more than the
  publish itself (measured: ~0.7 ms more CPU per page task than publishing in the task). There the
  task's thread publishes its refill itself, right after its completion.

The choice is made per process from a moving average of the CPU time of the tasks' own code
(:data:`INLINE_CPU`). Either way a refill still queued when the next task's code is about to run is
published first by that task's thread (:func:`publish_queued`): no publish starts beside a task's code.

What is deferred is only the publish. The tasks it carries were already moved to ``dispatched`` in
Redis by the completion's own script (``complete_dispatch.lua``), so the window's accounting does not
wait for it, and a message that never goes out (the process is SIGKILLed first, the broker refuses
it) is no lost task: the pump sends every dispatched task again once it waited
``CELERY_HA_REDISPATCH_AFTER`` for its claim, as it always did for a lost message. A pool process
that exits normally (warm shutdown, recycling) sends what is queued first (:func:`flush_sends`, from
``worker_process_shutdown``).

One daemon thread per process, started on first use (after the fork: no thread crosses one). One
producer of the app's pool is kept while there is work (:class:`HeldProducer`), because taking one
from the pool per message binds it to a pooled connection and a new channel each time: about a third
of what a publish costs. One publisher at a time uses it. The failover, shutdown and batch paths keep
sending synchronously (:func:`celery_ha.integration.dispatch.pump.send`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.services import Services
from celery_ha.integration.dispatch.publisher import HeldProducer
from celery_ha.integration.dispatch.pump import arm_host_timer, send
from celery_ha.state import Dispatched

log = logging.getLogger(__name__)

#: Batches waiting at most; past it (a broker that blocks every publish) new ones are left to the
#: redispatch timeout instead of piling up in memory.
MAX_PENDING = 1000

#: Seconds without anything to send after which the sender gives its producer back to the pool.
PRODUCER_IDLE = 10.0

#: CPU seconds of a task's own code (moving average per process) from which the task's thread
#: publishes its refill itself instead of waking the sender thread (see the module docstring).
INLINE_CPU = 0.001

#: Weight of the newest task in that moving average.
CPU_SMOOTHING = 0.2


class BackgroundSender:
    """A FIFO of dispatched batches and the thread that publishes them (see the module docstring).

    One publisher at a time (``_publishing``): the held producer and its channel are not thread-safe,
    and a task's thread may publish what the sender thread has not started yet."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Any, Services, list[Dispatched]]] = deque()
        # One lock, two conditions: the sender thread waits for work, flush() for the queue to empty.
        # A publish that ends wakes only flush() waiters: waking the idle sender thread after every
        # publish would make it take the GIL from the task's thread once per task for nothing.
        lock = threading.Lock()
        self._work = threading.Condition(lock)
        self._drained = threading.Condition(lock)
        self._publishing = threading.Lock()
        self._busy = False  # a batch is being published
        self._producer = HeldProducer()
        self.task_cpu = 0.0  # moving average of the CPU seconds of this process's tasks' own code
        self._thread = threading.Thread(target=self._run, name="celery-ha-sender", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def observe(self, cpu_seconds: float) -> bool:
        """Fold one task's own CPU time into the average; True when this process's tasks are busy
        enough on the CPU that they publish their refills themselves."""
        self.task_cpu += CPU_SMOOTHING * (cpu_seconds - self.task_cpu)
        return self.task_cpu >= INLINE_CPU

    def submit(self, app: Any, rt: Services, batch: list[Dispatched], wake: bool = True) -> bool:
        """Queue ``batch`` for publishing; False when the queue is full (left to redispatch).
        ``wake``: let the sender thread publish it (else the caller publishes, or the next task)."""
        with self._work:
            if len(self._pending) >= MAX_PENDING:
                return False
            self._pending.append((app, rt, batch))
            if wake:
                self._work.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until everything queued was published; True if it was."""
        deadline = time.monotonic() + timeout
        with self._work:
            self._work.notify_all()  # what was queued for its caller to publish goes out now
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._drained.wait(left)
        return True

    def publish_pending(self, wait: float = -1) -> bool:
        """Publish every queued batch from the calling thread. ``wait``: seconds to wait for a
        publish in progress elsewhere (-1: as long as it takes); False when it did not end in time
        (the sender thread then goes on with the rest)."""
        if not self._pending:  # the common case before a task's code: nothing queued, no lock taken
            return True
        if not self._publishing.acquire(timeout=wait):
            return False
        try:
            while True:
                with self._work:
                    if not self._pending:
                        return True
                    app, rt, batch = self._pending.popleft()
                    self._busy = True
                try:
                    self._publish(app, rt, batch)
                finally:
                    with self._work:
                        self._busy = False
                        self._drained.notify_all()
        finally:
            self._publishing.release()

    def _publish(self, app: Any, rt: Services, batch: list[Dispatched]) -> None:
        try:
            sent = send(app, rt.settings.namespace, batch, rt.settings, held=self._producer)
            log.debug("refill after completion: dispatched %d, sent %d", len(batch), sent)
        except Exception as exc:  # the sender must survive anything a publish throws
            self._producer.release()
            log.warning("sending %d dispatched task(s) failed (the pump sends them again after "
                        "the redispatch delay): %s", len(batch), exc)

    def _run(self) -> None:
        while True:
            with self._work:
                has_work = self._work.wait_for(lambda: bool(self._pending),
                                               PRODUCER_IDLE if self._producer.held else None)
            if has_work:
                self.publish_pending()
                continue
            with self._publishing:  # idle: the producer goes back to the pool
                if not self._pending:
                    self._producer.release()


_sender: PerProcess[BackgroundSender] = PerProcess(BackgroundSender, valid=lambda s: s.alive)


def send_soon(app: Any, rt: Services, batch: list[Dispatched], task_cpu: float = 0.0,
              host_wait: tuple[int, int | None] | None = None) -> None:
    """Publish the messages of tasks a completion already dispatched. ``task_cpu``: CPU seconds the
    task's own code used; where this process's tasks keep the CPU busy, the caller publishes them
    now (after what is queued before them), else the sender thread does and the caller returns at
    once (see the module docstring). ``host_wait``: the host gate's first due time as the
    completion's script read it (``Completion.host_wait``), which spares the timer a round trip."""
    sender = _sender.get()
    inline = sender.observe(task_cpu)
    arm_host_timer(app, rt, host_wait)  # a paced host the refill had to pass over gets its pump on time
    if not batch:
        return
    if not sender.submit(app, rt, batch, wake=not inline):
        log.warning("%d dispatched task(s) not sent now (sender queue full): the pump sends them again "
                    "after the redispatch delay", len(batch))
    elif inline:
        sender.publish_pending()


def publish_queued() -> None:
    """Publish, from the calling thread, the refill messages this process's sender thread has not
    started yet: called right before a task's own code runs, so no publish starts beside it. A
    publish already in progress is not waited for (the thread goes on with what follows it). Never
    starts a sender."""
    sender = _sender.peek()
    if sender is not None:
        sender.publish_pending(wait=0)


def flush_sends(timeout: float = 5.0) -> bool:
    """Publish what this process's sender still holds (before the process exits); True when nothing
    is left. Never starts a sender."""
    sender = _sender.peek()
    return sender is None or sender.flush(timeout)
