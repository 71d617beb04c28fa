"""The pool child's SIGTERM handler: stop the running durable task where it is and hand it back.

The worker's main process sends SIGTERM to a child still holding leases when the shutdown grace
period ends (``celery_ha.integration.worker.shutdown``). Inside user code the handler raises
:class:`GracefulStop`, so the runner commits what the task produced (keyed, so safe) and releases the
lease without counting a stall. While a lease is being taken or held outside the task's context (the
claim, the start of the run) it only notes the request, which the runner honours before the task's
code starts: an exit there would leave a dead holder, whose lease fast failover releases with a
stall counted. Between tasks it behaves like the pool's own handler (exit).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.task_errors import GracefulStop


class StopHandler:
    """One per process: knows the running task's context and whether user code is on the stack."""

    def __init__(self) -> None:
        self.current: Any = None  # the running DurableContext, if any
        self.in_user_code = False
        self.stop_requested = False
        self.holding = False  # a lease may be held (claim to outcome), whether or not in a context
        self._previous: Any = signal.SIG_DFL

    def install(self) -> None:
        """Install the handler, keeping the pool's own one for idle moments.

        Called before every task: billiard installs its exit handler after ``worker_process_init``,
        so installing once at start-up would be undone.
        """
        current = signal.getsignal(signal.SIGTERM)
        if current == self._on_sigterm:
            return
        self._previous = current
        signal.signal(signal.SIGTERM, self._on_sigterm)

    @contextlib.contextmanager
    def holding_lease(self) -> Iterator[None]:
        """Around one message's work (one task, or a batch's tasks: nested, the outer one counts),
        from before the first claim to the last outcome: SIGTERM is noted, never an exit. One SIGTERM
        stops one message's work: the note is cleared when it ends, so a pool process that goes on
        (a task revoked with ``terminate``) runs its next message in full."""
        outer = not self.holding
        self.holding = True
        try:
            yield
        finally:
            if outer:
                self.holding = False
                self.stop_requested = False

    @contextlib.contextmanager
    def running(self, ctx: Any) -> Iterator[None]:
        """Around one task: SIGTERM now stops ``ctx`` instead of the process."""
        self.current = ctx
        try:
            yield
        finally:
            self.current = None

    @contextlib.contextmanager
    def user_code(self) -> Iterator[None]:
        """Around the task function itself: only there may SIGTERM raise into the stack."""
        self.in_user_code = True
        try:
            yield
        finally:
            self.in_user_code = False

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.stop_requested = True
        ctx = self.current
        if ctx is not None:
            ctx.stopping = True
            if self.in_user_code:
                raise GracefulStop()
            return
        if self.holding:
            return  # the runner sees stop_requested before the task's code starts
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


_handler: PerProcess[StopHandler] = PerProcess(StopHandler)


def stop_handler() -> StopHandler:
    """This process's handler."""
    return _handler.get()
