"""The runtime as real processes against the real server: completion, retries, fail handlers,
singleton jobs, capacity and priority, async handlers, handler checks, recycling, events.

Faults (timeouts, crashes, zombies, shutdown) are in test_runtime_faults.py.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from lua_calls import live
from runtime_helpers import (
    ACT,
    ACT_ASYNC,
    EVENT_FIELDS,
    FAIL_RECORD,
    ON_CLUSTER,
    Runtime,
    max_units_in_flight,
    queue_spec,
    wait_for,
)

from queasy_py import Client, HandlerError
from queasy_py.runtime.scheduler import SHARE

FAST_FAIL = {"min_backoff": 0.05, "max_backoff": 0.1}


def job_record(job_id: str, queue: str, run_at: float, **counts: int) -> dict:
    """The `job` of a fail job's [data, job, error]."""
    zero = {"retry_count": 0, "stall_count": 0, "timeout_count": 0}
    return {"id": job_id, "queue": queue, "run_at": run_at, **zero, **counts}


# ---------------------------------------------------------------- completion and wake-ups


@ON_CLUSTER
def test_dispatched_jobs_all_run_once_and_finish(rt: Runtime) -> None:
    q = rt.queue("q")
    ids = q.dispatch_many({"data": {"tag": f"j{i}", "sleep": 0.05}} for i in range(40))
    sup = rt.start({"q": queue_spec()}, workers=2)

    events = rt.wait_events("q", 40)
    assert sorted(e["id"] for e in events) == sorted(ids)
    assert {e["outcome"] for e in events} == {"finished"}
    starts = rt.records("start")
    assert sorted(s["id"] for s in starts) == sorted(ids)  # each ran exactly once
    workers = sup.workers()
    assert len(workers) == 2 and {s["pid"] for s in starts} <= workers  # no worker was lost
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert sup.stop() == 0


@ON_CLUSTER
def test_a_dispatch_wakes_an_idle_supervisor_and_delayed_jobs_run_on_time(rt: Runtime) -> None:
    # poll_interval 30 s: only the wake-up message or the sleep until run_at can start them
    rt.start({"q": queue_spec()}, poll_interval=30.0)
    q = rt.queue("q")
    q.dispatch({"tag": "warm-up"})
    rt.wait_records(1, "end", tag="warm-up")  # the supervisor is idle now

    sent = time.time()
    q.dispatch({"tag": "now"})
    (start,) = rt.wait_records(1, "start", tag="now")
    assert start["t"] - sent < 1.0

    run_at = time.time() + 1.0
    q.dispatch({"tag": "later"}, run_at=run_at)
    (start,) = rt.wait_records(1, "start", tag="later")
    assert run_at <= start["t"] < run_at + 1.0


# ---------------------------------------------------------------- retries and fail handlers


@ON_CLUSTER
def test_a_retry_waits_for_its_backoff(rt: Runtime) -> None:
    # poll_interval 30 s: the supervisor must sleep until the retry's run_at, not poll
    rt.start({"q": queue_spec(min_backoff=0.4, max_backoff=10.0)}, poll_interval=30.0)
    rt.queue("q").dispatch({"tag": "r", "raise": "retriable", "times": 2}, id="r")

    rt.wait_records(3, "start", tag="r")
    starts = rt.records("start", tag="r")
    assert [s["retry_count"] for s in starts] == [0, 1, 2]
    for n in (0, 1):
        # the failed run ended before its record of the next start; backoff 0.4 * 2**n,
        # with a jitter of at most +25%, plus the supervisor's reaction time
        gap = starts[n + 1]["t"] - starts[n]["t"]
        backoff = 0.4 * 2**n
        assert backoff <= gap < backoff * 1.25 + 1.0
    outcomes = [(e["outcome"], e["error_name"], e["error_kind"]) for e in rt.wait_events("q", 3)]
    assert outcomes == [
        ("retried", "ValueError", "retriable"),
        ("retried", "ValueError", "retriable"),
        ("finished", "", ""),
    ]


def test_retry_at_of_the_exception_sets_the_retry_time(rt: Runtime) -> None:
    rt.start({"q": queue_spec(min_backoff=30.0, max_backoff=60.0)}, poll_interval=30.0)
    rt.queue("q").dispatch({"tag": "r", "raise": "retry_later", "retry_in": 1.0, "times": 1})

    first, second = rt.wait_records(2, "start", tag="r")
    assert 1.0 <= second["t"] - first["t"] < 2.0  # not min_backoff


@pytest.mark.parametrize(
    ("raised", "name"), [("permanent", "PermanentError"), ("kind_permanent", "KindPermanent")]
)
@ON_CLUSTER
def test_a_permanent_error_fails_at_once_into_the_fail_handler(
    rt: Runtime, raised: str, name: str
) -> None:
    rt.start({"q": queue_spec(fail_handler=FAIL_RECORD, fail_options=FAST_FAIL)})
    data = {"tag": "p", "raise": raised, "message": "no way", "nested": [1, {"x": None}]}
    run_at = 1_700_000_000.123
    rt.queue("q").dispatch(data, id="job-1", run_at=run_at)

    (fail,) = rt.wait_records(1, "fail")
    trace = fail["given"][2].pop("traceback")  # the handler's, as the worker formatted it
    assert trace.startswith("Traceback (most recent call last):\n")
    assert trace.rstrip().endswith(f"{name}: no way") and "in misbehave" in trace
    assert fail["given"] == [
        data,
        job_record("job-1", "q", run_at),
        {"name": name, "message": "no way", "kind": "permanent"},
    ]
    assert fail["queue"] == "q-fail"
    assert len(rt.records("start", tag="p")) == 1  # never retried
    (failed,) = rt.events("q")
    assert (failed["outcome"], failed["error_name"], failed["error_kind"]) == (
        "failed",
        name,
        "permanent",
    )
    assert [e["outcome"] for e in rt.wait_events("q-fail", 1, tag="q")] == ["finished"]
    assert rt.queue("q").get_job("job-1").state == "failed"  # type: ignore[union-attr]


def test_exhausted_retries_go_to_the_fail_handler_as_retriable(rt: Runtime) -> None:
    rt.start(
        {"q": queue_spec(max_retries=2, **FAST_FAIL, fail_handler=FAIL_RECORD)},
    )
    data = {"tag": "x", "raise": "retriable", "message": "boom"}
    run_at = 1_700_000_000.0
    rt.queue("q").dispatch(data, id="x", run_at=run_at)

    (fail,) = rt.wait_records(1, "fail")
    assert fail["given"][2].pop("traceback").rstrip().endswith("ValueError: boom")
    assert [s["retry_count"] for s in rt.records("start", tag="x")] == [0, 1, 2]
    # the fail handler sees the job as last run: run_at is that of its last retry
    last_run_at = fail["given"][1]["run_at"]
    assert last_run_at > run_at
    assert fail["given"] == [
        data,
        job_record("x", "q", last_run_at, retry_count=2),
        {"name": "ValueError", "message": "boom", "kind": "retriable"},
    ]
    outcomes = [(e["outcome"], e["retry_count"], e["error_kind"]) for e in rt.events("q")]
    assert outcomes == [
        ("retried", "1", "retriable"),
        ("retried", "2", "retriable"),
        ("failed", "2", "retriable"),
    ]


def test_without_a_fail_handler_a_failed_job_is_removed(rt: Runtime) -> None:
    rt.start({"q": queue_spec()})
    rt.queue("q").dispatch({"tag": "p", "raise": "permanent"}, id="p")
    (failed,) = rt.wait_events("q", 1)
    assert failed["outcome"] == "failed"
    assert rt.queue("q").get_job("p").state == "failed"  # type: ignore[union-attr]
    assert rt.events("q-fail", tag="q") == []


# ---------------------------------------------------------------- singleton, capacity, priority


@ON_CLUSTER
def test_a_job_dispatched_again_while_active_runs_after_it_never_alongside(rt: Runtime) -> None:
    rt.start({"q": queue_spec()}, workers=2)
    q = rt.queue("q")
    q.dispatch({"tag": "v1", "sleep": 1.0}, id="one")
    rt.wait_records(1, "start", tag="v1")
    q.dispatch({"tag": "v2", "sleep": 0.1}, id="one")
    assert q.get_job("one").state == "active"  # type: ignore[union-attr]

    (second,) = rt.wait_records(1, "start", tag="v2")
    (first_end,) = rt.records("end", tag="v1")
    assert second["t"] >= first_end["t"]
    rt.wait_records(1, "end", tag="v2")
    assert [e["outcome"] for e in rt.wait_events("q", 2)] == ["finished", "finished"]
    assert len(rt.records("start")) == 2
    last = q.get_job("one")  # the end of the second run: one job with that id
    assert last is not None and last.state == "finished" and last.attempts == 1
    assert last.started_at is not None and last.started_at >= first_end["t"] - 0.01
    assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


def test_units_in_flight_never_exceed_a_workers_capacity(rt: Runtime) -> None:
    big = [{"data": {"tag": "big", "units": 100, "sleep": 0.2}} for _ in range(4)]
    small = [{"data": {"tag": "small", "units": 10, "sleep": 0.2}} for _ in range(30)]
    rt.queue("big").dispatch_many(big)
    rt.queue("small").dispatch_many(small)
    rt.start({"big": queue_spec(size=100), "small": queue_spec(size=10)}, workers=1)

    rt.wait_records(34, "end")
    records = rt.records()
    assert max_units_in_flight(records) <= 100
    # the check means something: small jobs did share the worker
    assert max_units_in_flight([r for r in records if r["tag"] == "small"]) >= 50


def test_a_higher_priority_queue_is_served_first_under_contention(rt: Runtime) -> None:
    rt.queue("low").dispatch_many({"data": {"tag": "low"}} for _ in range(5))
    rt.queue("high").dispatch_many({"data": {"tag": "high"}} for _ in range(5))
    rt.start(
        {
            "low": queue_spec(size=100, priority=100),
            "high": queue_spec(size=100, priority=200),
        },
        workers=1,
    )
    rt.wait_records(10, "end")
    assert [s["tag"] for s in rt.records("start")] == ["high"] * 5 + ["low"] * 5


def test_busy_queues_of_equal_priority_take_turns_none_waits_for_the_others_to_drain(
    rt: Runtime,
) -> None:
    """Each busy queue of a priority takes the free slots of a round in its turn (a share of
    up to SHARE jobs), the queue asked longest ago first: in the loop, where a queue's turn
    is marked when its dequeue is sent, every queue is served while the others still have
    jobs waiting, not one after another has drained."""
    names = ["a", "b", "c", "d"]
    for name in names:
        rt.queue(name).dispatch_many({"data": {"tag": name, "sleep": 0.002}} for _ in range(40))
    rt.start({name: queue_spec() for name in names}, workers=1)
    rt.wait_records(160, "start", timeout=60)
    starts = [s["tag"] for s in rt.records("start")]
    # a turn is at most SHARE jobs (here at most the worker's 10 units), and the queue asked
    # longest ago goes next: while a queue has jobs waiting, at most one turn of each other
    # queue comes between two of its own. Draining one queue after another would put 120
    # starts before d's first, and 40 between two starts of none.
    for name in names:
        at = [i for i, tag in enumerate(starts) if tag == name]
        gaps = [after - before - 1 for before, after in zip([-1, *at], at, strict=False)]
        assert max(gaps) <= 3 * SHARE, (name, gaps, starts)


def test_a_big_high_priority_job_is_not_starved_by_small_lower_priority_ones(rt: Runtime) -> None:
    # one worker of 100 units: while small jobs (10 units) keep arriving, it never has 100
    # free unless the scheduler keeps it for the big queue (a reservation) and lets it drain
    rt.start(
        {
            "big": queue_spec(size=100, priority=200),
            "small": queue_spec(size=10, priority=100),
        },
        workers=1,
    )
    small = [{"data": {"tag": "small", "units": 10, "sleep": 0.02}} for _ in range(200)]
    rt.queue("small").dispatch_many(small)
    rt.wait_records(1, "start", tag="small")  # the worker is full of small jobs
    rt.queue("big").dispatch({"tag": "big", "units": 100})

    rt.wait_records(1, "end", tag="big", timeout=30)
    rt.wait_records(200, "end", tag="small", timeout=30)  # both queues finish
    starts = [s["tag"] for s in rt.records("start")]
    assert starts.count("small") == 200 and starts.count("big") == 1
    # the big job started while small ones were still waiting, not after they all ran
    assert starts.index("big") < len(starts) - 1
    assert max_units_in_flight(rt.records()) <= 100


def test_a_big_job_is_not_starved_by_small_ones_of_its_priority(rt: Runtime) -> None:
    # as above, at one priority: without its turn held, the small queue (always fitting)
    # refilled the worker at each result and the big job waited for all 200 to run
    rt.start(
        {"big": queue_spec(size=60, priority=100), "small": queue_spec(size=10, priority=100)},
        workers=1,
    )
    # ends spread out: the worker never frees 60 units at once unless it is kept for big
    small = [
        {"data": {"tag": "small", "units": 10, "sleep": 0.01 + 0.003 * (i % 7)}} for i in range(200)
    ]
    rt.queue("small").dispatch_many(small)
    rt.wait_records(1, "start", tag="small")  # the worker is full of small jobs
    rt.queue("big").dispatch({"tag": "big", "units": 60})

    rt.wait_records(1, "end", tag="big", timeout=30)
    rt.wait_records(200, "end", tag="small", timeout=30)
    starts = [s["tag"] for s in rt.records("start")]
    assert starts.count("small") == 200 and starts.count("big") == 1
    assert starts.index("big") < len(starts) - 50, starts.index("big")
    assert max_units_in_flight(rt.records()) <= 100


# ---------------------------------------------------------------- handlers


def test_async_handlers_run_concurrently_on_the_workers_event_loop(rt: Runtime) -> None:
    rt.queue("q").dispatch_many({"data": {"tag": "a", "units": 10, "sleep": 0.5}} for _ in range(8))
    rt.queue("q").dispatch({"tag": "bad", "raise": "permanent"}, id="bad")
    rt.start({"q": queue_spec(ACT_ASYNC)}, workers=1)

    rt.wait_records(8, "end", tag="a")
    starts = rt.records("start", tag="a")
    assert all(s["in_loop"] for s in starts)
    assert len({s["thread"] for s in starts}) == 1  # one event loop thread
    assert max_units_in_flight(rt.records(tag="a")) >= 50  # they overlapped
    outcomes = {(e["id"], e["outcome"]) for e in rt.wait_events("q", 9)}
    assert ("bad", "failed") in outcomes


@pytest.mark.parametrize(
    ("handler", "fail_handler", "says"),
    [
        ("tests.runtime_handlers.broken", None, "broken on purpose"),
        ("tests.runtime_handlers.no_handle", None, "no callable handle"),
        ("tests.runtime_handlers.missing", None, "No module named"),
        (ACT, "tests.runtime_handlers.missing", "No module named"),
    ],
)
def test_a_handler_that_does_not_load_stops_listen_before_any_job_is_taken(
    rt: Runtime, handler: str, fail_handler: str | None, says: str
) -> None:
    q = rt.queue("q")
    q.dispatch({"tag": "j"}, id="j")
    sup = rt.start({"q": queue_spec(handler, fail_handler=fail_handler)})

    assert sup.wait() != 0
    log = sup.log()
    assert "queasy_py.errors.HandlerError" in log and says in log
    assert q.get_job("j").state == "waiting"  # type: ignore[union-attr]
    assert rt.events("q") == [] and rt.records() == []


def test_listen_raises_handler_error_in_process(redis_url: str, prefix: str) -> None:
    with Client(redis_url, workers=1, prefix=prefix) as client:
        with pytest.raises(HandlerError, match="no callable handle"):
            client.queue("q").listen("json")
        with pytest.raises(HandlerError, match="failed to import"):
            client.queue("q").listen("no_such_module_here")
        assert client.listeners == {}


def test_max_jobs_per_worker_recycles_workers(rt: Runtime) -> None:
    rt.queue("q").dispatch_many({"data": {"tag": f"j{i}"}} for i in range(7))
    sup = rt.start({"q": queue_spec(size=100)}, workers=1, max_jobs_per_worker=3)

    rt.wait_records(7, "end")
    pids = [s["pid"] for s in rt.records("start")]
    assert pids == [pids[0]] * 3 + [pids[3]] * 3 + [pids[6]]
    assert len(set(pids)) == 3
    assert {e["outcome"] for e in rt.wait_events("q", 7)} == {"finished"}
    wait_for(lambda: sup.workers() == {pids[6]}, what="the recycled workers to exit")


# ---------------------------------------------------------------- outcome events


def test_each_outcome_writes_one_event_with_the_documented_fields(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec(**FAST_FAIL, fail_handler=FAIL_RECORD)})
    q = rt.queue("q")
    q.dispatch({"tag": "ok"}, id="ok", run_at=1_700_000_000.5)
    rt.wait_records(1, "end", tag="ok")
    q.dispatch({"tag": "again", "raise": "retriable", "times": 1}, id="again")
    rt.wait_records(1, "end", tag="again")
    q.dispatch({"tag": "bad", "raise": "permanent", "message": "m"}, id="bad")
    rt.wait_records(1, "fail")
    q.dispatch({"tag": "gone"}, id="gone", delay=60)
    assert q.cancel("gone")

    events = rt.wait_events("q", 5)
    assert all(set(e) == EVENT_FIELDS for e in events)
    assert [(e["id"], e["outcome"], e["error_name"], e["error_kind"]) for e in events] == [
        ("ok", "finished", "", ""),
        ("again", "retried", "ValueError", "retriable"),
        ("again", "finished", "", ""),
        ("bad", "failed", "PermanentError", "permanent"),
        ("gone", "cancelled", "", ""),
    ]
    assert {e["queue"] for e in events} == {"q"}
    ran = events[:4]
    starts = rt.records("start")
    for event, start in zip(ran, starts, strict=True):
        assert event["pid"] == str(start["pid"])
        assert sup.client_of(event)
        assert abs(int(event["started_at"]) - start["t"] * 1000) < 250
        assert int(event["started_at"]) <= int(event["ended_at"])
    assert events[0]["run_at"] == "1700000000500"
    assert [e["retry_count"] for e in ran] == ["0", "1", "1", "0"]
    assert all(e["stall_count"] == e["timeout_count"] == "0" for e in events)


def test_stop_called_while_run_starts_is_not_lost(redis_url: str, prefix: str) -> None:
    """stop() from another thread while run() is still starting (its workers, the connection,
    the supervisor not made yet) found no supervisor to tell and did nothing: run() then
    supervised until the next stop() or signal (for ever, for a caller that stops once)."""
    client = Client(redis_url, workers=1, prefix=prefix)
    client.queue("q").listen(ACT)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["code"] = client.run()
        except BaseException as exc:  # noqa: BLE001 (the outcome is what is asserted)
            outcome["code"] = exc

    thread = threading.Thread(target=run)
    try:
        thread.start()
        wait_for(client._running.locked, what="run() to begin")
        assert client._supervisor is None  # still starting
        client.stop()
        thread.join(timeout=20)
        assert not thread.is_alive(), "run() went on after stop()"
        assert outcome["code"] == 0
    finally:
        while thread.is_alive():
            client.stop()
            thread.join(timeout=0.5)
        client.close()
    assert client.stop() is None  # nothing runs: a no-op


def test_a_stop_with_nothing_running_does_not_stop_the_next_run(
    redis_url: str, prefix: str
) -> None:
    client = Client(redis_url, workers=1, prefix=prefix)
    client.queue("q").listen(ACT)
    client.stop()  # before any run(): nothing to stop
    thread = threading.Thread(target=client.run)
    try:
        thread.start()
        wait_for(lambda: client._supervisor is not None, what="the supervisor to run")
        time.sleep(0.5)
        assert thread.is_alive(), "run() stopped by a stop() made before it"
    finally:
        while thread.is_alive():
            client.stop()
            thread.join(timeout=0.5)
        client.close()


#: a decorator that passes the wrapped function's return value through (functools.wraps)
WRAPS = (
    "import functools\ndef logged(fn):\n    @functools.wraps(fn)\n"
    "    def wrapper(data, job): return fn(data, job)\n    return wrapper\n"
)

HANDLE_KINDS = {
    "partial": "import functools\nasync def f(x, data, job): return x\n"
    "handle = functools.partial(f, 'partial')\n",
    "static": "async def f(data, job): return 'static'\nhandle = staticmethod(f)\n",
    "instance": "class H:\n    def __call__(self, data, job): return 'instance'\nhandle = H()\n",
    "generator": "def handle(data, job):\n    yield 1\n",
    "async_generator": "async def handle(data, job):\n    yield 1\n",
    "generator_call": "class H:\n    def __call__(self, data, job):\n        yield 1\n"
    "handle = H()\n",
    "generator_partial": "import functools\ndef f(x, data, job):\n    yield x\n"
    "handle = functools.partial(f, 1)\n",
    "wrapped_generator": WRAPS + "@logged\ndef handle(data, job):\n    yield 1\n",
    "wrapped_async_generator": WRAPS + "@logged\n@logged\nasync def handle(data, job):\n"
    "    yield 1\n",
    "wrapped_async": WRAPS + "@logged\nasync def handle(data, job): return 'wrapped_async'\n",
    "class": "class handle:\n    def __init__(self, data, job): pass\n",
    "one_argument": "def handle(data): pass\n",
}


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("partial", None),
        ("static", None),
        ("instance", None),
        ("generator", "handle is a generator function"),
        ("async_generator", "handle is an async generator function"),
        ("generator_call", "handle is a generator function"),
        ("generator_partial", "handle is a generator function"),
        ("wrapped_generator", "handle wraps a generator function"),
        ("wrapped_async_generator", "handle wraps an async generator function"),
        ("wrapped_async", None),
        ("class", "handle is a class"),
        ("one_argument", "cannot take (data, job)"),
    ],
)
def test_a_handle_that_would_not_run_its_job_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, says: str | None
) -> None:
    import asyncio
    import inspect

    from queasy_py.runtime.handler import load

    name = f"handle_kind_{kind}"
    (tmp_path / f"{name}.py").write_text(HANDLE_KINDS[kind])
    monkeypatch.syspath_prepend(str(tmp_path))
    if says is not None:
        with pytest.raises(HandlerError, match=f"^handler module '{name}': .*{re.escape(says)}"):
            load(name)
        return
    handle, _ = load(name)
    value = handle(None, None)
    if inspect.isawaitable(value):
        value = asyncio.run(value)
    assert value == kind


@pytest.mark.parametrize("fail_queue_first", [False, True])
@pytest.mark.parametrize("touched", [False, True])
def test_a_queue_that_is_the_fail_queue_of_a_listened_queue_cannot_be_listened_to(
    redis_url: str, prefix: str, fail_queue_first: bool, touched: bool
) -> None:
    """Its jobs are fail records of q, run by q's fail handler: a second handler listed for
    it replaced that one in the workers' {queue: handler} (the last listed won)."""
    from queasy_py import InvalidInput

    with Client(redis_url, workers=1, prefix=prefix) as client:
        if touched:  # q's fail queue was looked at before (counts, jobs): it has q's hash tag
            assert client.queue("q").fail_queue.name == "q-fail"

        def listen_q() -> None:
            client.queue("q").listen(
                "queasy_py.handlers.reschedule", fail_handler="queasy_py.handlers.dead_letter"
            )

        def listen_fail_queue() -> None:
            client.queue("q-fail").listen("queasy_py.handlers.reschedule")

        first, second = (
            (listen_fail_queue, listen_q) if fail_queue_first else (listen_q, listen_fail_queue)
        )
        first()
        with pytest.raises(InvalidInput, match="'q-fail' is the fail queue of 'q'"):
            second()
        assert len(client.listeners) == 1
