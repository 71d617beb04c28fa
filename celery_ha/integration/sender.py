"""Send a completion's refill messages from a background thread, off the task's critical path.

With ``acks_late`` and ``prefetch 1`` a pool process takes its next message only once the current
task returned, so the task's wall time sets the drain rate. Publishing a Celery message costs about
a millisecond of kombu and Celery code (the message, the ``task-sent`` event, a client per publish);
done inside the task, after the completion, it made durable no-op tasks ~0.65x plain Celery's rate.

What is deferred is only the publish. The tasks it carries were already moved to ``dispatched`` in
Redis by the completion's own script (``complete_dispatch.lua``), so the window's accounting does not
wait for it, and a message that never goes out (the process is SIGKILLed first, the broker refuses
it) is no lost task: the pump sends every dispatched task again once it waited
``CELERY_HA_REDISPATCH_AFTER`` for its claim, as it always did for a lost message. A pool process
that exits normally (warm shutdown, recycling) sends what is queued first (:func:`flush_sends`, from
``worker_process_shutdown``).

One daemon thread per process, started on first use (after the fork: no thread crosses one). It keeps
one producer of the app's pool while it has work (:class:`HeldProducer`), because taking one from the
pool per message binds it to a pooled connection and a new channel each time: about a third of what a
publish costs. The failover, shutdown and batch paths keep sending synchronously
(:func:`celery_ha.integration.pump.send`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.pump import send
from celery_ha.integration.services import Services
from celery_ha.state import Dispatched

log = logging.getLogger(__name__)

#: Batches waiting at most; past it (a broker that blocks every publish) new ones are left to the
#: redispatch timeout instead of piling up in memory.
MAX_PENDING = 1000

#: Seconds without anything to send after which the sender gives its producer back to the pool.
PRODUCER_IDLE = 10.0


class HeldProducer:
    """A producer taken from an app's pool and kept across publishes; given back when idle, when the
    app changes, and after a publish failed (the next publish takes a fresh one)."""

    def __init__(self) -> None:
        self._app: Any = None
        self._context: Any = None
        self.producer: Any = None

    @property
    def held(self) -> bool:
        return self._context is not None

    def get(self, app: Any) -> Any:
        if self._context is not None and self._app is not app:
            self.release()
        if self._context is None:
            context = app.producer_or_acquire()
            self.producer = context.__enter__()
            self._app, self._context = app, context
        return self.producer

    def release(self) -> None:
        context, self._context, self._app, self.producer = self._context, None, None, None
        if context is not None:
            with contextlib.suppress(Exception):  # a broken connection goes back to be revived
                context.__exit__(None, None, None)


class BackgroundSender:
    """A FIFO of dispatched batches and the thread that publishes them (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Any, Services, list[Dispatched]]] = deque()
        self._cond = threading.Condition()
        self._busy = False  # a batch is being published
        self._producer = HeldProducer()
        self._thread = threading.Thread(target=self._run, name="celery-ha-sender", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, app: Any, rt: Services, batch: list[Dispatched]) -> bool:
        """Queue ``batch`` for publishing; False when the queue is full (left to redispatch)."""
        with self._cond:
            if len(self._pending) >= MAX_PENDING:
                return False
            self._pending.append((app, rt, batch))
            self._cond.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until everything queued was published; True if it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(PRODUCER_IDLE if self._producer.held else None):
                        self._producer.release()
                app, rt, batch = self._pending.popleft()
                self._busy = True
            try:
                sent = send(app, rt.settings.namespace, batch, rt.settings, producer=self._producer.get(app))
                log.debug("refill after completion: dispatched %d, sent %d", len(batch), sent)
            except Exception as exc:  # the thread must survive anything a publish throws
                self._producer.release()
                log.warning("sending %d dispatched task(s) failed (the pump sends them again after "
                            "the redispatch delay): %s", len(batch), exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


_sender: PerProcess[BackgroundSender] = PerProcess(BackgroundSender, valid=lambda s: s.alive)


def send_soon(app: Any, rt: Services, batch: list[Dispatched]) -> None:
    """Publish the messages of tasks a completion already dispatched, from this process's sender
    thread; the caller returns at once."""
    if batch and not _sender.get().submit(app, rt, batch):
        log.warning("%d dispatched task(s) not sent now (sender queue full): the pump sends them again "
                    "after the redispatch delay", len(batch))


def flush_sends(timeout: float = 5.0) -> bool:
    """Publish what this process's sender still holds (before the process exits); True when nothing
    is left. Never starts a sender."""
    sender = _sender.peek()
    return sender is None or sender.flush(timeout)
