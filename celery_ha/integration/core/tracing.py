"""One span per attempt of a durable task, and spans for what happens to it in the worker.

Each attempt (one claim, in a pool process) is a span ``celery_ha.attempt <task>``: a child of the
context stored with the task at enqueue (``base/tracing.py``), so every attempt of a task lands in the
enqueuing code's trace whichever path dispatched it (the completion script's push included), and
linked to the previous attempt's span, whose traceparent each attempt leaves in a key of its task's
own (:func:`span_key`). The span is current while the task's code runs, so ``ctx.enqueue`` hands it to
child tasks. A pool child's death released by fast failover is a span ``celery_ha.failover`` in the same
trace, linked to the attempt that died.

One key per task, each with its own expiry, rather than one hash for the namespace: a task can stop
running without any attempt of its own saying so last (cancelled while running, reclaimed to dead after
its worker died, a pool child killed), so no code path is there to delete its entry; and a hash's one
expiry, pushed forward by every attempt of every task, never comes in a busy namespace (a per-field
expiry needs Redis 7.4; 6.2 and 7.0 are supported). Each attempt's ``SET ... PX ... GET`` writes its
traceparent, reads the previous one and restarts only its own task's clock, in one command: an entry
outlives its task's last attempt by at most :data:`SPANS_TTL`, however the task ended, and Redis
expires it with no sweep of ours. A completed task's entry goes at once; a dead one's stays for that
time, so the first attempt after a redrive still links to the attempt that died. The key lives under
the task's shard tag, like the task's record, so a sharded namespace spreads these writes over its
shards (one slot each in Redis Cluster) and ``purge`` finds them with the shard's other keys.
The one ``cha:{ns}:spans`` hash of earlier releases is no longer read or written: with no write to
push its expiry forward, it goes 7 days after the upgrade at the latest.

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
from celery_ha.state.keys import prefix
from celery_ha.state.records import Lease, TaskInfo
from celery_ha.state.shards import shard_of, shard_tags

log = logging.getLogger(__name__)

#: Seconds an attempt's traceparent is kept for the next attempt of its task to link to, from the start
#: of that attempt (each attempt restarts its own task's clock, no other's): the bound on how long the
#: entry of a task that ended in any way but completion stays. A redrive or a release later than this
#: starts an unlinked attempt.
SPANS_TTL: float = 7 * 86400
#: Outcomes after which no attempt of the task follows (short of a recrawl): its entry goes at once.
#: Not ``failed:dead``: ``dead redrive`` may bring the task back, and its attempt links to this one.
DROP_ENTRY_AFTER = ("completed", "dropped")

_open = threading.local()  # the attempt whose span this thread still holds


class Attempt:
    """The span of one attempt (the no-op :data:`NOOP` when tracing is off)."""

    def __init__(self, span: Any = None, token: Any = None, rt: Services | None = None,
                 task_id: str = "", key: str = "") -> None:
        self.span, self.token, self.rt, self.task_id, self.key = span, token, rt, task_id, key

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
        if kind in DROP_ENTRY_AFTER and self.rt is not None:
            try:
                self.rt.client.delete(self.key)
            except redis.RedisError:  # it expires by itself
                pass


NOOP = Attempt()


def span_key(namespace: str, shards: int, task_id: str) -> str:
    """The key holding the traceparent of ``task_id``'s latest attempt: ``cha:{<tag>}:spans:<id>``,
    under the tag of the task's shard (the namespace's own with one shard), where its record lives."""
    return f"{prefix(namespace, shard_tags(namespace, shards)[shard_of(task_id, shards)])}spans:{task_id}"


def _key(rt: Services, task_id: str) -> str:
    """``span_key`` by the queue's own layout (its shard count placed the task)."""
    return span_key(rt.queue.namespace, rt.queue.shard_count, task_id)


def _text(raw: Any) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


def _previous(rt: Services, task_id: str) -> str | None:
    try:
        return _text(rt.client.get(_key(rt, task_id)))
    except redis.RedisError:
        return None


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
        info, key = lease.task, _key(rt, lease.task_id)
        span = tracing.start_span(f"celery_ha.attempt {info.task}", info.trace,
                                  attributes=_attributes(info, rt), consumer=True)
        attempt = Attempt(span, tracing.activate(span), rt, lease.task_id, key)
        _open.attempt = attempt
        # One command: this attempt's traceparent in, the previous one's (for the link) out, and this
        # task's entry alone given SPANS_TTL more (SET's GET option: Redis 6.2+).
        ttl_ms = max(1, int(SPANS_TTL * 1000))
        previous = rt.client.set(key, tracing.traceparent_of(span), px=ttl_ms, get=True)
        tracing.add_link(span, _text(previous))
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
