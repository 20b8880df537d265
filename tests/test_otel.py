"""OpenTelemetry (issue 15): the trace context current at a dispatch travels in the job's
record (lua/queasy.lua `trace`), and the worker runs the handler in a span `queasy.job
<queue>` that is its child, across the process boundary; without a current span a job
carries none and its worker starts no span."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from lua_calls import NOW, Lua
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py import tracing
from queasy_py.store.library import ensure_loaded

TRACED = "tests.runtime_handlers.traced"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


@pytest.fixture
def tracer() -> Iterator[tuple[object, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def spans(rt: Runtime) -> list[dict]:
    return [json.loads(x) for x in rt.r.lrange(f"{rt.prefix}:spans", 0, -1)]


def test_the_jobs_span_is_a_child_of_the_span_current_at_dispatch(
    rt: Runtime, tracer: tuple
) -> None:
    otel, exporter = tracer
    rt.start({"q": queue_spec(TRACED, max_retries=3, min_backoff=0.05)}, workers=1)
    q = rt.queue("q")
    with otel.start_as_current_span("web request") as request:
        q.dispatch({"tag": "ok"}, id="ok")
        q.dispatch_many([{"data": {"raise": "retriable", "times": 1}, "id": "again"}])
        q.dispatch({"raise": "permanent", "message": "no way"}, id="bad")
    q.dispatch({"tag": "plain"}, id="plain")  # no span current: no trace, no span
    wait_for(lambda: len(rt.records("run")) == 5 and len(spans(rt)) == 4, 30)

    (parent,) = exporter.get_finished_spans()
    trace_id = f"{parent.context.trace_id:032x}"
    span_id = f"{parent.context.span_id:016x}"
    assert request.get_span_context().span_id == parent.context.span_id
    got = {
        (s["attributes"]["queasy.job_id"], s["attributes"]["queasy.attempt"]): s for s in spans(rt)
    }
    assert set(got) == {("ok", 1), ("again", 1), ("again", 2), ("bad", 1)}
    for span in got.values():
        assert span["name"] == "queasy.job q"
        assert span["kind"] == "CONSUMER"
        assert (span["trace_id"], span["parent_id"], span["remote_parent"]) == (
            trace_id,
            span_id,
            True,
        )
        assert span["attributes"]["queasy.queue"] == "q"
    assert got[("ok", 1)]["attributes"]["queasy.outcome"] == "finished"
    assert got[("ok", 1)]["status"] == "UNSET"
    assert got[("again", 2)]["attributes"]["queasy.outcome"] == "finished"
    for failed in (got[("again", 1)], got[("bad", 1)]):
        assert failed["attributes"]["queasy.outcome"] == "failed"
        assert failed["events"] == ["exception"]
        assert failed["status"] == "ERROR"
    # the handler ran inside its job's span; the untraced job in none
    runs = {(rec["id"], rec["retry_count"]): rec["span_id"] for rec in rt.records("run")}
    assert runs[("ok", 0)] == got[("ok", 1)]["span_id"]
    assert runs[("plain", 0)] is None


def test_a_dispatch_without_a_current_span_carries_no_trace(tracer: tuple) -> None:
    otel, _ = tracer
    assert tracing.traceparent() == ""
    with otel.start_as_current_span("request"):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)  # OpenTelemetry's own W3C header
        assert tracing.traceparent() == carrier["traceparent"]


def test_the_library_keeps_the_trace_through_dequeue_and_retry(lua: Lua) -> None:
    lua.add("a", trace=PARENT)
    lua.add("b")
    checkout = lua.dequeue(limit=2)
    assert {(j.id, j.trace) for j in checkout.jobs} == {("a", PARENT), ("b", "")}
    (a,) = [j for j in checkout.jobs if j.id == "a"]
    lua.retry("c1", a, run_at=NOW)  # the next attempt continues the same trace
    assert lua.dequeue(limit=1).jobs[0].trace == PARENT
    # a dispatch updating a waiting job keeps the trace it has
    lua.add("c", trace=PARENT)
    lua.add("c", trace="")
    assert lua.dequeue(limit=1).jobs[0].trace == PARENT


def test_the_library_refuses_a_trace_that_is_not_a_traceparent(lua: Lua) -> None:
    for bad in ("00-xyz", "a b", "0" * 257, "00-AB"):
        with pytest.raises(redis.ResponseError, match="INVALID trace must be a W3C"):
            lua.add("x", trace=bad)
        assert lua.record("x") is None
    assert lua.add("x", trace="0" * 256) == 1


def test_a_traced_jobs_hard_to_print_error_keeps_its_outcome_and_a_bounded_status(
    rt: Runtime, tracer: tuple
) -> None:
    """The span of a job whose handler raises an exception whose __str__ raises (a
    PermanentError) or one of a 10 MB message: the job fails as it would untraced (at once,
    named as raised, not as the span's own error) and the span's status is readable and cut."""
    otel, _ = tracer
    rt.start({"q": queue_spec(TRACED, max_retries=3, min_backoff=0.05)}, workers=1)
    q = rt.queue("q")
    with otel.start_as_current_span("request"):
        q.dispatch({"unprintable": True}, id="unprintable")
        q.dispatch({"huge": True}, id="huge")
    events = rt.wait_events("q", 3)
    outcomes = {(e["id"], e["outcome"]): e for e in events}
    assert set(outcomes) == {("unprintable", "failed"), ("huge", "retried"), ("huge", "finished")}
    failed = outcomes[("unprintable", "failed")]
    assert (failed["error_name"], failed["error_kind"]) == ("Unprintable", "permanent")
    assert outcomes[("huge", "retried")]["error_name"] == "ValueError"
    got = {
        (s["attributes"]["queasy.job_id"], s["attributes"]["queasy.outcome"]): s
        for s in wait_for(lambda: len(spans(rt)) == 3 and spans(rt))
    }
    assert set(got) == {("unprintable", "failed"), ("huge", "failed"), ("huge", "finished")}
    for span in (got[("unprintable", "failed")], got[("huge", "failed")]):
        assert (span["status"], span["events"]) == ("ERROR", ["exception"])
    assert got[("unprintable", "failed")]["description"] == "Unprintable: <unprintable Unprintable>"
    assert got[("huge", "failed")]["description"].startswith("ValueError: mmm")
    assert len(got[("huge", "failed")]["description"]) <= 4100
