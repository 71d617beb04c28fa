"""Worker-side OpenTelemetry set-up for the tracing tests (imported through CELERY_HA_EXTRA_IMPORTS).

The SDK's tracer provider with a SimpleSpanProcessor whose exporter appends each finished span, as
one JSON line, to ``$CELERY_HA_TEST_SPANS`` (one ``write`` per line with O_APPEND, so the worker's
main process and its pool children can share the file). Set up at import in the main process; each
forked child keeps it (the processor exports synchronously, no thread to lose in the fork).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


def span_record(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
            "links": [f"{link.context.span_id:016x}" for link in span.links],
            "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
            "pid": os.getpid()}


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            for span in spans:
                os.write(fd, (json.dumps(span_record(span)) + "\n").encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


if os.environ.get("CELERY_HA_TEST_SPANS"):
    _provider = TracerProvider()
    _provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["CELERY_HA_TEST_SPANS"])))
    trace.set_tracer_provider(_provider)
