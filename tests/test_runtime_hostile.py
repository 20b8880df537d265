"""One bad job can only fail itself (issue #18): job data that is not JSON, written around the
producer API on the documented key layout; handlers' RetryLater(retry_at=...) values that
are out of range or cannot be encoded; handlers that return an awaitable from a plain
function. Real supervisors and workers; data written with raw HSET.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest
import records
import redis
from runtime_helpers import ACT, FAIL_RECORD, Runtime, queue_spec, wait_for

from queasy_py.runtime.frames import Pipe
from queasy_py.runtime.results import MAX_RETRY_AT
from queasy_py.runtime.worker import Runner
from queasy_py.store.keys import QueueKeys

RETRY_AT = "tests.runtime_handlers.retry_at"
WRAPPED = "tests.runtime_handlers.wrapped_async"
FAST = {"min_backoff": 0.05, "max_backoff": 0.1}


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def overwrite_data(rt: Runtime, queue: str, job_id: str, raw: bytes) -> None:
    """What any producer with access to the keys can do: HSET a waiting job's data."""
    records.garble(rt.r, QueueKeys(rt.prefix, queue, queue).base, job_id, "data", raw)


def by_id(events: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {e["id"]: e for e in events}


# ---------------------------------------------------------------- job data that is not JSON


@pytest.mark.parametrize(
    "raw",
    [b'{"tag": ', b"NaN", b'\xff\xfe"x"', b'"a" "b"', b""],
    ids=["truncated", "nan", "not_utf8", "two_values", "empty"],
)
def test_job_data_that_is_not_json_fails_that_job_alone(rt: Runtime, raw: bytes) -> None:
    q = rt.queue("q")
    q.dispatch({"tag": "innocent"}, id="i1")
    q.dispatch({"tag": "bad"}, id="bad")
    q.dispatch_many({"data": {"tag": "innocent"}, "id": f"i{n}"} for n in (2, 3))
    overwrite_data(rt, "q", "bad", raw)
    # one worker and room for all: the four jobs go to it in one batch
    sup = rt.start({"q": queue_spec()}, workers=1)

    events = by_id(rt.wait_events("q", 4))
    bad = events.pop("bad")
    assert (bad["outcome"], bad["error_name"], bad["error_kind"]) == (
        "failed",
        "InvalidJobData",
        "permanent",
    )
    assert {(e["outcome"], e["stall_count"]) for e in events.values()} == {("finished", "0")}
    ends = rt.records("end", tag="innocent")
    assert len(ends) == 3 and len({e["pid"] for e in ends}) == 1  # one worker, never replaced
    assert rt.records(id="bad") == []  # its handler never ran
    assert sup.workers() == {ends[0]["pid"]}


def test_a_trace_that_is_not_utf8_does_not_stop_the_jobs_dequeued_with_it(rt: Runtime) -> None:
    """Raw Redis access can write a waiting job's trace field: the job still runs (its trace
    decoded with replacement characters, as a pushed job's is), and so do the jobs dequeued
    in the same reply (one bad field used to drop the whole reply, until a reconcile)."""
    q = rt.queue("q")
    q.dispatch_many({"data": {"tag": "innocent"}, "id": f"i{n}"} for n in (1, 2, 3))
    q.dispatch({"tag": "odd trace"}, id="odd")
    records.garble(rt.r, QueueKeys(rt.prefix, "q", "q").base, "odd", "trace", b"\xff\xfe-not-utf8")
    rt.start({"q": queue_spec()}, workers=1)  # room for all four in one dequeue

    events = by_id(rt.wait_events("q", 4, timeout=20))
    assert {(e["outcome"], e["stall_count"]) for e in events.values()} == {("finished", "0")}
    assert len(rt.records("end", tag="innocent")) == 3
    assert len(rt.records("end", tag="odd trace")) == 1


def test_job_data_cannot_close_the_job_array_and_run_another_queues_handler(
    rt: Runtime,
) -> None:
    q = rt.queue("q")
    q.dispatch({"tag": "victim"}, id="victim")
    q.dispatch({"tag": "innocent"}, id="innocent")
    injected = b'null,0,0,0,0],[424242,"admin","injected-id",{"tag":"injected"}'
    overwrite_data(rt, "q", "victim", injected)
    sup = rt.start({"q": queue_spec(), "admin": queue_spec()}, workers=1)

    events = by_id(rt.wait_events("q", 2))
    assert (events["victim"]["outcome"], events["victim"]["error_name"]) == (
        "failed",
        "InvalidJobData",
    )
    assert events["innocent"]["outcome"] == "finished"
    rt.queue("admin").dispatch({"tag": "canary"}, id="canary")  # admin's handler does run
    rt.wait_records(1, "end", tag="canary")
    assert rt.records(tag="injected") == [] and rt.records(id="injected-id") == []
    assert rt.records(id="victim") == []
    assert len(sup.workers()) == 1


@pytest.mark.parametrize("raw", [b"[1, 2", b'1, {"id": "forged"}, {"name": "Forged"}, 4'])
def test_a_fail_handler_gets_null_data_and_the_invalid_job_data_error(
    rt: Runtime, raw: bytes
) -> None:
    rt.queue("q").dispatch({"tag": "bad"}, id="bad")
    overwrite_data(rt, "q", "bad", raw)
    rt.start({"q": queue_spec(max_retries=5, fail_handler=FAIL_RECORD)}, workers=1)
    (fail,) = rt.wait_records(1, "fail")
    data, job, error = fail["given"]  # exactly three: the raw data reshaped nothing
    assert data is None and job["id"] == "bad"
    assert (error["name"], error["kind"]) == ("InvalidJobData", "permanent")
    assert "is not valid JSON" in error["message"] and repr(raw[:10])[2:-1] in error["message"]
    (event,) = rt.wait_events("q", 1)
    assert (event["outcome"], event["retry_count"]) == ("failed", "0")  # at once, no retries


# ---------------------------------------------------------------- RetryLater(retry_at=...)


@pytest.mark.parametrize(
    "at",
    [
        ["float", "inf"],
        ["float", "-inf"],
        ["float", "nan"],
        ["float", "1e308"],
        ["float", "1e300"],
        ["float", str(MAX_RETRY_AT + 1)],
        ["float", "-1"],
        ["raw", True],
        ["raw", "soon"],
        ["datetime", "9999-12-31T23:59:59.999999+00:00"],
    ],
    ids=lambda at: "_".join(str(x) for x in at),
)
def test_a_retry_at_out_of_range_is_dropped_for_the_normal_backoff(rt: Runtime, at: list) -> None:
    sup = rt.start({"q": queue_spec(RETRY_AT, **FAST)}, workers=1)
    rt.queue("q").dispatch({"tag": "r", "at": at}, id="r")
    (end,) = rt.wait_records(1, "end", tag="r", timeout=10.0)
    (start, _) = rt.records("start", tag="r")
    assert end["retry_count"] == 1 and end["pid"] == start["pid"]
    assert end["t"] - start["t"] < 5.0  # backoff of 0.05-0.1 s, not a date in the far future
    retried, finished = rt.wait_events("q", 2)
    assert (retried["outcome"], retried["error_name"]) == ("retried", "RetryLater")
    assert finished["outcome"] == "finished"
    assert psutil.pid_exists(sup.pid) and sup.proc.poll() is None


def test_a_retry_at_at_the_bound_is_kept(rt: Runtime) -> None:
    rt.start({"q": queue_spec(RETRY_AT)}, workers=1)
    rt.queue("q").dispatch({"tag": "r", "at": ["float", str(MAX_RETRY_AT)]}, id="r")
    (retried,) = rt.wait_events("q", 1)
    assert retried["outcome"] == "retried"
    waiting = QueueKeys(rt.prefix, "q", "q").waiting
    assert rt.r.zscore(waiting, "r") == MAX_RETRY_AT * 1000


def test_a_job_delayed_to_the_bound_can_be_read_back(rt: Runtime) -> None:
    rt.start({"q": queue_spec(RETRY_AT)}, workers=1)
    rt.queue("q").dispatch({"tag": "r", "at": ["float", str(MAX_RETRY_AT)]}, id="r")
    rt.wait_events("q", 1)
    job = rt.queue("q").get_job("r")
    assert job is not None and job.state == "delayed" and job.run_at == MAX_RETRY_AT


@pytest.mark.parametrize("kind", ["decimal", "stamp"])
def test_a_decimal_retry_at_is_coerced_and_the_worker_goes_on(rt: Runtime, kind: str) -> None:
    """A Decimal, or a datetime-like whose timestamp() is a Decimal (orjson encodes neither)."""
    sup = rt.start({"q": queue_spec(RETRY_AT, timeout=5.0)}, workers=1)
    wanted = time.time() + 0.5
    rt.queue("q").dispatch({"tag": "d", "at": [kind, repr(wanted)]}, id="d")
    (end,) = rt.wait_records(1, "end", tag="d")
    assert end["t"] >= wanted - 0.01  # retried at the time it asked for
    # the worker's sender is alive: later jobs finish on the same worker, once each
    rt.queue("q").dispatch_many({"data": {"tag": "after", "at": ["raw", None]}} for _ in range(3))
    afters = rt.wait_records(6, tag="after")  # a start and an end each
    assert {a["pid"] for a in afters} == {end["pid"]}
    events = rt.wait_events("q", 2 + 6)
    assert [e["outcome"] for e in events].count("timed_out") == 0
    assert len(sup.workers()) == 1


def test_the_results_survive_a_result_it_cannot_encode() -> None:
    """The worker's sending of results, in this process (each thread that adds a result
    sends what waits after it): a result orjson cannot encode becomes a permanent failure
    of its job, and the next result is still sent."""
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)
    runner = Runner(Pipe(theirs), {})
    mine = Pipe(ours)
    runner._done(1, 100, {"name": "X", "message": "m", "kind": "retriable", "retry_at": object()})
    runner.flush()
    (seq, started, error) = orjson.loads(mine.recv_frame())[0]
    assert (seq, started, error["kind"]) == (1, 100, "permanent")
    assert error["name"] == "UnencodableResult"
    runner._done(2, 200, None)
    runner.flush()
    assert orjson.loads(mine.recv_frame()) == [[2, 200, None]]
    mine.close()


# ---------------------------------------------------------------- awaitables


@pytest.mark.parametrize("nested", [False, True])
def test_a_plain_handler_returning_a_coroutine_runs_it(rt: Runtime, nested: bool) -> None:
    rt.start({"q": queue_spec(WRAPPED)}, workers=1)
    rt.queue("q").dispatch({"tag": "w", "nested": nested}, id="w")
    (event,) = rt.wait_events("q", 1)
    assert event["outcome"] == "finished"
    (end,) = rt.records("end", tag="w")  # recorded before the finish: the coroutine ran
    assert end.get("nested", False) is nested


def test_an_awaitable_that_raises_fails_the_job(rt: Runtime) -> None:
    rt.start({"q": queue_spec(WRAPPED)}, workers=1)
    rt.queue("q").dispatch({"tag": "w", "raise": "permanent"}, id="w")
    (event,) = rt.wait_events("q", 1)
    assert (event["outcome"], event["error_name"], event["error_kind"]) == (
        "failed",
        "PermanentError",
        "permanent",
    )
    assert rt.records("start", tag="w") and rt.records("end", tag="w") == []


def test_plain_handlers_still_finish_alongside(rt: Runtime) -> None:
    rt.start({"q": queue_spec(WRAPPED), "p": queue_spec(ACT)}, workers=1)
    rt.queue("q").dispatch({"tag": "w"}, id="w")
    rt.queue("p").dispatch({"tag": "p"}, id="p")
    wait_for(lambda: rt.records("end", tag="w") and rt.records("end", tag="p"))


def test_many_awaitables_from_plain_handlers_at_once_share_one_event_loop(rt: Runtime) -> None:
    """Pool threads start them side by side: one loop thread is made, never two."""
    rt.queue("q").dispatch_many({"data": {"tag": "many", "barrier": 10}} for _ in range(10))
    rt.start({"q": queue_spec(WRAPPED)}, workers=1)
    ends = rt.wait_records(10, "end", tag="many")
    assert len({e["pid"] for e in ends}) == 1
    assert len({e["loop_thread"] for e in ends}) == 1
    assert {e["outcome"] for e in rt.wait_events("q", 10)} == {"finished"}
