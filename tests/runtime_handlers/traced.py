"""A plain handler in a worker whose OpenTelemetry SDK exports each ended span to the test's
records (`<prefix>:spans`, JSON): the worker side of tests/test_otel.py. The handler records
the span current while it runs and does what its data asks (misbehave; "unprintable": raise a
PermanentError whose __str__ raises, "huge": a ValueError of a 10 MB message, at the first
attempt)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from queasy_py import PermanentError
from tests.runtime_handlers import conn, key, misbehave, record


class Unprintable(PermanentError):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of this exception fails")


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
                        "description": span.status.description,
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
    if data.get("unprintable"):
        raise Unprintable("never shown")
    if data.get("huge") and not job.retry_count:
        raise ValueError("m" * 10_000_000)
    misbehave(data, job)
