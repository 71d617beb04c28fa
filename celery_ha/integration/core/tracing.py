"""One span per attempt of a durable task, and spans for what happens to it in the worker.

Each attempt (one claim, in a pool process) is a span ``celery_ha.attempt <task>``: a child of the
context stored with the task at enqueue (``base/tracing.py``), so every attempt of a task lands in the
enqueuing code's trace whichever path dispatched it (the completion script's push included), and
linked to the previous attempt's span, whose traceparent each attempt leaves in the namespace's
``spans`` hash. The span is current while the task's code runs, so ``ctx.enqueue`` hands it to child
tasks. A pool child's death released by fast failover is a span ``celery_ha.failover`` in the same
trace, linked to the attempt that died.

All of it only when tracing is on (OpenTelemetry installed and a tracer provider set); otherwise
:func:`attempt_started` returns a no-op at the cost of one check, and no Redis command is sent.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit

import redis

from celery_ha.base import tracing
from celery_ha.integration.core.services import Services
from celery_ha.state.keys import QueueKeys
from celery_ha.state.records import Lease, TaskInfo

log = logging.getLogger(__name__)

#: How long an attempt's traceparent is kept for the next attempt to link to (refreshed by each write).
SPANS_TTL = 7 * 86400
#: Outcomes after which the task runs no more attempts: its entry in ``spans`` goes.
FINAL = ("completed", "failed:dead", "dropped")

_open = threading.local()  # the attempt whose span this thread still holds


class Attempt:
    """The span of one attempt (the no-op :data:`NOOP` when tracing is off)."""

    def __init__(self, span: Any = None, token: Any = None, rt: Services | None = None,
                 task_id: str = "") -> None:
        self.span, self.token, self.rt, self.task_id = span, token, rt, task_id

    def ended(self, kind: str, detail: str = "") -> None:
        """End the span with the run's outcome (``runner.Outcome.kind``)."""
        if self.span is None:
            return
        span, self.span = self.span, None
        _open.attempt = None
        try:
            span.set_attribute("celery_ha.outcome", kind)
            if kind.startswith("failed") or kind in ("lost", "abandoned"):
                tracing.mark_error(span, detail or kind)
            span.end()
            tracing.deactivate(self.token)
        except Exception as exc:  # tracing must never change a task's outcome
            log.debug("could not end the attempt span of %s: %s", self.task_id, exc)
        if kind in FINAL and self.rt is not None:
            try:
                self.rt.client.hdel(QueueKeys(self.rt.settings.namespace).spans, self.task_id)
            except redis.RedisError:
                pass


NOOP = Attempt()


def _previous(rt: Services, task_id: str) -> str | None:
    try:
        raw = rt.client.hget(QueueKeys(rt.settings.namespace).spans, task_id)
    except redis.RedisError:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


def _attributes(info: TaskInfo, rt: Services) -> dict[str, Any]:
    return {"celery_ha.task": info.task, "celery_ha.task_id": info.id, "celery_ha.namespace":
            rt.settings.namespace, "celery_ha.attempt": info.attempt, "celery_ha.stalls": info.stalls,
            "celery_ha.lease_token": info.token, "celery_ha.host": urlsplit(info.url).hostname,
            "celery_ha.worker": rt.worker_name}


def attempt_started(lease: Lease, rt: Services) -> Attempt:
    """Start the span of the attempt ``lease`` began and make it current in this thread."""
    stale = getattr(_open, "attempt", None)
    if stale is not None:  # an earlier run of this thread ended without reporting (an error escaped)
        stale.ended("abandoned", "the run ended without an outcome")
    if not tracing.enabled():
        return NOOP
    try:
        info = lease.task
        span = tracing.start_span(f"celery_ha.attempt {info.task}", info.trace,
                                  attributes=_attributes(info, rt), consumer=True)
        attempt = Attempt(span, tracing.activate(span), rt, lease.task_id)
        _open.attempt = attempt
        # One round trip: the previous attempt's traceparent (for the link) out, this one's in.
        with rt.client.pipeline(transaction=False) as pipe:
            spans = QueueKeys(rt.settings.namespace).spans
            pipe.hget(spans, lease.task_id)
            pipe.hset(spans, lease.task_id, tracing.traceparent_of(span))
            pipe.expire(spans, SPANS_TTL)
            previous = pipe.execute()[0]
        tracing.add_link(span, previous.decode() if isinstance(previous, bytes) else previous)
        return attempt
    except redis.RedisError as exc:  # the span stands; only the next attempt's link is missing
        log.debug("could not store the attempt span of %s: %s", lease.task_id, exc)
        return getattr(_open, "attempt", None) or NOOP
    except Exception as exc:
        log.warning("tracing of task %s failed: %s", lease.task_id, exc)
        return NOOP


def task_event(rt: Services, info: TaskInfo, name: str, **attributes: Any) -> None:
    """A span ``name`` in ``info``'s trace, linked to its latest attempt (failover and the like)."""
    if not tracing.enabled():
        return
    try:
        tracing.task_event(name, info.trace, {**_attributes(info, rt), **attributes},
                           link_to=[_previous(rt, info.id)])
    except Exception as exc:
        log.debug("could not record %s for task %s: %s", name, info.id, exc)
