"""queasy_schedule and queasy_schedule_info alone, through raw FCALL (issue #16).

A schedule's occurrence (job id 'schedule') is created for a fire time only when there is
none, and only from the fire time the caller saw (a compare-and-set on B:schedule's fire_at),
so fire times only grow and supervisors never create one twice; a pending occurrence that
never ran may be moved. Time is explicit (lua_calls.NOW), nothing sleeps.
"""

from __future__ import annotations

import json

import pytest
import redis
from lua_calls import NOW, SCHEDULE_ID, Lua, schedule, schedule_info, snapshot

from queasy_py.store.library import Ack, ensure_loaded

T1, T2, T3 = NOW + 1_000, NOW + 2_000, NOW + 3_000
CREATED, STALE, NOTHING, MOVED = 2, 1, 0, 3


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(redis.ResponseError) as info:
        call(*args, **kwargs)
    assert str(info.value).startswith("INVALID "), info.value
    return str(info.value)


def test_the_first_check_creates_the_occurrence_for_its_fire_time(lua: Lua) -> None:
    got = schedule(lua, None, T1, spec="every 1s")
    assert (got.code, got.fire_at, got.spec, got.last_fire_at, got.state) == (
        CREATED,
        T1,
        "every 1s",
        None,
        "waiting",
    )
    job = lua.get_job(SCHEDULE_ID)
    assert (job["state"], job["run_at"]) == ("delayed", T1)
    assert json.loads(job["data"]) == {"fire_at": T1 / 1000}
    info = schedule_info(lua)
    assert info == {
        "spec": "every 1s",
        "fire_at": str(T1),
        "state": "delayed",
        "last_fire_at": "",
        "last_outcome": "",
        "last_ended_at": "",
        "skipped": "0",
    }
    assert schedule_info(lua, now=T1)["state"] == "waiting"


def test_a_second_supervisor_with_the_same_view_creates_nothing(lua: Lua) -> None:
    """Two supervisors computed the same next fire time from nothing: one creates it, the
    other is told it is stale (and gets the fire time to compute from)."""
    assert schedule(lua, None, T1).code == CREATED
    again = schedule(lua, None, T2)
    assert (again.code, again.fire_at) == (STALE, T1)
    assert schedule(lua, T1, T2).code == NOTHING  # exists: nothing to do
    assert lua.counts() == {"waiting": 0, "delayed": 1, "blocked": 0, "active": 0}
    assert lua.get_job(SCHEDULE_ID)["run_at"] == T1


def test_the_next_occurrence_comes_only_once_the_current_one_ended(lua: Lua) -> None:
    schedule(lua, None, T1)
    job = lua.dequeue("c1", now=T1).jobs[0]
    running = schedule(lua, T1, T2, now=T1)
    assert (running.code, running.state) == (NOTHING, "active")  # no second copy meanwhile
    assert schedule_info(lua, now=T1)["state"] == "active"
    assert lua.finish("c1", job, now=T1 + 10) == Ack.OK
    info = schedule_info(lua, now=T1 + 20)
    assert (info["state"], info["last_fire_at"], info["last_outcome"]) == ("", str(T1), "finished")
    assert info["last_ended_at"] == str(T1 + 10)
    nxt = schedule(lua, T1, T2, now=T1 + 20)
    assert (nxt.code, nxt.fire_at, nxt.last_fire_at) == (CREATED, T2, T1)
    # a late supervisor that still computes from nothing or from T1 creates nothing
    assert schedule(lua, T1, T2, now=T1 + 30).code == STALE
    assert schedule(lua, None, T3, now=T1 + 30).code == STALE
    assert lua.counts(now=T1 + 30)["delayed"] == 1


@pytest.mark.parametrize("end", ["fail", "fail_alone", "cancel"])
def test_a_failed_or_cancelled_occurrence_is_noted_and_the_next_follows(lua: Lua, end: str) -> None:
    schedule(lua, None, T1)
    if end == "cancel":
        assert lua.cancel(SCHEDULE_ID, now=T1) == 1
        outcome = "cancelled"
    else:
        job = lua.dequeue("c1", now=T1).jobs[0]
        assert lua.fail("c1", job, now=T1, with_fail_queue=end == "fail") == Ack.OK
        outcome = "failed"
    info = schedule_info(lua, now=T1)
    assert (info["state"], info["last_outcome"], info["last_fire_at"]) == ("", outcome, str(T1))
    assert schedule(lua, T1, T2, now=T1).code == CREATED


def test_a_retried_occurrence_stays_the_same_and_is_not_an_end(lua: Lua) -> None:
    schedule(lua, None, T1)
    job = lua.dequeue("c1", now=T1).jobs[0]
    assert lua.retry("c1", job, run_at=T1 + 500, now=T1) == Ack.OK
    assert schedule_info(lua, now=T1)["last_outcome"] == ""
    # waiting again, but it ran: never moved (its retry keeps its time), nothing created
    got = schedule(lua, T1, T2, retime_at=T3, now=T1 + 100)
    assert (got.code, got.fire_at) == (NOTHING, T1)
    job = lua.get_job(SCHEDULE_ID, now=T1 + 100)
    assert (job["run_at"], job["retry_count"]) == (T1 + 500, 1)


def test_a_pending_occurrence_that_never_ran_is_moved_and_wakes_the_supervisors(
    lua: Lua, r: redis.Redis
) -> None:
    schedule(lua, None, T1)
    wake = r.pubsub(ignore_subscribe_messages=True)
    wake.ssubscribe(lua.B + ":wake")
    try:
        got = schedule(lua, T1, T2, retime_at=T3, spec="every 3s", skipped=7, skipped_move=2)
        assert (got.code, got.fire_at, got.spec) == (MOVED, T3, "every 3s")
        message = None
        for _ in range(50):
            message = wake.get_message(timeout=0.1)
            if message is not None:
                break
        assert message is not None and message["data"] == str(T3)
    finally:
        wake.close()
    job = lua.get_job(SCHEDULE_ID)
    assert (job["run_at"], json.loads(job["data"])) == (T3, {"fire_at": T3 / 1000})
    assert lua.counts()["delayed"] == 1
    assert schedule_info(lua)["skipped"] == "2"  # the count of the move, not of a creation


def test_an_active_occurrence_is_never_moved(lua: Lua) -> None:
    schedule(lua, None, T1)
    job = lua.dequeue("c1", now=T1).jobs[0]
    got = schedule(lua, T1, T2, retime_at=T3, spec="every 3s", now=T1)
    assert (got.code, got.fire_at, got.spec, got.state) == (NOTHING, T1, "every 1s", "active")
    assert lua.finish("c1", job, now=T1) == Ack.OK


def test_fire_times_only_grow(lua: Lua, r: redis.Redis, prefix: str) -> None:
    schedule(lua, None, T2)
    job = lua.dequeue("c1", now=T2).jobs[0]
    lua.finish("c1", job, now=T2)
    assert "create_at" in refused(schedule, lua, T2, T2, now=T2)
    assert "create_at" in refused(schedule, lua, T2, T1, now=T2)
    assert schedule(lua, T2, T3, now=T2).code == CREATED
    before = snapshot(r, prefix)
    assert "retime_at" in refused(schedule, lua, T3, NOW + 9_000, retime_at=T2, now=T2)
    assert snapshot(r, prefix) == before


BAD = [
    ("spec", ""),
    ("spec", "every\n1s"),
    ("spec", "x" * 201),
    ("seen", "1.5"),
    ("create_at", ""),
    ("create_at", "1e12"),
    ("create_at", "-1"),
    ("retime_at", "soon"),
    ("skipped", "-1"),
    ("skipped_move", "x"),
    ("now", "12.5"),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_schedule_refuses_bad_arguments_before_any_write(
    lua: Lua, r: redis.Redis, prefix: str, name: str, value: str
) -> None:
    lua.add("w")
    args = {"seen": None, "create_at": T1, "spec": "every 1s", "now": NOW}
    args[name] = value
    seen, create_at = args.pop("seen"), args.pop("create_at")
    before = snapshot(r, prefix)
    message = refused(schedule, lua, seen, create_at, **args)
    assert name.split("_")[0] in message
    assert snapshot(r, prefix) == before


def test_finishing_a_job_named_schedule_in_a_queue_without_one_writes_no_schedule(
    lua: Lua, r: redis.Redis
) -> None:
    job = lua.take(SCHEDULE_ID, "c1")
    assert lua.finish("c1", job) == Ack.OK
    assert not r.exists(lua.B + ":schedule")
    assert schedule_info(lua) is None


def test_cancelling_a_blocked_copy_of_a_running_occurrence_is_no_end(lua: Lua) -> None:
    # (a producer's dispatch of the id is refused while the queue has a schedule: library
    # 4.3.0, and so is a requeue of a failed occurrence's record: 4.3.1; a blocked copy is
    # what a library before them left: made here with B:schedule renamed away meanwhile)
    schedule(lua, None, T1)
    assert lua.fail("c1", lua.dequeue("c1", now=T1).jobs[0], now=T1) == Ack.OK
    assert schedule(lua, T1, T2, now=T1).code == CREATED
    lua.dequeue("c1", now=T2)
    lua.r.rename(lua.B + ":schedule", lua.B + ":schedule-away")
    assert lua.requeue(SCHEDULE_ID, now=T2)[0] == 1  # blocked behind the active one
    lua.r.rename(lua.B + ":schedule-away", lua.B + ":schedule")
    assert lua.counts(now=T2)["blocked"] == 1
    assert lua.cancel(SCHEDULE_ID, now=T2) == 1
    info = schedule_info(lua, now=T2)
    assert (info["state"], info["last_outcome"], info["last_fire_at"]) == (
        "active", "failed", str(T1),
    )  # fmt: skip


def test_a_caller_behind_is_told_it_is_stale_before_its_move_is_checked(lua: Lua) -> None:
    """A supervisor that missed occurrences (an outage) proposes a move computed from an old
    fire time: it must learn the stored fire time, not be refused at every check (found by
    the chaos test)."""
    schedule(lua, None, T1)
    for at, nxt in ((T1, T2), (T2, T3)):
        job = lua.dequeue("c1", now=at).jobs[0]
        assert lua.finish("c1", job, now=at) == Ack.OK
        assert schedule(lua, at, nxt, now=at).code == CREATED
    got = schedule(lua, T1, T2, retime_at=T2, now=T3)  # T2 ran already
    assert (got.code, got.fire_at, got.last_fire_at) == (STALE, T3, T2)


def test_unschedule_drops_a_schedule_only_while_no_occurrence_exists(
    lua: Lua, r: redis.Redis
) -> None:
    """queasy_unschedule (4.4.0): nothing dropped while its occurrence waits or runs; once it
    ended, B:schedule goes and the id 'schedule' is a plain id again. Before, nothing ever
    removed B:schedule: a schedule taken out of every config stayed listed for good."""
    assert lua.call("queasy_unschedule", [lua.B], NOW) == [0, ""]  # none
    schedule(lua, None, T1)
    assert lua.call("queasy_unschedule", [lua.B], NOW) == [2, "waiting"]
    job = lua.dequeue("c1", now=T1).jobs[0]
    before = snapshot(r, lua.B)
    assert lua.call("queasy_unschedule", [lua.B], T1) == [2, "active"]
    assert snapshot(r, lua.B) == before  # nothing written
    assert lua.finish("c1", job, now=T1 + 10) == Ack.OK
    assert lua.call("queasy_unschedule", [lua.B], T1 + 20) == [1, ""]
    assert schedule_info(lua, now=T1 + 20) is None
    assert r.exists(f"{lua.B}:schedule") == 0
    assert lua.dispatch((SCHEDULE_ID, "{}", ""), now=T1 + 30) == [1]  # no longer reserved
    assert lua.get_job(SCHEDULE_ID, now=T1 + 30)["state"] == "waiting"
    assert lua.call("queasy_unschedule", [lua.B], T1 + 40) == [0, "waiting"]
