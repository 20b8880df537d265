"""OpenTelemetry, optional (the `otel` extra): a job continues the trace current at its dispatch.

A dispatch made while a span is current carries that span's W3C traceparent in the job's
record (its `trace` field, not its data); the worker runs such a job's handler inside a span
`queasy.job <queue>` that is a child of it, with the attributes queasy.queue, queasy.job_id,
queasy.attempt and queasy.outcome, and the exception recorded. Without opentelemetry
installed, or with no span current at the dispatch (no tracer configured), a dispatch carries
'' and the worker starts no span. Nothing of opentelemetry is imported by `import queasy_py`:
the first dispatch looks for it once.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

#: the longest trace context kept (the library refuses longer: lua/queasy.lua MAX_TRACE)
MAX_TRACE = 256
#: characters of an error message a span keeps (as the worker's: runtime/results.py)
MAX_MESSAGE = 4000
#: opentelemetry's get_current_span once looked up; None when it is not installed
_current_span: Callable[[], Any] | None = None
_looked_up = False


def _lookup() -> Callable[[], Any] | None:
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    try:
        from opentelemetry.trace import get_current_span
    except ImportError:
        return None
    return get_current_span


def traceparent() -> str:
    """The W3C traceparent of the span current here ('' when none, or no opentelemetry)."""
    global _current_span, _looked_up
    if not _looked_up:
        _current_span, _looked_up = _lookup(), True
    if _current_span is None:
        return ""
    context = _current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _message(exc: BaseException, name: str) -> str:
    """str(exc), cut and made valid UTF-8; `<unprintable NAME>` when its __str__ raises."""
    try:
        text = str(exc)
    except Exception:
        return f"<unprintable {name}>"
    return text[:MAX_MESSAGE].encode("utf-8", "backslashreplace").decode("utf-8")


def traced(handle: Any, is_async: bool, trace: str) -> Any:
    """`handle` run in a span `queasy.job <queue>`, child of the traceparent `trace`; `handle`
    itself when opentelemetry is not installed."""
    if _lookup() is None:
        return handle
    from opentelemetry import trace as api
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": trace})
    tracer = api.get_tracer("queasy_py")

    def span(job: Any) -> Any:
        attempt = job.retry_count + job.stall_count + job.timeout_count + 1
        return tracer.start_as_current_span(
            f"queasy.job {job.queue}",
            context=parent,
            kind=api.SpanKind.CONSUMER,
            attributes={
                "queasy.queue": job.queue,
                "queasy.job_id": job.id,
                "queasy.attempt": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        )

    def failed(current: Any, exc: BaseException) -> None:
        """Never raises: the handler's own exception is what the worker reports."""
        name = type(exc).__name__
        message = _message(exc, name)
        try:
            current.set_attribute("queasy.outcome", "failed")
            try:  # the SDK calls str(exc) first, which may raise; the message given is kept
                current.record_exception(exc, attributes={"exception.message": message})
            except Exception:
                current.add_event(
                    "exception", {"exception.type": name, "exception.message": message}
                )
            current.set_status(api.Status(api.StatusCode.ERROR, f"{name}: {message}"))
        except Exception:  # a span that fails to record is not the job's failure
            pass

    if is_async:

        async def run_async(data: Any, job: Any) -> Any:
            with span(job) as current:
                try:
                    result = await handle(data, job)
                except BaseException as exc:
                    failed(current, exc)
                    raise
                current.set_attribute("queasy.outcome", "finished")
                return result

        return run_async

    def run(data: Any, job: Any) -> Any:
        with span(job) as current:
            try:
                result = handle(data, job)
            except BaseException as exc:
                failed(current, exc)
                raise
            current.set_attribute("queasy.outcome", "finished")
            return result

    return run
