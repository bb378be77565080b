"""tests.support.app's RecordingWorker in a process whose OpenTelemetry SDK
writes each finished span as one JSON line to ``SQLA_QUEUE_TEST_SPANS``: the
worker module is where an application configures its SDK for the CLI."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.support.app import RecordingWorker

__all__ = ["RecordingWorker"]


class _JsonLines(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                context = span.get_span_context()
                assert context is not None
                record = {
                    "name": span.name,
                    "scope": span.instrumentation_scope.name
                    if span.instrumentation_scope
                    else None,
                    "trace_id": f"{context.trace_id:032x}",
                    "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes or {}),
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_JsonLines(os.environ["SQLA_QUEUE_TEST_SPANS"])))
trace.set_tracer_provider(_provider)
