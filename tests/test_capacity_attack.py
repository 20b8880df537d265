"""Capacity sharing under attack: priorities and reservations with pushes, units counted
with real workers, timeouts and memory recycling (real supervisors, real server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import Runtime, max_units_in_flight, queue_spec, runtime, wait_for

from queasy_py.store.keys import QueueKeys


@pytest.fixture
def rt(
    request: Any, redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path
) -> Iterator[Runtime]:
    with runtime(request, redis_url, prefix, r, tmp_path) as rt:
        yield rt


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


def test_pushed_small_jobs_do_not_refill_the_worker_kept_for_a_big_higher_priority_job(
    rt: Runtime,
) -> None:
    rt.start(
        {
            "big": queue_spec(size=100, priority=200),
            "small": queue_spec(size=10, priority=100),
        },
        workers=2,
    )
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


def test_pushed_small_jobs_do_not_refill_the_worker_kept_for_a_big_job_of_their_priority(
    rt: Runtime,
) -> None:
    rt.start(
        {"big": queue_spec(size=100), "small": queue_spec(size=10)},
        workers=2,
    )
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
