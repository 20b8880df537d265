"""Capacity sharing under attack: priorities and reservations with pushes, units counted
with real workers, timeouts and memory recycling (real supervisors, real server)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil
import pytest
from runtime_helpers import (
    ACT_ASYNC,
    Runtime,
    max_units_in_flight,
    queue_spec,
    wait_for,
)

from queasy_py import Client, InvalidInput, defaults
from queasy_py.store.keys import QueueKeys


def trickle(rt: Runtime, queue: str, seconds: float, every: float, data: dict) -> threading.Thread:
    """Dispatch one job of `data` every `every` s for `seconds` s, from a thread."""

    def run() -> None:
        q = rt.queue(queue)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            q.dispatch(dict(data))
            time.sleep(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("big", "small"),
    [
        ({"size": 100, "priority": 200}, {"size": 10, "priority": 100}),
        ({"size": 100}, {"size": 10}),  # one priority: big's turn comes first
    ],
    ids=["big_higher_priority", "same_priority"],
)
def test_pushed_small_jobs_do_not_refill_the_worker_kept_for_a_big_job(
    rt: Runtime, big: dict[str, Any], small: dict[str, Any]
) -> None:
    """A big job waiting for room has one worker kept for it, to drain. Small jobs pushed
    one at a time (each 0.5 s) went to that worker, the one with the most free units, and
    refilled it: the big job waited until they stopped coming (8.1 s, not 0.5 s)."""
    rt.start({"big": queue_spec(**big), "small": queue_spec(**small)}, workers=2)
    wait_for(lambda: rt.r.hgetall(QueueKeys(rt.prefix, "small", "small").base + ":parked"))
    feeder = trickle(rt, "small", 8.0, 0.03, {"tag": "small", "units": 10, "sleep": 0.5})
    rt.wait_records(10, "start", tag="small")
    sent = time.time()
    rt.queue("big").dispatch({"tag": "big", "units": 100})
    (start,) = rt.wait_records(1, "start", tag="big", timeout=30)
    feeder.join()
    assert start["t"] - sent < 3.0
    rt.wait_records(1, "end", tag="big")
    assert max_units_in_flight(rt.records()) <= 200


def runs_of(rt: Runtime, tag: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in rt.records("start", tag=tag):
        out[rec["id"]] = out.get(rec["id"], 0) + 1
    return out


def test_workers_recycled_for_memory_lose_and_repeat_no_job(rt: Runtime) -> None:
    ids = rt.queue("q").dispatch_many(
        {"data": {"tag": "m", "units": 10, "sleep": 0.3}} for _ in range(40)
    )
    sup = rt.start({"q": queue_spec()}, workers=2, max_worker_memory=1)
    rt.wait_records(40, "end", tag="m", timeout=60)
    time.sleep(1)
    assert runs_of(rt, "m") == {i: 1 for i in ids}
    assert all(r["stall_count"] == 0 for r in rt.records("start"))
    assert max_units_in_flight(rt.records()) <= 200
    assert sup.proc.poll() is None, sup.log()
    assert "recycling worker" in sup.log()


def test_a_timeout_on_a_shared_worker_reruns_only_the_timed_out_job(rt: Runtime) -> None:
    sup = rt.start(
        {"slow": queue_spec(timeout=1.0, min_backoff=0.0), "ok": queue_spec(timeout=30.0)},
        workers=1,
    )
    ok = rt.queue("ok").dispatch_many(
        {"data": {"tag": "ok", "units": 10, "sleep": 2.5}} for _ in range(5)
    )
    rt.wait_records(5, "start", tag="ok")
    spin = rt.queue("slow").dispatch({"tag": "spin", "spin": True, "times": 1})
    rt.wait_records(1, "start", tag="spin")
    late = rt.queue("ok").dispatch_many(
        {"data": {"tag": "late", "units": 10, "sleep": 0.1}} for _ in range(5)
    )
    rt.wait_records(5, "end", tag="late", timeout=20)
    rt.wait_records(5, "end", tag="ok", timeout=20)
    rt.wait_records(1, "end", tag="spin", timeout=20)
    time.sleep(0.5)
    assert runs_of(rt, "ok") == {i: 1 for i in ok}
    assert runs_of(rt, "late") == {i: 1 for i in late}
    assert runs_of(rt, "spin") == {spin: 2}
    print(sup.log()[-3000:])


def test_one_worker_serves_many_queues_of_mixed_sizes_once_each(rt: Runtime) -> None:
    queues = {}
    ids = {}
    for n in range(24):
        size = [1, 10, 33, 50, 100, 7][n % 6]
        name = f"q{n}"
        queues[name] = queue_spec(size=size, priority=n % 4)
        ids[name] = rt.queue(name).dispatch_many(
            {"data": {"tag": name, "units": size, "sleep": 0.01}} for _ in range(5)
        )
    rt.start(queues, workers=1)
    rt.wait_records(120, "end", timeout=90)
    time.sleep(0.5)
    for name in queues:
        assert runs_of(rt, name) == {i: 1 for i in ids[name]}
    assert max_units_in_flight(rt.records()) <= 100


@pytest.mark.parametrize(
    ("options", "wrong"),
    [({"size": 200}, "size"), ({"size": 0}, "size"), ({"priority": "high"}, "priority")],
)
def test_a_bad_fail_queue_size_or_priority_names_fail_options(
    redis_url: str, prefix: str, options: dict, wrong: str
) -> None:
    """The fail queue's units come from fail_options: an error about them must say so, not
    read as if the queue's own `size` (here valid, the default) were wrong."""
    with Client(redis_url, workers=1, prefix=prefix) as client:
        with pytest.raises(InvalidInput) as caught:
            client.queue("q").listen(
                "queasy_py.handlers.dead_letter",
                fail_handler="queasy_py.handlers.dead_letter",
                fail_options=options,
            )
    message = str(caught.value)
    assert message.startswith(f"queue 'q', fail_options: {wrong} must be"), message


def test_pushed_jobs_of_several_queues_never_overcommit_a_worker(rt: Runtime) -> None:
    sizes = {"a": 30, "b": 30, "c": 50}
    rt.start({n: queue_spec(size=u) for n, u in sizes.items()}, workers=1, poll_interval=30.0)
    for name in sizes:
        wait_for(lambda name=name: rt.r.hgetall(QueueKeys(rt.prefix, name, name).base + ":parked"))
    feeders = [
        trickle(rt, n, 2.0, 0.05, {"tag": n, "units": u, "sleep": 0.05}) for n, u in sizes.items()
    ]
    for feeder in feeders:
        feeder.join()
    live = ("waiting", "delayed", "blocked", "active")
    wait_for(lambda: not any(rt.queue(n).counts()[k] for n in sizes for k in live), timeout=60)
    time.sleep(1.0)
    records = rt.records()
    assert max_units_in_flight(records) <= 100
    for name in sizes:
        runs = runs_of(rt, name)
        assert runs and set(runs.values()) == {1}


def test_a_job_stuck_holding_the_gil_is_killed_beside_a_job_of_a_longer_timeout(
    rt: Runtime,
) -> None:
    """A job past its 1 s timeout that holds its worker's GIL (C code) beside a job of a
    60 s timeout: the worker was killed only once that job ended or timed out, so the stuck
    one ran on (here until its regex ended, 18 s) and the other, which could not run at all,
    waited with it (a longer C call: counted as a timeout). A worker that no longer answers
    a ping is killed at once; the job beside it is handed back, not counted."""
    gil = "tests.runtime_handlers.gil"
    sup = rt.start(
        {
            "hog": queue_spec(gil, timeout=1.0, min_backoff=0.0),
            "ok": queue_spec(gil, timeout=60.0),
        },
        workers=1,
    )
    rt.queue("hog").dispatch({"tag": "stuck", "gil": 15.0})
    (start,) = rt.wait_records(1, "start", tag="stuck", timeout=30)
    ok = rt.queue("ok").dispatch({"tag": "ok"})  # sent to the stuck worker, never read
    wait_for(lambda: not psutil.pid_exists(start["pid"]), timeout=40, what="the stuck worker")
    killed_after = time.time() - start["t"]
    assert killed_after <= 1.0 + defaults.WORKER_PING_TIMEOUT + 3.0, (killed_after, sup.log())
    (end,) = rt.wait_records(1, "end", tag="ok", timeout=20)
    assert end["pid"] != start["pid"] and end["id"] == ok
    assert end["timeout_count"] == end["stall_count"] == end["retry_count"] == 0
    assert "handed back to waiting, not counted" in sup.log()


def test_an_async_job_blocking_the_event_loop_past_its_timeout_is_killed_beside_others(
    rt: Runtime,
) -> None:
    """An async job past its 1 s timeout that never yields (a CPU loop in a coroutine)
    blocks its worker's event loop: an async job of a longer timeout beside it could not
    run, and the worker was killed only at that job's timeout (8 s), counting a timeout
    against it. The ping is answered on the event loop, so the worker is killed at once."""
    sup = rt.start(
        {
            "hog": queue_spec(ACT_ASYNC, timeout=1.0, min_backoff=0.0),
            "ok": queue_spec(ACT_ASYNC, timeout=8.0),
        },
        workers=1,
    )
    rt.queue("hog").dispatch({"tag": "stuck", "spin": True, "times": 1})
    (start,) = rt.wait_records(1, "start", tag="stuck", timeout=30)
    ok = rt.queue("ok").dispatch({"tag": "ok", "sleep": 0.2})  # on the stuck worker's loop
    wait_for(lambda: not psutil.pid_exists(start["pid"]), timeout=40, what="the stuck worker")
    killed_after = time.time() - start["t"]
    assert killed_after <= 1.0 + defaults.WORKER_PING_TIMEOUT + 3.0, (killed_after, sup.log())
    (end,) = rt.wait_records(1, "end", tag="ok", timeout=20)
    assert end["pid"] != start["pid"] and end["id"] == ok
    assert end["timeout_count"] == end["stall_count"] == end["retry_count"] == 0
