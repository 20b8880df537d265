"""A supervisor whose clock is off: retries and backoffs count on the server's clock, and
times the server sends (a delayed job's run_at, wake-ups) are read through the measured
offset. Also: a timed-out job backs off before its retry like any retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from runtime_helpers import Runtime, queue_spec, wait_for

from queasy_py.runtime.heartbeat import ServerClock

FAST = 300.0  # a supervisor five minutes fast


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def fcalls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


@pytest.mark.parametrize("skew", [FAST, -FAST])
def test_a_retry_waits_its_backoff_on_the_servers_clock(rt: Runtime, skew: float) -> None:
    """Fast by 5 minutes, the supervisor used to put its retries 5 minutes late."""
    spec = queue_spec(min_backoff=0.2, max_backoff=0.4)
    rt.start({"skew": spec}, workers=1, clock_skew=skew, poll_interval=1.0)
    rt.queue("skew").dispatch({"tag": "r", "raise": "retriable", "times": 1})
    first, second = rt.wait_records(2, "start", tag="r", timeout=10)
    assert 0.2 <= second["t"] - first["t"] < 5.0
    assert second["retry_count"] == 1


def test_a_fast_supervisor_waits_for_a_delayed_job_without_spinning(
    rt: Runtime, r: redis.Redis
) -> None:
    """The next run_at the server sends is on its clock: a supervisor 5 minutes fast used to
    take a job due in 3 s as due already and dequeue in a loop until it was."""
    sup = rt.start({"later": queue_spec()}, workers=1, clock_skew=FAST, poll_interval=5.0)
    wait_for(lambda: sup.workers(), what="a worker")
    rt.queue("later").dispatch({"tag": "d"})  # the supervisor is up and has dequeued
    rt.wait_records(1, "end", tag="d")
    before = fcalls(r)
    rt.queue("later").dispatch({"tag": "late"}, delay=3.0)
    (late,) = rt.wait_records(1, "start", tag="late", timeout=10)
    calls = fcalls(r) - before
    # a few heartbeats (every 0.5 s), the dispatch, a dequeue or two: not thousands
    assert calls < 60, f"{calls} FCALLs while one delayed job waited 3 s"


def test_a_timed_out_job_backs_off_before_its_retry(rt: Runtime) -> None:
    spec = queue_spec(timeout=1.0, min_backoff=3.0, max_backoff=3.0, max_timeouts=3)
    rt.start({"slow": spec}, workers=1)
    rt.queue("slow").dispatch({"tag": "t", "spin": True, "times": 1})
    first, second = rt.wait_records(2, "start", tag="t", timeout=20)
    assert second["timeout_count"] == 1
    # 1 s to the timeout, then at least the 3 s backoff (it used to run again at once)
    assert second["t"] - first["t"] >= 4.0


def test_a_slow_beat_does_not_move_the_measured_offset() -> None:
    """A beat whose TIME came back late (a reconnect inside it, a server slow to answer):
    its measure's error is up to half its round trip. It put the offset 0.275 s ahead, and a
    schedule's catch-up (the chaos test's invariant 8c) moved an occurrence that early. The
    offset is the one of the shortest round trip among the last ServerClock.SAMPLES beats;
    a real skew is still followed."""
    clock = ServerClock()
    t = 1_800_000_000.0

    def beat(rtt: float, server_at: float, skew: float = 0.0) -> None:
        nonlocal t
        t += 5.0
        server = t + skew + server_at
        clock.measure((int(server), round(server % 1 * 1e6)), t, t + rtt)

    beat(0.002, 0.001)  # a quick beat: the server read its clock inside it
    assert abs(clock.offset) < 0.002
    beat(0.55, 0.549)  # reconnected for 0.55 s, then TIME: the midpoint is 0.275 s early
    assert abs(clock.offset) < 0.002, clock.offset
    for _ in range(ServerClock.SAMPLES):  # a host clock 300 s slow, quick beats
        beat(0.003, 0.001, skew=FAST)
    assert abs(clock.offset - FAST) < 0.003, clock.offset
