"""OpenTelemetry, when it is installed: the trace context a durable task carries, and its spans.

A durable task outlives the code that queued it (it waits in Redis, runs several times, in other
processes, after a failover or a redrive days later), so the Celery message cannot carry its trace:
the enqueuing code's context is stored **with the task** instead, as a W3C ``traceparent`` (and
``tracestate``) string of at most :data:`MAX_TRACE_CHARS`, and every later step starts its span from
it — one trace per task, whichever path dispatched it.

Everything here is optional: without the ``opentelemetry-api`` package (``pip install
'celery-ha[otel]'``) every function is a cheap no-op, and with it but no SDK configured (no tracer
provider set) nothing is stored and no span is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from celery_ha.base.errors import InvalidInput

#: Longest stored trace context (a traceparent is 55 characters; the rest is room for tracestate).
MAX_TRACE_CHARS = 512
#: Name of the tracer every celery-ha span comes from.
TRACER = "celery_ha"

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_api: list[Any] = []  # [module tuple] once imported, [None] when OpenTelemetry is absent


def _otel() -> Any:
    """``(trace, context, propagator)`` of the OpenTelemetry API, or None when it is not installed
    (looked up once per process: a failed import is not retried on every enqueue)."""
    if not _api:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            _api.append((trace, context, TraceContextTextMapPropagator()))
        except ImportError:
            _api.append(None)
    return _api[0]


def enabled() -> bool:
    """Whether spans are recorded here: the API is installed and a real tracer provider is set (the
    default proxy, or the no-op one, records nothing)."""
    api = _otel()
    if api is None:
        return False
    trace = api[0]
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def capture() -> str | None:
    """The current span's context as stored with a task (``traceparent`` or
    ``traceparent\\ntracestate``), or None when there is no valid current span."""
    api = _otel()
    if api is None:
        return None
    carrier: dict[str, str] = {}
    api[2].inject(carrier)
    parent = carrier.get("traceparent")
    if not parent:
        return None
    state = carrier.get("tracestate", "")
    text = f"{parent}\n{state}" if state else parent
    return text if len(text) <= MAX_TRACE_CHARS else parent


def check_trace(value: Any) -> str:
    """A trace context given with a task spec (``trace=``), checked: a ``traceparent``, optionally
    followed by a newline and a ``tracestate``, at most :data:`MAX_TRACE_CHARS` characters."""
    if not isinstance(value, str) or len(value) > MAX_TRACE_CHARS or not value.isascii():
        raise InvalidInput(f"trace must be a W3C traceparent string of at most {MAX_TRACE_CHARS} characters")
    if not _TRACEPARENT.match(value.partition("\n")[0]):
        raise InvalidInput("trace must start with a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    return value


def _carrier(trace_text: str) -> dict[str, str]:
    parent, _, state = trace_text.partition("\n")
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def context_of(trace_text: str | None) -> Any:
    """The OpenTelemetry context a stored trace string stands for (an empty one for None)."""
    api = _otel()
    if api is None or not trace_text:
        return None
    return api[2].extract(_carrier(trace_text))


def span_context_of(trace_text: str | None) -> Any:
    """The SpanContext of a stored trace string, for a span link; None when absent or invalid."""
    api = _otel()
    if api is None or not trace_text:
        return None
    found = api[0].get_current_span(api[2].extract(_carrier(trace_text))).get_span_context()
    return found if found.is_valid else None


def tracer() -> Any:
    return _otel()[0].get_tracer(TRACER)


def links(*traces: str | None) -> list[Any]:
    """Span links to the stored trace strings that are valid."""
    api = _otel()
    found = [span_context_of(t) for t in traces]
    return [api[0].Link(sc) for sc in found if sc is not None]


def task_event(name: str, trace_text: str | None, attributes: Mapping[str, Any],
               link_to: Sequence[str | None] = ()) -> None:
    """A short span of its own in a task's trace (failover, cancel, redrive, recrawl): a child of the
    task's stored context, linked to ``link_to``. Nothing when tracing is off."""
    if not enabled():
        return
    span = tracer().start_span(name, context=context_of(trace_text), links=links(*link_to),
                               attributes={k: v for k, v in attributes.items() if v is not None})
    span.end()


def flush(timeout_ms: int = 5000) -> None:
    """Export the spans still buffered (a pool child exiting, a worker shutting down)."""
    if not enabled():
        return
    provider = _otel()[0].get_tracer_provider()
    force = getattr(provider, "force_flush", None)
    if force is not None:
        force(timeout_ms)


def start_span(name: str, trace_text: str | None, link_to: Sequence[str | None] = (),
               attributes: Mapping[str, Any] | None = None, consumer: bool = False) -> Any:
    """A started span, child of the stored context ``trace_text`` (call only when :func:`enabled`)."""
    trace = _otel()[0]
    kind = trace.SpanKind.CONSUMER if consumer else trace.SpanKind.INTERNAL
    return tracer().start_span(name, context=context_of(trace_text), kind=kind, links=links(*link_to),
                               attributes={k: v for k, v in (attributes or {}).items() if v is not None})


def add_link(span: Any, trace_text: str | None) -> None:
    """Link a started span to a stored trace string (nothing when it is absent or invalid)."""
    found = span_context_of(trace_text)
    if found is not None:
        span.add_link(found)


def activate(span: Any) -> Any:
    """Make ``span`` the current one in this thread (what the task's code and its ``ctx.enqueue``
    see); returns the token for :func:`deactivate`."""
    trace, context, _ = _otel()
    return context.attach(trace.set_span_in_context(span))


def deactivate(token: Any) -> None:
    _otel()[1].detach(token)


def traceparent_of(span: Any) -> str:
    """The W3C traceparent of a span (stored so the next attempt can link to it)."""
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"


def mark_error(span: Any, description: str) -> None:
    trace = _otel()[0]
    span.set_status(trace.Status(trace.StatusCode.ERROR, description[:500]))
