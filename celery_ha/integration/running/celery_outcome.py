"""Show Celery (and so Flower) what a message's run did to its durable task.

Celery only sees the function's return or exception. Returning for every outcome made every durable
task a green SUCCESS in Flower, dead letters included. Here each outcome maps to the Celery state
that tells the truth, without changing what the durable layer did and without Celery doing anything
itself (no Celery retry is ever scheduled; the message is acknowledged in every case but a claim
that could not be made, which the runner requeues):

========================  ================  ==========================================
durable outcome           Celery state      shown in Flower
========================  ================  ==========================================
completed                 SUCCESS           result ``completed <url>``
dropped                   SUCCESS           result ``dropped: task … is not claimable``
                                            (a duplicate or stale message: nothing ran)
failed:dead               FAILURE           exception ``DurableTaskDead(<url>: <error>)``
failed:retry              RETRY             ``DurableRetry(<url>: <error>; retry due …)``
released / abandoned      RETRY             ``DurableRetry(<url>: handed back: …)``
lost                      RETRY             ``DurableRetry(<url>: lease lost: …)`` (the
                                            task runs, or already ran, elsewhere)
========================  ================  ==========================================

A dropped message is not a REJECTED one: Celery (5.5+) records a message rejected without requeue
as a FAILURE, and a duplicate is harmless; its result says what happened.

``Retry`` raised without ``Task.retry()`` sends no message: Celery records RETRY, emits
``task-retried`` and, the task being ``acks_late``, acknowledges the message. The runner's
``Reject(requeue=True)`` (a claim Redis could not take) would be logged with a traceback per
message during an outage; :class:`QuietRejects` keeps it to its one line.
"""

from __future__ import annotations

import datetime as dt
import logging

from celery.exceptions import Reject, Retry

from celery_ha.integration.running.runner import Outcome

#: Longest URL quoted in a Celery result or exception (Flower shows them in a table).
URL_SHOWN = 300


class DurableTaskDead(Exception):
    """The durable task is dead (attempts or stalls exhausted): this run is a FAILURE."""


class DurableRetry(Exception):
    """The durable task will run again (a retry waits in Redis, or it was handed back)."""


def _where(outcome: Outcome) -> str:
    if not outcome.url:
        return f"task {outcome.task_id}"
    return outcome.url if len(outcome.url) <= URL_SHOWN else outcome.url[:URL_SHOWN] + "…"


def report(outcome: Outcome) -> str:
    """The Celery task's return value for ``outcome``, or the exception that sets its state."""
    kind = outcome.kind
    if kind == "completed":
        return f"completed {_where(outcome)}"
    if kind == "dropped":
        return f"dropped: {_where(outcome)}: {outcome.detail}"
    if kind == "failed:dead":
        raise DurableTaskDead(f"{_where(outcome)}: {outcome.detail}")
    if kind in ("failed:retry", "released", "abandoned", "lost"):
        when = (dt.datetime.fromtimestamp(outcome.due_at, dt.timezone.utc)
                if outcome.due_at is not None else None)
        due = f"; retry due {when.isoformat(timespec='seconds')}" if when is not None else ""
        reason = DurableRetry(f"{_where(outcome)}: {outcome.detail}{due}")
        raise Retry(str(reason), exc=reason, when=when)
    raise ValueError(f"unknown outcome {kind!r}")


class QuietRejects(logging.Filter):
    """Celery's log line for a rejected message, without the traceback (the line says why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], Reject):
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_reject_tracebacks() -> None:
    """Install :class:`QuietRejects` on Celery's task-trace logger (once per process)."""
    trace_log = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, QuietRejects) for f in trace_log.filters):
        trace_log.addFilter(QuietRejects())
