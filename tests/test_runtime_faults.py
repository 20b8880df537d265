"""The runtime under faults, as real processes: timeouts that kill a spinning worker, workers
that die mid-job, a frozen supervisor swept as a zombie, and shutdown on signals.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from runtime_helpers import FAIL_RECORD, Runtime, queue_spec, wait_for

FAST_FAIL = {"min_backoff": 0.05, "max_backoff": 0.1}


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def outcomes(events: list[dict[str, str]], *fields: str) -> list[tuple[str, ...]]:
    return [(e["outcome"], *(e[f] for f in fields)) for e in events]


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid)


# ---------------------------------------------------------------- timeouts


def test_a_spinning_job_is_killed_at_its_timeout_and_the_other_jobs_finish(rt: Runtime) -> None:
    spin = queue_spec(timeout=1.0, max_timeouts=2, fail_handler=FAIL_RECORD, fail_options=FAST_FAIL)
    rt.queue("spin").dispatch({"tag": "spin", "spin": True}, id="spin")
    rt.queue("slow").dispatch_many({"data": {"tag": "slow", "sleep": 2.0}} for _ in range(3))
    sup = rt.start({"spin": spin, "slow": queue_spec(timeout=10.0)}, workers=1)

    first = rt.wait_records(1, "start", tag="spin")[0]
    old = first["pid"]
    assert {s["pid"] for s in rt.wait_records(3, "start", tag="slow")} == {old}
    # at the timeout a replacement starts at once; the old worker gets no new job
    wait_for(lambda: len(sup.workers()) == 2, what="a replacement worker")
    rt.queue("slow").dispatch({"tag": "late"})
    (late,) = rt.wait_records(1, "end", tag="late")
    assert late["pid"] != old

    (fail,) = rt.wait_records(1, "fail", timeout=20)
    slow_ends = rt.records("end", tag="slow")
    assert len(slow_ends) == 3 and {e["pid"] for e in slow_ends} == {old}  # unharmed
    assert gone(old)
    runs = rt.records("start", tag="spin")
    assert [(r["pid"] == old, r["timeout_count"]) for r in runs] == [(True, 0), (False, 1)]
    data, job, error = fail["given"]
    assert data == {"tag": "spin", "spin": True}
    assert (job["id"], job["timeout_count"], job["stall_count"]) == ("spin", 2, 0)
    assert (error["name"], error["kind"]) == ("TimeoutError", "stall")
    assert "timed out 2 times" in error["message"]

    events = rt.events("spin")
    assert outcomes(events, "timeout_count", "error_name", "error_kind") == [
        ("timed_out", "1", "TimeoutError", "stall"),
        ("timed_out", "2", "TimeoutError", "stall"),
        ("failed", "2", "TimeoutError", "stall"),
    ]
    # the old worker was killed only once its other jobs had ended
    assert int(events[0]["ended_at"]) >= max(e["t"] for e in slow_ends) * 1000 - 5
    assert int(events[0]["ended_at"]) >= (first["t"] + 1.0) * 1000
    assert {e["outcome"] for e in rt.events("slow")} == {"finished"}


# ---------------------------------------------------------------- crashes


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_a_worker_that_dies_mid_job_is_replaced_and_the_job_retried(rt: Runtime, how: str) -> None:
    sup = rt.start({"q": queue_spec(timeout=60.0)}, workers=1)
    if how == "sigkill":
        rt.queue("q").dispatch({"tag": "c", "gate": "c", "times": 1}, id="c")
        (first,) = rt.wait_records(1, "start", tag="c")
        os.kill(first["pid"], signal.SIGKILL)
    else:
        rt.queue("q").dispatch({"tag": "c", "exit": 7, "times": 1}, id="c")
        (first,) = rt.wait_records(1, "start", tag="c")
    died = time.time()

    (end,) = rt.wait_records(1, "end", tag="c")
    _, second = rt.records("start", tag="c")
    assert second["pid"] != first["pid"]
    assert (second["stall_count"], second["retry_count"], second["timeout_count"]) == (1, 0, 0)
    assert second["t"] - died < 5.0  # noticed through the process, not at the 60 s timeout
    assert outcomes(rt.wait_events("q", 2), "pid", "stall_count", "error_name", "error_kind") == [
        ("stalled", str(first["pid"]), "1", "WorkerDied", "stall"),
        ("finished", str(second["pid"]), "1", "", ""),
    ]
    assert sup.workers() == {second["pid"]}


def test_a_job_that_keeps_killing_its_worker_fails_with_stall_error(rt: Runtime) -> None:
    rt.start({"q": queue_spec(max_stalls=2, fail_handler=FAIL_RECORD, fail_options=FAST_FAIL)})
    rt.queue("q").dispatch({"tag": "d", "exit": 3}, id="d")

    (fail,) = rt.wait_records(1, "fail")
    assert [r["stall_count"] for r in rt.records("start", tag="d")] == [0, 1]
    _, job, error = fail["given"]
    assert job["stall_count"] == 2
    assert (error["name"], error["kind"]) == ("StallError", "stall")
    assert outcomes(rt.events("q"), "stall_count", "error_name") == [
        ("stalled", "1", "WorkerDied"),
        ("stalled", "2", "WorkerDied"),
        ("failed", "2", "StallError"),
    ]


# ---------------------------------------------------------------- zombies


def test_a_frozen_supervisor_is_swept_and_on_waking_kills_its_workers(rt: Runtime) -> None:
    zombie = rt.start({"q": queue_spec(timeout=30.0)}, workers=1)
    rt.queue("q").dispatch({"tag": "z", "sleep": 1.0}, id="z")
    (first,) = rt.wait_records(1, "start", tag="z")
    zombie.signal_all(signal.SIGSTOP)  # the supervisor and its worker freeze mid-job

    other = rt.start({"q": queue_spec(timeout=30.0)}, workers=1, poll_interval=0.2)
    (end,) = rt.wait_records(1, "end", tag="z", stall_count=1)
    assert end["pid"] != first["pid"]
    stalled, finished = rt.wait_events("q", 2)
    assert (stalled["outcome"], stalled["stall_count"]) == ("stalled", "1")
    assert zombie.client_of(stalled)
    assert finished["outcome"] == "finished" and other.client_of(finished)

    # its worker's sleep is over when it wakes: whatever it does, its result is stale
    zombie.signal_all(signal.SIGCONT)
    wait_for(lambda: gone(first["pid"]), what="the zombie's worker to be killed")
    wait_for(lambda: "was swept as dead" in zombie.log(), what="the zombie to notice")
    wait_for(lambda: zombie.workers() - {first["pid"]}, what="the zombie to start over")
    assert zombie.stop() == 0
    assert other.stop() == 0
    assert outcomes(rt.events("q")) == [("stalled",), ("finished",)]  # finished exactly once
    job = rt.queue("q").get_job("z")  # the record of its one end, by the other supervisor
    assert job is not None and job.state == "finished" and job.client == finished["client"]
    assert job.last_error is not None and job.last_error["name"] == "StallError"


def test_a_swept_supervisor_hands_back_what_its_old_id_still_holds(rt: Runtime) -> None:
    """A dequeue sent just before a freeze of the server can be applied after it, its reply
    lost: the jobs are leased to the supervisor's id while that id, swept on another queue
    meanwhile, is given up (the supervisor starts over under a new id). They went back only
    at the old id's expiry (seen: a schedule's occurrence 10 s late in the chaos test); now
    the supervisor hands them back at once, counted as a sweep would count them."""
    sup = rt.start({"a": queue_spec(), "b": queue_spec()}, workers=1)
    rt.queue("a").dispatch({"tag": "first"})
    (first,) = rt.wait_events("a", 1)
    old = first["client"]
    a, b = rt.queue("a").keys.base, rt.queue("b").keys.base
    sup.signal_all(signal.SIGSTOP)

    def now_ms() -> int:
        seconds, micros = rt.r.time()
        return seconds * 1000 + micros // 1000

    wait_for(
        lambda: (rt.r.zscore(f"{a}:expiry", old) or float("inf")) < now_ms(),
        what="its expiry to pass",
    )
    # another client's call on `a` sweeps it there; on `b` a late dequeue leases it a job
    assert rt.r.fcall("queasy_dequeue", 1, a, "", "sweeper-1", "n1", 0, 1000, 100)[0] == 0
    assert rt.r.zscore(f"{a}:swept", old) is not None
    rt.queue("b").dispatch({"tag": "late"}, id="late")
    reply = rt.r.fcall("queasy_dequeue", 1, b, "", old, "n2", 1, 60_000, 100)
    assert reply[2] == "late"  # held by the old id until its expiry, 60 s from now

    sup.signal_all(signal.SIGCONT)
    wait_for(lambda: "was swept as dead" in sup.log(), what="the supervisor to notice")
    (start,) = rt.wait_records(1, "start", tag="late", timeout=10)
    assert start["stall_count"] == 1  # counted as a sweep: a stall
    stalled = rt.wait_events("b", 1)[0]
    assert (stalled["outcome"], stalled["client"]) == ("stalled", old)
    # handed back by the supervisor itself, not by a sweep at the old id's expiry (which
    # its last heartbeat made 1 s here, 10 s with the default heartbeat_interval)
    assert "gave up client" in stalled["error_message"], stalled
    assert rt.r.zscore(f"{b}:expiry", old) is None  # and the old id left the queue
    assert sup.stop() == 0


# ---------------------------------------------------------------- shutdown


@pytest.mark.parametrize(
    "how",
    [
        "SIGTERM to the supervisor",  # docker stop, kubernetes
        "SIGINT to the process group",  # Ctrl-C in a terminal
        "SIGTERM to the process group",  # systemd's default KillMode=control-group
    ],
)
def test_a_signal_drains_running_jobs_and_takes_no_new_one(rt: Runtime, how: str) -> None:
    sup = rt.start({"q": queue_spec(size=100)}, workers=1, shutdown_timeout=10.0)
    q = rt.queue("q")
    q.dispatch({"tag": "a", "sleep": 1.0}, id="a")
    (start,) = rt.wait_records(1, "start", tag="a")
    q.dispatch({"tag": "b"}, id="b")  # no room while a runs
    sig = signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGINT
    if how.endswith("group"):
        sup.signal_group(sig)
    else:
        sup.signal(sig)

    assert sup.wait() == 0
    assert rt.records("end", tag="a")
    assert outcomes(rt.events("q"), "id") == [("finished", "a")]
    assert q.get_job("b").state == "waiting"  # type: ignore[union-attr]
    assert rt.records("start", tag="b") == []
    assert gone(start["pid"])


def test_past_shutdown_timeout_running_jobs_are_handed_straight_back(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=0.5)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "g"}, id="g")
    (start,) = rt.wait_records(1, "start", tag="g")
    signalled = time.monotonic()
    sup.signal(signal.SIGTERM)

    assert sup.wait() == 0
    assert 0.5 <= time.monotonic() - signalled < 5.0
    assert gone(start["pid"])
    job = q.get_job("g")
    assert job is not None and job.state == "waiting"
    assert (job.retry_count, job.stall_count, job.timeout_count) == (0, 0, 0)
    assert outcomes(rt.events("q"), "stall_count", "error_name") == [("released", "0", "Shutdown")]

    # handed back, not left to expire: the next supervisor runs it at once
    rt.open_gate("g")
    rt.start({"q": queue_spec()}, workers=1)
    (end,) = rt.wait_records(1, "end", tag="g", timeout=5.0)
    assert end["stall_count"] == 0


def test_a_second_signal_skips_the_wait_for_running_jobs(rt: Runtime) -> None:
    sup = rt.start({"q": queue_spec()}, workers=1, shutdown_timeout=60.0)
    q = rt.queue("q")
    q.dispatch({"tag": "g", "gate": "g"}, id="g")
    rt.wait_records(1, "start", tag="g")
    signalled = time.monotonic()
    sup.signal(signal.SIGTERM)
    wait_for(lambda: "shutting down" in sup.log(), what="the shutdown to begin")
    sup.signal(signal.SIGTERM)

    assert sup.wait() == 0
    assert time.monotonic() - signalled < 5.0
    job = q.get_job("g")
    assert job is not None and job.state == "waiting" and job.stall_count == 0
