"""The Lua function library alone, through raw FCALL against a real server.

Time is explicit: every call passes `now` in ms (see lua_calls.py), so nothing sleeps.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable

import pytest
import redis
from lua_calls import EVENT_FIELDS, EXPIRY, NOW, Leased, Lua, snapshot

from queasy_py.errors import VersionMismatch
from queasy_py.store.library import (
    Ack,
    Dispatched,
    Status,
    bundled_version,
    ensure_loaded,
    installed_version,
    parse_version,
    source,
)

SOON = NOW + 1_000
LATER = NOW + 5_000
LATEST = NOW + 9_000
DEAD = NOW + EXPIRY + 1  # past the expiry of a client last seen at NOW
END_MARK = "qt-end-mark"

RUN_AT_MODES: dict[str, Callable[[int, int], int]] = {
    "replace": lambda current, new: new,
    "keep": lambda current, new: current,
    "if_later": max,
    "if_earlier": min,
}


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


def job_state(lua: Lua, id: str, now: int = NOW) -> str | None:
    job = lua.get_job(id, now)
    return None if job is None else job["state"]


def retried_once(lua: Lua, id: str, run_at: int, client: str = "c1") -> None:
    """Leave job `id` waiting at run_at with retry_count 1."""
    job = lua.take(id, client)
    assert lua.retry(client, job, run_at) == Ack.OK


def active_retried_once(lua: Lua, id: str, client: str = "c1") -> Leased:
    """Job `id` active for `client`, with retry_count 1 and data '"x"'."""
    retried_once(lua, id, NOW, client)
    return lua.dequeue(client, limit=1).jobs[0]


# ---------------------------------------------------------------- dispatch


def test_dispatch_creates_a_waiting_job(lua: Lua) -> None:
    assert lua.dispatch(("a", '{"n": 1}', NOW)) == [Dispatched.CREATED]
    assert lua.get_job("a") == {
        "state": "waiting",
        "id": "a",
        "data": '{"n": 1}',
        "run_at": NOW,
        "retry_count": 0,
        "stall_count": 0,
        "timeout_count": 0,
    }


def test_dispatch_without_run_at_runs_at_now(lua: Lua) -> None:
    lua.add("a", run_at="")
    assert lua.get_job("a")["run_at"] == NOW


def test_dispatch_many_returns_one_code_per_job(lua: Lua) -> None:
    lua.take("busy")
    lua.add("old")
    codes = lua.dispatch(("new", "1", NOW), ("old", "2", NOW), ("busy", "3", NOW))
    assert codes == [Dispatched.CREATED, Dispatched.UPDATED, Dispatched.BLOCKED]


def test_dispatch_with_the_id_of_a_waiting_job_updates_it(lua: Lua) -> None:
    lua.add("a", '"one"')
    assert lua.add("a", '"two"') == Dispatched.UPDATED
    assert lua.get_job("a")["data"] == '"two"'
    assert lua.counts()["waiting"] == 1


@pytest.mark.parametrize("new_run_at", [SOON, LATEST], ids=["earlier", "later"])
@pytest.mark.parametrize("reset", [True, False], ids=["reset", "no_reset"])
@pytest.mark.parametrize("mode", RUN_AT_MODES)
@pytest.mark.parametrize("update_data", [True, False], ids=["data", "no_data"])
def test_update_flags_on_a_waiting_job(
    lua: Lua, update_data: bool, mode: str, reset: bool, new_run_at: int
) -> None:
    retried_once(lua, "a", run_at=LATER)  # waiting at LATER, data '"x"', retry_count 1
    code = lua.add("a", '"new"', new_run_at, update_data=update_data, run_at_mode=mode, reset=reset)
    assert code == Dispatched.UPDATED
    job = lua.get_job("a")
    assert job["data"] == ('"new"' if update_data else '"x"')
    assert job["run_at"] == RUN_AT_MODES[mode](LATER, new_run_at)
    assert job["retry_count"] == (0 if reset else 1)
    assert lua.counts(now=LATEST) == {"waiting": 1, "delayed": 0, "blocked": 0, "active": 0}


def test_updated_waiting_job_is_dequeued_at_its_new_run_at(lua: Lua) -> None:
    lua.add("a", run_at=LATER)
    lua.add("a", run_at=NOW)
    assert lua.dequeue(now=NOW).ids == ["a"]


# ---------------------------------------------------------------- blocked jobs


def test_dispatch_with_the_id_of_an_active_job_creates_a_blocked_job(lua: Lua) -> None:
    lua.take("a")
    assert lua.add("a", '"second"') == Dispatched.BLOCKED
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 1, "active": 1}
    assert lua.dequeue("c2").jobs == []


def test_dispatch_with_the_id_of_a_blocked_job_updates_it(lua: Lua) -> None:
    lua.take("a")
    lua.add("a", '"second"')
    assert lua.add("a", '"third"') == Dispatched.BLOCKED_UPDATED
    assert lua.counts()["blocked"] == 1


def test_get_job_shows_the_active_job_while_one_is_blocked(lua: Lua) -> None:
    lua.take("a")
    lua.add("a", '"blocked"')
    job = lua.get_job("a")
    assert (job["state"], job["data"]) == ("active", '"x"')


@pytest.mark.parametrize("new_run_at", [SOON, LATEST], ids=["earlier", "later"])
@pytest.mark.parametrize("mode", RUN_AT_MODES)
@pytest.mark.parametrize("update_data", [True, False], ids=["data", "no_data"])
def test_update_flags_on_a_blocked_job(
    lua: Lua, update_data: bool, mode: str, new_run_at: int
) -> None:
    active = lua.take("a")
    lua.add("a", '"blocked"', LATER)
    code = lua.add("a", '"new"', new_run_at, update_data=update_data, run_at_mode=mode)
    assert code == Dispatched.BLOCKED_UPDATED
    assert lua.finish("c1", active) == Ack.OK  # the blocked record becomes waiting as it is
    job = lua.get_job("a", now=LATEST)
    assert job["data"] == ('"new"' if update_data else '"blocked"')
    assert job["run_at"] == RUN_AT_MODES[mode](LATER, new_run_at)


@pytest.mark.parametrize("new_run_at", [SOON, LATEST], ids=["earlier", "later"])
@pytest.mark.parametrize("reset", [True, False], ids=["reset", "no_reset"])
@pytest.mark.parametrize("mode", RUN_AT_MODES)
@pytest.mark.parametrize("update_data", [True, False], ids=["data", "no_data"])
def test_blocked_update_is_merged_into_the_retried_job(
    lua: Lua, update_data: bool, mode: str, reset: bool, new_run_at: int
) -> None:
    active = active_retried_once(lua, "a")
    code = lua.add("a", '"new"', new_run_at, update_data=update_data, run_at_mode=mode, reset=reset)
    assert code == Dispatched.BLOCKED
    assert lua.retry("c1", active, run_at=LATER) == Ack.OK
    job = lua.get_job("a", now=LATEST)
    assert job["data"] == ('"new"' if update_data else '"x"')
    assert job["run_at"] == RUN_AT_MODES[mode](LATER, new_run_at)
    assert job["retry_count"] == (0 if reset else 2)
    assert lua.counts(now=LATEST) == {"waiting": 1, "delayed": 0, "blocked": 0, "active": 0}


def test_blocked_updates_merge_their_data_flags(lua: Lua) -> None:
    active = lua.take("a")
    lua.add("a", '"first"', update_data=False, reset=False)
    lua.add("a", '"second"', update_data=True, reset=False)
    lua.retry("c1", active, run_at=NOW)
    assert lua.get_job("a")["data"] == '"second"'


def test_a_keep_update_does_not_undo_an_earlier_run_at_update(lua: Lua) -> None:
    active = lua.take("a")
    lua.add("a", run_at=LATEST, run_at_mode="if_later")
    lua.add("a", run_at=NOW, run_at_mode="keep")
    lua.retry("c1", active, run_at=LATER)
    assert lua.get_job("a")["run_at"] == LATEST


UPDATES = [(mode, at) for mode in RUN_AT_MODES for at in (SOON, LATEST)]


@pytest.mark.parametrize("second", UPDATES, ids=[f"{m}@{a - NOW}" for m, a in UPDATES])
@pytest.mark.parametrize("first", UPDATES, ids=[f"{m}@{a - NOW}" for m, a in UPDATES])
def test_two_blocked_updates_merge_as_on_a_waiting_job(
    lua: Lua, first: tuple[str, int], second: tuple[str, int]
) -> None:
    """Every ordered pair of updates (so both orders of each pair), to a job requeued at LATER:
    blocked while it is active, then retried at LATER; or applied to it waiting at LATER."""
    retried_once(lua, "w", run_at=LATER)
    active = active_retried_once(lua, "b")
    for n, (mode, at) in enumerate((first, second)):
        flags = {"run_at_mode": mode, "update_data": n == 0, "reset": n == 1}
        lua.add("w", f'"{n}"', at, **flags)
        lua.add("b", f'"{n}"', at, **flags)
    assert lua.retry("c1", active, run_at=LATER) == Ack.OK
    waiting, blocked = lua.get_job("w", now=LATEST), lua.get_job("b", now=LATEST)
    assert {**blocked, "id": "w"} == waiting
    assert waiting["run_at"] == RUN_AT_MODES[second[0]](
        RUN_AT_MODES[first[0]](LATER, first[1]), second[1]
    )


@pytest.mark.parametrize("end", ["finish", "fail"])
def test_blocked_job_becomes_waiting_when_the_active_one_ends(lua: Lua, end: str) -> None:
    active = lua.take("a")
    lua.add("a", '"blocked"', LATER)
    ack = lua.finish("c1", active) if end == "finish" else lua.fail("c1", active)
    assert ack == Ack.OK
    assert lua.counts() == {"waiting": 0, "delayed": 1, "blocked": 0, "active": 0}
    assert lua.dequeue(now=LATER - 1).jobs == []
    job = lua.dequeue(now=LATER).jobs[0]
    assert (job.id, job.data, job.run_at) == ("a", '"blocked"', LATER)


# ---------------------------------------------------------------- cancel


def waiting_job(lua: Lua) -> None:
    lua.add("a")


def delayed_job(lua: Lua) -> None:
    lua.add("a", run_at=LATER)


def blocked_job(lua: Lua) -> None:
    lua.take("a")
    lua.add("a", '"blocked"')


@pytest.mark.parametrize("setup", [waiting_job, delayed_job], ids=["waiting", "delayed"])
def test_cancel_removes_a_waiting_or_delayed_job(lua: Lua, setup: Callable) -> None:
    setup(lua)
    assert lua.cancel("a") == 1
    assert job_state(lua, "a") == "cancelled"  # its record is kept for the retention
    assert lua.cancel("a") == 0
    assert lua.counts(now=LATER) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert lua.dequeue(now=LATER).jobs == []


def test_cancel_removes_a_blocked_job_and_leaves_the_active_one(lua: Lua) -> None:
    blocked_job(lua)
    assert lua.cancel("a") == 1
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 1}
    assert job_state(lua, "a") == "active"


def test_cancelled_blocked_job_is_not_promoted_on_finish(lua: Lua) -> None:
    active = lua.take("a")
    lua.add("a", '"blocked"')
    lua.cancel("a")
    lua.finish("c1", active)
    assert job_state(lua, "a") == "finished"  # the active job's end, nothing promoted
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


def test_cancel_never_touches_an_active_job(lua: Lua, r: redis.Redis, prefix: str) -> None:
    active = lua.take("a")
    before = snapshot(r, prefix)
    assert lua.cancel("a") == 0
    assert snapshot(r, prefix) == before
    assert lua.finish("c1", active) == Ack.OK


def test_cancel_of_an_unknown_id_returns_0(lua: Lua) -> None:
    assert lua.cancel("nope") == 0


# ---------------------------------------------------------------- dequeue


def test_dequeue_orders_by_run_at(lua: Lua) -> None:
    lua.dispatch(("c", "3", NOW - 1), ("a", "1", NOW - 3), ("b", "2", NOW - 2))
    assert lua.dequeue().ids == ["a", "b", "c"]


def test_dequeue_never_returns_a_job_before_its_run_at(lua: Lua) -> None:
    lua.add("a", run_at=LATER)
    assert lua.dequeue(now=NOW).jobs == []
    assert lua.dequeue(now=LATER - 1).jobs == []
    assert lua.dequeue(now=LATER).ids == ["a"]


def test_dequeue_respects_the_batch_limit(lua: Lua) -> None:
    lua.dispatch(*[(f"j{n}", "0", NOW + n) for n in range(5)], now=NOW)
    later = NOW + 10
    assert [len(lua.dequeue(limit=2, now=later).jobs) for _ in range(4)] == [2, 2, 1, 0]


def test_dequeue_with_limit_0_only_registers_the_client(lua: Lua, r: redis.Redis) -> None:
    lua.add("a")
    assert lua.dequeue("c1", limit=0).jobs == []
    assert lua.counts()["waiting"] == 1
    assert r.zscore(lua.B + ":expiry", "c1") == NOW + EXPIRY


@pytest.mark.parametrize(
    "run_ats, expected",
    [([NOW], ""), ([NOW, LATER], str(LATER)), ([NOW, NOW, LATEST], str(NOW))],
    ids=["none_left", "delayed_left", "ready_left"],
)
def test_dequeue_returns_the_next_run_at(lua: Lua, run_ats: list[int], expected: str) -> None:
    lua.dispatch(*[(f"j{n}", "0", at) for n, at in enumerate(run_ats)])
    assert lua.dequeue(limit=1).next_run_at == expected


def test_dequeue_returns_job_fields_and_a_token_per_job(lua: Lua) -> None:
    retried_once(lua, "a", run_at=NOW)
    lua.add("b", '"b"')
    first, second = lua.dequeue().jobs
    assert (first.id, first.data, first.run_at, first.retry_count) == ("a", '"x"', NOW, 1)
    assert (second.stall_count, second.timeout_count) == (0, 0)
    assert first.token != second.token


def test_an_active_job_is_not_dequeued_again(lua: Lua) -> None:
    lua.take("a", client="c1")
    assert lua.dequeue("c2").jobs == []


# ---------------------------------------------------------------- leases and acks


def test_finish_removes_the_job(lua: Lua) -> None:
    assert lua.finish("c1", lua.take("a")) == Ack.OK
    assert job_state(lua, "a") == "finished"
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


ACKS: dict[str, Callable[[Lua, str, Leased, str | None], int]] = {
    "finish": lambda lua, client, job, token: lua.finish(client, job, token=token),
    "retry": lambda lua, client, job, token: lua.retry(client, job, NOW, token=token),
    "fail": lambda lua, client, job, token: lua.fail(client, job, token=token),
}


@pytest.mark.parametrize("ack", ACKS)
@pytest.mark.parametrize(
    "client, token", [("c1", "wrong-token"), ("c2", None)], ids=["wrong_token", "wrong_client"]
)
def test_ack_without_the_lease_is_stale_and_changes_nothing(
    lua: Lua, r: redis.Redis, prefix: str, ack: str, client: str, token: str | None
) -> None:
    job = lua.take("a", client="c1")
    lua.add("a", '"blocked"')
    before = snapshot(r, prefix)
    assert ACKS[ack](lua, client, job, token) == Ack.STALE
    assert snapshot(r, prefix) == before
    assert lua.finish("c1", job) == Ack.OK


def test_second_ack_of_one_lease_is_stale(lua: Lua) -> None:
    job = lua.take("a")
    assert lua.finish("c1", job) == Ack.OK
    assert lua.finish("c1", job) == Ack.STALE


def test_retry_of_an_unknown_kind_is_stale_and_keeps_the_lease(
    lua: Lua, r: redis.Redis, prefix: str
) -> None:
    job = lua.take("a")
    before = snapshot(r, prefix)
    assert lua.retry("c1", job, NOW, kind="sometimes") == Ack.STALE
    assert snapshot(r, prefix) == before
    assert lua.finish("c1", job) == Ack.OK


@pytest.mark.parametrize(
    "kind, count",
    [
        ("retry", "retry_count"),
        ("timeout", "timeout_count"),
        ("stall", "stall_count"),
        ("release", None),
    ],
)
def test_retry_kind_increments_its_count(lua: Lua, kind: str, count: str | None) -> None:
    job = lua.take("a")
    assert lua.retry("c1", job, run_at=LATER, kind=kind) == Ack.OK
    stored = lua.get_job("a")
    assert stored["state"] == "delayed"
    assert stored["run_at"] == LATER
    for name in ("retry_count", "stall_count", "timeout_count"):
        assert stored[name] == (1 if name == count else 0), name


def test_retried_job_is_dequeued_again_at_its_run_at(lua: Lua) -> None:
    lua.retry("c1", lua.take("a"), run_at=LATER)
    assert lua.dequeue(now=LATER - 1).jobs == []
    assert lua.dequeue(now=LATER).ids == ["a"]


# ---------------------------------------------------------------- fail


def test_fail_dispatches_the_fail_job_atomically(lua: Lua) -> None:
    job = lua.take("a")
    assert lua.fail("c1", job, fail_id="f1", fail_data='["x", {"id": "a"}]', now=LATER) == Ack.OK
    assert job_state(lua, "a") == "failed"
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    fail_job = lua.get_job("f1", now=LATER, base=lua.F)
    assert fail_job == {
        "state": "waiting",
        "id": "f1",
        "data": '["x", {"id": "a"}]',
        "run_at": LATER,
        "retry_count": 0,
        "stall_count": 0,
        "timeout_count": 0,
    }


def test_fail_without_a_fail_queue_only_ends_the_job(lua: Lua) -> None:
    assert lua.fail("c1", lua.take("a"), with_fail_queue=False) == Ack.OK
    assert job_state(lua, "a") == "failed"
    assert lua.counts(base=lua.F) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


def published(r: redis.Redis, channel: str, action: Callable[[], object]) -> list[str]:
    """Messages published on `channel` while `action` runs (read up to an end mark we send)."""
    with r.pubsub(ignore_subscribe_messages=True) as pubsub:
        pubsub.ssubscribe(channel)
        action()
        r.spublish(channel, END_MARK)
        messages = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1.0)  # None for the subscribe confirmation
            if message is not None and message["data"] == END_MARK:
                return messages
            if message is not None:
                messages.append(message["data"])
    raise AssertionError(f"the end mark never arrived on {channel}")


def test_fail_publishes_a_wake_up_on_the_fail_queue(lua: Lua, r: redis.Redis) -> None:
    job = lua.take("a")
    assert published(r, lua.F + ":wake", lambda: lua.fail("c1", job, now=LATER)) == [str(LATER)]


def test_dispatch_publishes_the_earliest_new_run_at(lua: Lua, r: redis.Redis) -> None:
    jobs = [("a", "1", LATEST), ("b", "2", LATER)]
    assert published(r, lua.B + ":wake", lambda: lua.dispatch(*jobs)) == [str(LATER)]


def test_blocked_dispatch_publishes_nothing(lua: Lua, r: redis.Redis) -> None:
    lua.take("a")
    assert published(r, lua.B + ":wake", lambda: lua.add("a")) == []


# ---------------------------------------------------------------- sweep of dead clients


def test_dequeue_sweeps_a_dead_client_and_requeues_its_jobs(lua: Lua) -> None:
    lua.take("a", client="c1")
    job = lua.dequeue("c2", now=DEAD).jobs[0]
    assert (job.id, job.stall_count, job.retry_count) == ("a", 1, 0)


def test_bump_sweeps_a_dead_client(lua: Lua) -> None:
    lua.take("a", client="c1")
    assert lua.bump("c2", now=DEAD) == Status.OK
    job = lua.get_job("a", now=DEAD)
    assert (job["state"], job["stall_count"], job["run_at"]) == ("waiting", 1, DEAD)


def test_a_client_is_not_swept_before_its_expiry(lua: Lua) -> None:
    lua.take("a", client="c1")
    lua.bump("c2", now=NOW + EXPIRY - 1)
    assert job_state(lua, "a") == "active"


def test_a_client_never_sweeps_itself(lua: Lua) -> None:
    lua.take("a", client="c1")
    assert lua.dequeue("c1", now=DEAD).status == Status.OK
    assert job_state(lua, "a") == "active"


def test_a_bump_keeps_a_client_alive(lua: Lua) -> None:
    lua.take("a", client="c1")
    lua.bump("c1", now=NOW + EXPIRY - 1)
    lua.bump("c2", now=DEAD)
    assert job_state(lua, "a") == "active"


def test_a_swept_client_is_told_so_by_bump_and_dequeue(lua: Lua) -> None:
    lua.take("a", client="c1")
    lua.bump("c2", now=DEAD)
    assert lua.bump("c1", now=DEAD) == Status.SWEPT
    checkout = lua.dequeue("c1", now=DEAD)
    assert (checkout.status, checkout.next_run_at, checkout.jobs) == (Status.SWEPT, "", [])
    assert job_state(lua, "a", now=DEAD) == "waiting"


def test_late_finish_of_a_swept_client_is_stale_and_changes_nothing(
    lua: Lua, r: redis.Redis, prefix: str
) -> None:
    zombie_job = lua.take("a", client="c1")
    new_job = lua.dequeue("c2", now=DEAD).jobs[0]
    before = snapshot(r, prefix)
    assert lua.finish("c1", zombie_job, now=DEAD) == Ack.STALE
    assert snapshot(r, prefix) == before
    assert lua.finish("c2", new_job, now=DEAD) == Ack.OK


def test_a_sweep_takes_at_most_one_dead_client(lua: Lua) -> None:
    lua.take("a", client="c1")
    lua.take("b", client="c2")
    lua.bump("c3", now=DEAD)
    assert sorted([job_state(lua, "a", DEAD), job_state(lua, "b", DEAD)]) == ["active", "waiting"]
    lua.bump("c3", now=DEAD)
    assert [job_state(lua, "a", DEAD), job_state(lua, "b", DEAD)] == ["waiting", "waiting"]


def test_a_sweep_applies_the_blocked_update(lua: Lua) -> None:
    lua.take("a", client="c1")
    lua.add("a", '"new"', reset=False)
    lua.bump("c2", now=DEAD)
    job = lua.get_job("a", now=DEAD)
    assert (job["data"], job["stall_count"]) == ('"new"', 1)
    assert lua.counts(now=DEAD) == {"waiting": 1, "delayed": 0, "blocked": 0, "active": 0}


def test_leave_without_leases_stops_the_client_expiry(lua: Lua, r: redis.Redis) -> None:
    lua.dequeue("c1", limit=0)
    assert lua.leave("c1") == 0
    assert r.zscore(lua.B + ":expiry", "c1") is None


def test_leave_with_leases_keeps_them_for_the_sweep(lua: Lua) -> None:
    lua.take("a", client="c1")
    assert lua.leave("c1") == 1
    lua.bump("c2", now=DEAD)
    assert job_state(lua, "a", now=DEAD) == "waiting"


# ---------------------------------------------------------------- introspection


def test_get_job_states(lua: Lua) -> None:
    lua.take("active")
    lua.add("waiting", run_at=NOW)
    lua.add("delayed", run_at=LATER)
    states = {id: job_state(lua, id) for id in ("active", "waiting", "delayed", "missing")}
    assert states == {
        "active": "active",
        "waiting": "waiting",
        "delayed": "delayed",
        "missing": None,
    }
    assert job_state(lua, "delayed", now=LATER) == "waiting"


def test_counts_per_state(lua: Lua) -> None:
    lua.take("a")
    lua.add("a", '"blocked"')
    lua.add("w1", run_at=NOW - 1)
    lua.add("w2", run_at=NOW)
    lua.add("d", run_at=LATER)
    assert lua.counts() == {"waiting": 2, "delayed": 1, "blocked": 1, "active": 1}
    assert lua.counts(now=LATER) == {"waiting": 3, "delayed": 0, "blocked": 1, "active": 1}


# ---------------------------------------------------------------- events


def test_finish_writes_one_event_with_every_field(lua: Lua) -> None:
    lua.finish("c1", lua.take("a"), now=LATER)
    (event,) = lua.events()
    assert set(event) == EVENT_FIELDS
    assert event == event | {
        "id": "a",
        "queue": "q",
        "outcome": "finished",
        "run_at": str(NOW),
        "started_at": str(LATER - 5),
        "ended_at": str(LATER),
        "client": "c1",
        "pid": "42",
        "error_name": "",
        "error_kind": "",
    }


def test_every_outcome_writes_one_event(lua: Lua) -> None:
    lua.add("cancelled")
    lua.cancel("cancelled")
    lua.finish("c1", lua.take("finished"))
    for kind in ("retry", "timeout", "stall", "release"):
        lua.retry("c1", lua.take(kind), run_at=LATER, kind=kind)
    lua.fail("c1", lua.take("failed"))
    lua.leave("c1")
    lua.take("swept", client="c2")
    lua.bump("c3", now=DEAD)
    outcomes = [(e["id"], e["outcome"], e["error_kind"]) for e in lua.events()]
    assert outcomes == [
        ("cancelled", "cancelled", ""),
        ("finished", "finished", ""),
        ("retry", "retried", "retriable"),
        ("timeout", "timed_out", "stall"),
        ("stall", "stalled", "stall"),
        ("release", "released", ""),
        ("failed", "failed", "permanent"),
        ("swept", "stalled", "stall"),
    ]


def test_event_counts_are_those_after_the_outcome(lua: Lua) -> None:
    lua.retry("c1", lua.take("a"), run_at=NOW, kind="timeout")
    (event,) = lua.events()
    assert (event["timeout_count"], event["error_name"]) == ("1", "ValueError")


def test_dispatch_and_stale_acks_write_no_event(lua: Lua) -> None:
    job = lua.take("a")
    lua.add("b")
    lua.finish("c1", job, token="wrong")
    assert lua.events() == []


def test_maxlen_0_writes_no_event(lua: Lua, r: redis.Redis) -> None:
    lua.add("a")
    lua.cancel("a", maxlen=0)
    lua.take("b", client="c1")
    lua.bump("c2", now=DEAD, maxlen=0)
    assert job_state(lua, "b", now=DEAD) == "waiting"
    assert r.exists(lua.B + ":events") == 0


# ---------------------------------------------------------------- version handshake


def load_version(conn: redis.Redis, version: str) -> None:
    """Install the bundled library with its VERSION line changed to `version`."""
    line = f"local VERSION = '{bundled_version()}'"
    assert line in source()
    conn.function_load(source().replace(line, f"local VERSION = '{version}'"), replace=True)


def test_library_is_loaded_when_missing(raw: redis.Redis) -> None:
    raw.function_delete("queasy")
    assert installed_version(raw) is None
    assert ensure_loaded(raw) == bundled_version()
    assert installed_version(raw) == bundled_version()


def test_older_library_is_replaced(raw: redis.Redis) -> None:
    load_version(raw, "0.9.0")
    assert ensure_loaded(raw) == bundled_version()
    assert installed_version(raw) == bundled_version()


def test_newer_minor_library_is_kept(raw: redis.Redis) -> None:
    major, minor, _ = parse_version(bundled_version())
    newer = f"{major}.{minor + 1}.0"
    load_version(raw, newer)
    assert ensure_loaded(raw) == newer
    assert installed_version(raw) == newer


def test_newer_major_library_is_refused_naming_both_versions(raw: redis.Redis) -> None:
    newer = f"{parse_version(bundled_version())[0] + 1}.0.0"
    load_version(raw, newer)
    with pytest.raises(VersionMismatch) as caught:
        ensure_loaded(raw)
    assert newer in str(caught.value)
    assert bundled_version() in str(caught.value)
    assert installed_version(raw) == newer


# ---------------------------------------------------------------- cluster-safe keys


MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ [^\]]*\] (.*)$")
MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def monitored_commands(redis_url: str, r: redis.Redis, action: Callable[[], None]) -> list:
    """Every command the server ran (client and Lua) while `action` ran, as argument lists."""
    commands = []
    with redis.Redis.from_url(redis_url, decode_responses=True) as conn, conn.monitor() as mon:
        action()
        r.echo(END_MARK)
        while True:
            line = mon.connection.read_response()
            args = [
                codecs.decode(arg, "unicode_escape")
                for arg in MONITOR_ARG.findall(MONITOR_LINE.match(line).group(1))
            ]
            if args == ["ECHO", END_MARK]:
                return commands
            commands.append(args)


def keys_of(r: redis.Redis, command: list[str]) -> list[str]:
    try:
        return r.command_getkeys(*command)
    except redis.ResponseError:  # no key arguments (TIME, PUBLISH, HELLO, ...)
        return []


def hash_tag(key: str) -> str:
    """The part of `key` Redis Cluster hashes: the first non-empty {...}, else the whole key."""
    start = key.find("{")
    end = key.find("}", start + 1)
    if start == -1 or end == -1 or end == start + 1:
        return key
    return key[start + 1 : end]


def exercise_every_function(lua: Lua) -> None:
    lua.add("a")
    lua.add("b", run_at=LATER)
    lua.cancel("b")
    active = lua.dequeue("c1", limit=1).jobs[0]
    lua.add("a", '"blocked"')
    lua.retry("c1", active, run_at=NOW)
    active = lua.dequeue("c1", limit=1).jobs[0]
    lua.add("a", '"blocked"')
    lua.finish("c1", active)
    lua.fail("c1", lua.dequeue("c1", limit=1).jobs[0], fail_id="f1")
    lua.take("s", client="c2")
    lua.bump("c1", now=DEAD)
    lua.leave("c1")
    lua.get_job("a")
    lua.get_job("f1", base=lua.F)
    lua.counts()
    lua.counts(base=lua.F)
    lua.call("queasy_version", [])


def test_every_key_a_function_touches_shares_the_queue_hash_tag(
    lua: Lua, r: redis.Redis, redis_url: str
) -> None:
    commands = monitored_commands(redis_url, r, lambda: exercise_every_function(lua))
    keys = {key for command in commands for key in keys_of(r, command)}
    assert any(key.startswith(lua.B + ":") for key in keys)
    assert any(key.startswith(lua.F + ":") for key in keys)
    assert {key: hash_tag(key) for key in keys} == {key: "q" for key in keys}


FOREIGN_QUEASY = """#!lua name=queasy
redis.register_function{function_name = 'queasy_version', callback = function() return 1 end,
  flags = {'no-writes'}}
redis.register_function('queasy_dispatch', function() return 'node' end)
"""
FOREIGN_WITHOUT_VERSION = """#!lua name=queasy
redis.register_function('queasy_add', function() return 'other' end)
"""


def function_names(conn: redis.Redis) -> set[str]:
    (library,) = conn.function_list(library="queasy")
    return {
        f[b"name"].decode()
        for f in dict(zip(*[iter(library)] * 2, strict=True))[b"functions"]
        for f in [dict(zip(*[iter(f)] * 2, strict=True))]
    }


@pytest.mark.parametrize(
    "foreign", [FOREIGN_QUEASY, FOREIGN_WITHOUT_VERSION], ids=["version_1", "no_version"]
)
def test_a_foreign_library_named_queasy_is_refused_and_kept(raw: redis.Redis, foreign) -> None:
    raw.function_load(foreign, replace=True)
    kept = function_names(raw)
    with pytest.raises(VersionMismatch, match="not queasy_py's"):
        ensure_loaded(raw)
    assert function_names(raw) == kept


def test_a_foreign_library_is_refused_by_the_async_client(raw: redis.Redis, redis_url) -> None:
    from queasy_py.aio import AsyncClient

    raw.function_load(FOREIGN_QUEASY, replace=True)

    async def main() -> None:
        client = AsyncClient(redis_url)
        try:
            with pytest.raises(VersionMismatch, match="returned 1"):
                await client.ready()
        finally:
            await client.close()

    import asyncio

    asyncio.run(main())
    assert "queasy_dispatch" in function_names(raw) and "queasy_library" not in function_names(raw)


def legacy_source(version: str = "1.1.1", no_writes: bool = True) -> str:
    """The bundled library as a queasy_py 1.1 would be: no queasy_library marker, and (with
    no_writes False) queasy_version registered without the no-writes flag."""
    text = source().replace(
        f"local VERSION = '{bundled_version()}'", f"local VERSION = '{version}'"
    )
    text = re.sub(
        r"(?m)^redis\.register_function\{function_name = 'queasy_library'.*\n.*\n", "", text
    )
    if not no_writes:
        text = re.sub(
            r"redis\.register_function\{function_name = 'queasy_version', callback = version,\n"
            r"  flags = \{'no-writes'\}\}",
            "redis.register_function('queasy_version', version)",
            text,
        )
    return text


@pytest.mark.parametrize("no_writes", [True, False], ids=["ro_version", "rw_version"])
def test_an_older_own_library_of_any_shape_is_upgraded(raw: redis.Redis, no_writes: bool) -> None:
    raw.function_load(legacy_source(no_writes=no_writes), replace=True)
    assert ensure_loaded(raw) == bundled_version()
    assert installed_version(raw) == bundled_version()
    assert raw.fcall_ro("queasy_library", 0) == f"queasy_py {bundled_version()}".encode()
