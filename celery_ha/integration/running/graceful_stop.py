"""The pool child's SIGTERM handler: stop the running durable task where it is and hand it back.

The worker's main process sends SIGTERM to a child still holding leases when the shutdown grace
period ends (``celery_ha.integration.worker.shutdown``). Inside user code the handler raises
:class:`GracefulStop`, so the runner commits what the task produced (keyed, so safe) and releases the
lease without counting a stall. While a lease is being taken or held outside the task's context (the
claim, the start of the run) it only notes the request, which the runner honours before the task's
code starts: an exit there would leave a dead holder, whose lease fast failover releases with a
stall counted. Between tasks it behaves like the pool's own handler (exit).

Celery's soft time limit gets the same treatment (billiard signals it with SIGUSR1, whose handler
raises SoftTimeLimitExceeded wherever the child is): raised into the task's own code as before, but
only noted while a lease is held anywhere else, so it never lands between a script's reply and the
use of what it granted (a batch's next id, claimed by the completion's script, was lost that way and
counted a stall). A batch ends its work at the next id when the note is there, handing the rest on.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.task_errors import GracefulStop

#: The name of billiard's SIGUSR1 handler in a pool child (``billiard.pool.soft_timeout_sighandler``,
#: billiard 4.2 and 4.3): the one the soft-limit handler takes over.
SOFT_LIMIT_HANDLER = "soft_timeout_sighandler"


class StopHandler:
    """One per process: knows the running task's context and whether user code is on the stack."""

    def __init__(self) -> None:
        self.current: Any = None  # the running DurableContext, if any
        self.in_user_code = False
        self.stop_requested = False
        self.holding = False  # a lease may be held (claim to outcome), whether or not in a context
        self.soft_limit = False  # the message's soft time limit came outside the task's own code
        self._previous: Any = signal.SIG_DFL
        self._previous_soft: Any = signal.SIG_DFL

    def install(self) -> None:
        """Install the handler, keeping the pool's own one for idle moments.

        Called before every task: billiard installs its exit handler after ``worker_process_init``,
        so installing once at start-up would be undone.
        """
        current = signal.getsignal(signal.SIGTERM)
        if current != self._on_sigterm:
            self._previous = current
            signal.signal(signal.SIGTERM, self._on_sigterm)
        # Only over billiard's soft-limit handler (a pool child): in a worker's main process SIGUSR1
        # is Celery's "dump the stacks" request.
        soft = signal.getsignal(signal.SIGUSR1)
        if getattr(soft, "__name__", "") == SOFT_LIMIT_HANDLER:
            self._previous_soft = soft
            signal.signal(signal.SIGUSR1, self._on_soft_limit)

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
                self.soft_limit = False

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


    def _on_soft_limit(self, signum: int, frame: Any) -> None:
        if self.in_user_code:
            raise SoftTimeLimitExceeded()
        if self.holding:
            self.soft_limit = True  # the runner's completion goes on; a batch hands the rest on
            return
        previous = self._previous_soft
        if callable(previous):
            previous(signum, frame)


_handler: PerProcess[StopHandler] = PerProcess(StopHandler)


def stop_handler() -> StopHandler:
    """This process's handler."""
    return _handler.get()
