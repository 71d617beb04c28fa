"""The ``traced`` system of ``e2e_bench.py``: the OpenTelemetry SDK in the worker (imported through
``CELERY_HA_EXTRA_IMPORTS``), with a BatchSpanProcessor whose exporter drops the spans, so the bench
measures celery-ha's tracing and the SDK's own cost, not an exporter's network."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def provider() -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(BatchSpanProcessor(DropExporter()))
    return made


trace.set_tracer_provider(provider())
