"""A plain handler in a worker whose OpenTelemetry SDK exports each ended span to the test's
records (`<prefix>:spans`, JSON): the worker side of tests/test_otel.py. The handler records
the span current while it runs and does what its data asks (misbehave)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.runtime_handlers import conn, key, misbehave, record


class RecordsExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            parent = span.parent
            conn().rpush(
                key("spans"),
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": f"{span.context.trace_id:032x}",
                        "span_id": f"{span.context.span_id:016x}",
                        "parent_id": f"{parent.span_id:016x}" if parent else None,
                        "remote_parent": bool(parent and parent.is_remote),
                        "kind": span.kind.name,
                        "attributes": dict(span.attributes or {}),
                        "events": [event.name for event in span.events],
                        "status": span.status.status_code.name,
                    }
                ),
            )
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(RecordsExporter()))
trace.set_tracer_provider(provider)


def handle(data: dict[str, Any], job: Any) -> None:
    current = trace.get_current_span().get_span_context()
    record("run", data, job, span_id=f"{current.span_id:016x}" if current.is_valid else None)
    misbehave(data, job)
