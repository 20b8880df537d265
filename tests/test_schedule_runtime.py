"""Schedules with real supervisors and workers (issue #16): listen(schedule=...) fires on
time without drift, survives a supervisor killed mid-run, keeps firing when its handler
always fails, follows a changed config, and catches up missed fire times once or skips them.

The per-second test runs QUEASY_SCHEDULE_SECONDS (default 20; the issue's minute: 60).
Handler: tests/runtime_handlers/scheduled.py (records each run with its fire time; its mode
comes from the key `<prefix>:mode:<queue>`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from runtime_helpers import ROOT, Runtime, queue_spec, wait_for

from queasy_py.aio import AsyncClient
from queasy_py.errors import InvalidInput
from queasy_py.store.keys import QueueKeys

SCHEDULED = "tests.runtime_handlers.scheduled"
SECONDS = float(os.environ.get("QUEASY_SCHEDULE_SECONDS", "20"))
POLL = 1.0  # the supervisors' poll_interval (the default): "on time" is within one of it
EARLY = 0.05  # slack for the server's and the worker's clocks (one host here)
QUEASY = str(Path(sys.executable).with_name("queasy"))


@pytest.fixture
def rt(redis_url: str, prefix: str, r: redis.Redis, tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(redis_url, prefix, r, tmp_path) as runtime:
        yield runtime


def mode(rt: Runtime, value: str, queue: str = "q") -> None:
    rt.r.set(f"{rt.prefix}:mode:{queue}", value)


def runs(rt: Runtime, event: str = "start") -> list[dict[str, Any]]:
    return rt.records(event)


def ends_by_fire(rt: Runtime) -> Counter[float]:
    return Counter(e["fire_at"] for e in runs(rt, "end"))


def grid(first: float, step: float, last: float) -> list[float]:
    out, at = [], first
    while at <= last + 1e-6:
        out.append(round(at, 3))
        at += step
    return out


def assert_on_time(starts: list[dict[str, Any]]) -> None:
    for s in starts:
        late = s["t"] - s["fire_at"]
        assert -EARLY <= late <= POLL, f"run of {s['fire_at']} started {late:.3f}s late"


# ---------------------------------------------------------------- on time, no drift


def test_a_per_second_schedule_fires_every_second_on_time_without_drift(rt: Runtime) -> None:
    """Each run takes 0.3 s: a schedule counted from the end of the last run would drift by
    that every time; the fire times stay whole seconds, every one of them runs, once."""
    mode(rt, "sleep:0.3")
    sup = rt.start({"q": queue_spec(SCHEDULED, schedule="* * * * * *")}, poll_interval=POLL)
    first = rt.wait_records(1, "start", timeout=20)[0]["fire_at"]
    last = first + SECONDS
    wait_for(
        lambda: any(e["fire_at"] >= last for e in runs(rt, "end")),
        timeout=SECONDS + 20,
        what=f"the run of {last}",
    )
    starts = [s for s in runs(rt) if s["fire_at"] <= last]
    assert [s["fire_at"] for s in starts] == grid(first, 1.0, last)  # each second, once
    assert first == int(first)  # whole seconds: the cron grid
    assert_on_time(starts)
    assert all(count == 1 for count in ends_by_fire(rt).values())
    q = rt.queue("q")
    info = wait_for(lambda: (i := q.schedule_info()) and (i.fire_at or 0) > last and i)
    assert (info.spec, info.last_outcome, info.skipped) == ("cron * * * * * * UTC", "finished", 0)
    outcomes = Counter(e["outcome"] for e in rt.events("q"))
    assert outcomes["finished"] >= SECONDS and set(outcomes) == {"finished"}
    assert sup.stop() == 0


# ---------------------------------------------------------------- crash, failures


def test_a_supervisor_killed_mid_run_loses_no_occurrence_and_runs_none_twice(
    rt: Runtime,
) -> None:
    """kill -9 of the supervisor (and its workers) while an occurrence runs; two new
    supervisors sweep it, one runs it again (stall_count 1), and every later fire time runs
    exactly once on one of them."""
    mode(rt, "sleep:1.0")
    spec = {"q": queue_spec(SCHEDULED, schedule="*/4 * * * * *")}
    first = rt.start(spec)
    killed = rt.wait_records(1, "start", timeout=20)[0]
    first.kill_group()
    assert not runs(rt, "end"), "the kill came after the run ended"
    others = [rt.start(spec), rt.start(spec)]
    f0 = killed["fire_at"]
    last = f0 + 16
    wait_for(lambda: ends_by_fire(rt)[last] == 1, timeout=40, what=f"the run of {last} to end")
    starts = [s for s in runs(rt) if s["fire_at"] <= last]
    fires = [s["fire_at"] for s in starts]
    assert sorted(set(fires)) == grid(f0, 4.0, last)  # no fire time lost
    assert Counter(fires)[f0] == 2 and all(Counter(fires)[f] == 1 for f in fires if f != f0)
    assert all(n == 1 for f, n in ends_by_fire(rt).items() if f <= last)  # none twice
    rerun = next(s for s in starts[1:] if s["fire_at"] == f0)
    assert (rerun["stall_count"], rerun["retry_count"]) == (1, 0)
    pids = set().union(*(sup.workers() for sup in others))
    assert {s["pid"] for s in starts[1:]} <= pids  # run by the new supervisors only
    assert_on_time([s for s in starts if s["fire_at"] > f0])
    info = rt.queue("q").schedule_info()
    assert info is not None and info.skipped == 0
    assert all(sup.stop() == 0 for sup in others)


def test_a_handler_that_always_fails_still_fires_on_schedule(rt: Runtime) -> None:
    mode(rt, "fail")
    spec = queue_spec(SCHEDULED, schedule_every=1, max_retries=0)
    sup = rt.start({"q": spec}, poll_interval=POLL)
    starts = rt.wait_records(6, "start", timeout=30)
    first = starts[0]["fire_at"]
    assert [s["fire_at"] for s in starts[:6]] == grid(first, 1.0, first + 5)
    assert_on_time(starts[:6])
    events = rt.wait_events("q", 6)
    assert [e["outcome"] for e in events[:6]] == ["failed"] * 6
    fires = grid(first, 1.0, first + 5)
    assert [int(e["run_at"]) for e in events[:6]] == [int(f * 1000) for f in fires]
    info = rt.queue("q").schedule_info()
    assert info is not None and info.last_outcome == "failed"
    assert sup.stop() == 0


def test_the_reschedule_fail_handler_leaves_a_failed_occurrence_to_its_schedule(
    rt: Runtime,
) -> None:
    """queasy_py.handlers.reschedule on a scheduled queue: it dispatched the failed occurrence
    again by its id, which the library refuses in a scheduled queue, so every failure left a
    fail job that failed its 100 retries (InvalidInput: id 'schedule' is reserved). It leaves
    the occurrence to the schedule, which creates the next one itself."""
    mode(rt, "fail")
    fail_handler = "queasy_py.handlers.reschedule"
    spec = queue_spec(SCHEDULED, schedule_every=1, max_retries=0, fail_handler=fail_handler)
    sup = rt.start({"q": spec}, poll_interval=POLL)
    rt.wait_records(3, "start", timeout=30)  # the schedule goes on
    events = rt.wait_events("q-fail", 2, tag="q")
    assert [e["outcome"] for e in events[:2]] == ["finished"] * 2, events[:2]
    assert sup.stop() == 0
    assert "not rescheduled: the schedule creates its next occurrence itself" in sup.log()


# ---------------------------------------------------------------- catch-up


@pytest.mark.parametrize("catch_up", ["once", "skip"])
def test_fire_times_missed_while_everything_was_down_run_once_or_are_skipped(
    rt: Runtime, catch_up: str
) -> None:
    spec = {"q": queue_spec(SCHEDULED, schedule_every=1, catch_up=catch_up)}
    sup = rt.start(spec)
    rt.wait_records(2, "end", timeout=20)
    assert sup.stop() == 0
    q = rt.queue("q")
    pending = q.schedule_info()
    assert pending is not None and pending.state == "delayed" and pending.fire_at is not None
    wait_for(lambda: time.time() > pending.fire_at + 3.5, timeout=10, what="3 missed fire times")
    before = len(runs(rt))
    again = rt.start(spec)
    rt.wait_records(before + 3, "start", timeout=20)
    after = runs(rt)[before:]
    (checked_at, moved_to), *_ = wait_for(lambda: next_occurrences(again), what="a move")
    info = q.schedule_info()
    assert info is not None and info.skipped >= 3
    assert after[0]["fire_at"] == moved_to > pending.fire_at + 2  # the pending one never ran
    if catch_up == "once":  # run now, once, for the latest fire time missed
        assert moved_to <= checked_at < moved_to + 1
        assert after[0]["t"] - checked_at < POLL
    else:  # nothing now: the next fire time
        assert checked_at < moved_to <= checked_at + 1
        assert_on_time(after)
    fires = [s["fire_at"] for s in after]
    assert fires == grid(moved_to, 1.0, moved_to + len(fires) - 1)  # each once, in order
    assert_on_time(after[1:])
    assert again.stop() == 0


def next_occurrences(sup: Any) -> list[tuple[float, float]]:
    """(when, fire time) of each occurrence the supervisor moved (catch-up), from its log."""
    out = []
    for line in sup.log().splitlines():
        if "schedule of q: the occurrence of " in line and " moved it to " in line:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            at = datetime.fromisoformat(line.rsplit(" ", 1)[1]).timestamp()
            out.append((stamp + int(line[20:23]) / 1000, at))
    return out


# ---------------------------------------------------------------- a changed config


def start_run(tmp_path: Path, rt: Runtime, name: str, queue_table: str) -> subprocess.Popen:
    """`queasy run` with a config holding [queues.q] = queue_table (its log: name.log)."""
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'redis = "{rt.url}"\nprefix = "{rt.prefix}"\nworkers = 1\nheartbeat_interval = 0.5\n'
        f'[queues.q]\nhandler = "{SCHEDULED}"\n{queue_table}\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "QUEASY_TEST_URL": rt.url,
        "QUEASY_TEST_PREFIX": rt.prefix,
    }
    with (tmp_path / f"{name}.log").open("wb") as log:
        return subprocess.Popen(
            [QUEASY, "run", str(config)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_run(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_schedule_changed_in_the_config_takes_effect_at_the_next_occurrence(
    rt: Runtime, tmp_path: Path
) -> None:
    q = rt.queue("q")
    yearly = start_run(tmp_path, rt, "yearly", 'schedule = "0 0 1 1 *"')
    try:
        wait_for(lambda: q.schedule_info(), what="the yearly schedule")
        info = q.schedule_info()
        assert info is not None and info.spec == "cron 0 0 1 1 * UTC"
        assert info.next_fire_at is not None and info.next_fire_at > time.time() + 86400
    finally:
        assert stop_run(yearly) == 0
    # the config now says every second: the pending yearly occurrence moves to the next second
    restarted = time.time()
    every = start_run(tmp_path, rt, "every", 'schedule = "* * * * * *"\ntimezone = "Asia/Tokyo"')
    try:
        starts = rt.wait_records(3, "start", timeout=20)
        first = starts[0]["fire_at"]
        assert restarted < first < restarted + 5
        assert [s["fire_at"] for s in starts[:3]] == grid(first, 1.0, first + 2)
        info = q.schedule_info()
        assert info is not None and info.spec == "cron * * * * * * Asia/Tokyo"
    finally:
        assert stop_run(every) == 0
    # and back to hourly (schedule_every): the next occurrence is at the next whole hour
    hourly = start_run(tmp_path, rt, "hourly", "schedule_every = 3600")
    try:
        wait_for(lambda: q.schedule_info().spec == "every 3600s", what="the hourly schedule")
        info = q.schedule_info()
        assert info is not None and info.next_fire_at == (time.time() // 3600 + 1) * 3600
    finally:
        assert stop_run(hourly) == 0
    for name in ("yearly", "every", "hourly"):
        print(f"----- {name} -----\n" + (tmp_path / f"{name}.log").read_text(errors="replace"))


def test_one_schedule_spelled_two_ways_in_a_rolling_deploy_does_not_move_a_late_occurrence(
    rt: Runtime,
) -> None:
    """Two supervisors of one deploy, one config spelling the schedule `0/20 * * * jan-dec *`,
    the next `*/20 * * * * *`: the library compared the texts, took the second for a changed
    schedule and moved the pending occurrence, late after an outage, to the next fire time,
    so the missed run (catch_up="once": run it at once) never ran. One canonical text now."""
    first = rt.start({"q": queue_spec(SCHEDULED, schedule="0/20 * * * jan-dec *")})
    q = rt.queue("q")
    wait_for(lambda: (i := q.schedule_info()) and i.state == "delayed", what="the occurrence")
    assert first.stop() == 0
    pending = q.schedule_info()
    assert pending is not None and pending.fire_at is not None
    assert pending.spec == "cron */20 * * * * * UTC"
    wait_for(lambda: time.time() > pending.fire_at + 1.5, timeout=25, what="a late occurrence")
    before = len(runs(rt))
    second = rt.start({"q": queue_spec(SCHEDULED, schedule="*/20 * * * * *")})
    (late, *_) = rt.wait_records(before + 1, "start", timeout=25)[before:]
    assert late["fire_at"] == pending.fire_at, "the late occurrence was moved, not run"
    assert late["t"] < pending.fire_at + 10
    assert not next_occurrences(second)
    assert second.stop() == 0


# ---------------------------------------------------------------- requeue of an occurrence


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_requeue_failed_never_requeues_an_occurrence_of_the_schedule(
    rt: Runtime, flavor: str
) -> None:
    """A failed occurrence (id 'schedule') requeued while the next one runs became a job
    blocked behind it (queasy_requeue: a new job of a live id waits for it), then ran: the
    periodic job once more, beside the schedule's own occurrences. By id it is refused
    before anything is written; with every failed job it is skipped, the others requeued.
    The same through AsyncQueue (`flavor`)."""
    mode(rt, "fail")
    q = rt.queue("q")
    q.dispatch({"fire_at": 0}, id="x")  # a job of the queue that fails too (max_retries 0)
    rt.start({"q": queue_spec(SCHEDULED, schedule_every=2, max_retries=0)}, poll_interval=POLL)
    rt.wait_records(1, "start", mode="fail", fire_at=0)
    wait_for(lambda: (j := q.get_job("x")) is not None and j.state == "failed", what="x failed")
    wait_for(lambda: "schedule" in failed_ids(q), what="a failed occurrence's record")
    mode(rt, "gate")
    rt.wait_records(1, "start", mode="gate")  # the next occurrence runs (held at its gate)
    assert q.get_job("schedule").state == "active"

    requeue = q.requeue_failed if flavor == "sync" else async_requeue(rt)
    with pytest.raises(InvalidInput, match="job 'schedule' of q is an occurrence of the"):
        requeue(["x", "schedule"])
    assert q.counts()["blocked"] == 0
    assert failed_ids(q) == {"x", "schedule"}  # nothing written: x not requeued either

    assert requeue() == 1  # x alone
    assert q.counts()["blocked"] == 0
    assert "schedule" in failed_ids(q)
    rt.open_gate("q")


def async_requeue(rt: Runtime) -> Any:
    """AsyncQueue("q").requeue_failed run to its end on a client of its own."""

    def requeue(ids: list[str] | None = None) -> int:
        async def run() -> int:
            client = AsyncClient(rt.url, prefix=rt.prefix)
            try:
                return await client.queue("q").requeue_failed(ids)
            finally:
                await client.close()

        return asyncio.run(run())

    return requeue


def failed_ids(q: Any) -> set[str]:
    jobs, _ = q.jobs("failed", limit=1000)
    return {j.id for j in jobs}


def test_a_schedule_check_that_fails_on_its_queue_logs_once_until_it_works(
    rt: Runtime,
) -> None:
    """A check refused by the queue's own keys (B:schedule written around the library as a
    string: WRONGTYPE, every check) logged an ERROR at every check (each poll_interval) for as
    long as it lasted; now once, and once more when it works again."""
    sup = rt.start({"q": queue_spec(SCHEDULED, schedule="* * * * * *")}, poll_interval=0.2)
    rt.wait_records(1, "start", timeout=20)
    skey = QueueKeys(rt.prefix, "q", "q").base + ":schedule"
    rt.r.delete(skey)
    rt.r.set(skey, "not a hash")
    failed = "ERROR schedule check of q failed"
    wait_for(lambda: failed in sup.log(), 10, "a failed check logged")
    until = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > until, 5, "five more checks (poll_interval 0.2 s)")
    assert sup.log().count(failed) == 1, sup.log()
    rt.r.delete(skey)
    wait_for(lambda: "schedule check of q works again" in sup.log(), 10, "works again")
    assert sup.stop() == 0
    assert sup.log().count(failed) == 1
