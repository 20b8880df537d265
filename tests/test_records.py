"""Job records after the end (issue #11): what finish, retry, fail and cancel keep, the
retention that bounds them, the events' new fields, counts with totals, and the operator
calls (jobs by state, requeue of failed jobs, purge) - the Lua library through FCALL, then
the producer API above it. Time is explicit (lua_calls.NOW); nothing sleeps."""

from __future__ import annotations

import asyncio
import threading
import time
import tomllib
from collections.abc import Iterator

import pytest
import redis
from lua_calls import COUNTS, HOST, NOW, SCHEDULE_ID, Lua, live, schedule
from test_lua import published

from queasy_py import Client, ConfigError, InvalidInput, JobInfo, Queue
from queasy_py.cli import config
from queasy_py.options import ListenOptions
from queasy_py.store import events
from queasy_py.store.library import Ack, ensure_loaded

MINUTE = 60_000
TRACE = 'Traceback (most recent call last):\n  File "h.py", line 1\nValueError: bad value\n'


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


@pytest.fixture
def q(redis_url: str, prefix: str) -> Iterator[Queue]:
    with Client(redis_url, workers=0, prefix=prefix) as client:
        yield client.queue("q")


def ended(lua: Lua, state: str) -> list[str]:
    """The ids kept as `state`, oldest first (the index the retention trims)."""
    return lua.r.zrange(f"{lua.B}:{state}", 0, -1)


def finish_all(lua: Lua, ids: list[str], now: int = NOW, **kwargs: object) -> None:
    for id in ids:
        assert lua.finish("c1", lua.take(id, now=now), now=now, **kwargs) == Ack.OK


# ---------------------------------------------------------------- what an end keeps


def test_a_finished_job_keeps_its_record_with_the_end(lua: Lua) -> None:
    lua.add("a", '{"n": 1}', run_at=NOW - 50, now=NOW - 100)  # dispatched 100 ms before
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.finish("c1", job, now=NOW + 30, pid="4242", result='{"sum": 3}') == Ack.OK
    rec = lua.record("a")
    assert rec is not None and "token" not in rec  # the lease token is never shown
    assert rec["state"] == "finished"
    assert (rec["data"], rec["run_at"], rec["enqueued_at"]) == (
        '{"n": 1}',
        str(NOW - 50),
        str(NOW - 100),
    )
    assert (rec["ended_at"], rec["started_at"], rec["leased_at"]) == (
        str(NOW + 30),
        str(NOW + 25),
        str(NOW),
    )
    assert (rec["pid"], rec["client"], rec["host"], rec["attempts"]) == ("4242", "c1", HOST, "1")
    assert rec["result"] == '{"sum": 3}'
    assert "error_name" not in rec
    assert ended(lua, "finished") == ["a"]
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


def test_a_retry_keeps_its_error_as_the_last_error_and_the_event_carries_it(lua: Lua) -> None:
    lua.add("a", now=NOW - 7)
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.retry("c1", job, NOW + 5_000, message="bad value", traceback=TRACE) == Ack.OK
    rec = lua.record("a")
    assert rec["state"] == "delayed" and rec["attempts"] == "1"
    assert (rec["error_name"], rec["error_kind"], rec["error_message"]) == (
        "ValueError",
        "retriable",
        "bad value",
    )
    assert (rec["traceback"], rec["error_at"]) == (TRACE, str(NOW))
    assert "client" not in rec and "leased_at" not in rec  # waiting again: no lease fields
    (event,) = lua.events()
    assert (event["outcome"], event["error_message"], event["traceback"]) == (
        "retried",
        "bad value",
        TRACE,
    )
    assert event["enqueued_at"] == str(NOW - 7)
    # run again and finished: the record still says what went wrong on the way
    job = lua.dequeue("c1", limit=1, now=NOW + 5_000).jobs[0]
    assert lua.finish("c1", job, now=NOW + 5_001) == Ack.OK
    rec = lua.record("a")
    assert (rec["state"], rec["attempts"], rec["error_message"]) == ("finished", "2", "bad value")


def test_an_event_keeps_the_end_of_a_long_traceback_on_a_character_boundary(lua: Lua) -> None:
    trace = "é" * 1500 + "\nValueError: the end\n"  # 3000+ bytes, two per character
    job = lua.take("a")
    assert lua.retry("c1", job, NOW, traceback=trace) == Ack.OK
    (event,) = lua.events()
    kept = event["traceback"]  # decode_responses: a cut inside a character would not decode
    assert len(kept.encode()) <= 1024 and trace.endswith(kept)
    assert len(kept.encode()) >= 1023  # only what a character cut at the start cost
    assert lua.record("a")["traceback"] == trace  # the record keeps it whole


def test_a_failed_job_keeps_its_record_with_the_error(lua: Lua) -> None:
    job = lua.take("a")
    assert lua.fail("c1", job, now=NOW + 9, message="no such key", traceback=TRACE) == Ack.OK
    rec = lua.record("a")
    assert rec["state"] == "failed"
    assert (rec["error_name"], rec["error_kind"], rec["error_message"]) == (
        "KeyError",
        "permanent",
        "no such key",
    )
    assert (rec["traceback"], rec["error_at"], rec["ended_at"]) == (
        TRACE,
        str(NOW + 9),
        str(NOW + 9),
    )
    assert ended(lua, "failed") == ["a"] and ended(lua, "finished") == []
    (event,) = lua.events()
    assert (event["error_message"], event["traceback"]) == ("no such key", TRACE)


def test_a_cancelled_job_keeps_its_record(lua: Lua) -> None:
    lua.add("a", '"x"', run_at=NOW + 9_000)
    assert lua.cancel("a", now=NOW + 1) == 1
    rec = lua.record("a")
    assert (rec["state"], rec["ended_at"], rec["data"]) == ("cancelled", str(NOW + 1), '"x"')
    assert ended(lua, "cancelled") == ["a"]


def test_a_blocked_job_cancelled_keeps_no_update_fields(lua: Lua) -> None:
    active = lua.take("a")
    lua.add("a", '"blocked"')
    assert lua.cancel("a") == 1
    assert lua.get_job("a")["state"] == "active"  # the live job first
    record = lua.r.hgetall(f"{lua.B}:ended:a")
    end = lua.r.hget(f"{lua.B}:ends", "a").split(" ")
    assert end[:4] == ["cancelled", str(NOW), "-", "-"]  # it never ran: no start, no pid
    assert record["data"] == '"blocked"' and not [f for f in record if f.startswith("u_")]
    assert lua.finish("c1", active) == Ack.OK
    assert lua.record("a")["state"] == "finished"  # its end replaces the cancelled record
    assert ended(lua, "finished") == ["a"] and lua.jobs("cancelled") == ("0", [])
    assert lua.r.keys(f"{lua.B}:ended:*") == []  # finished, never failed: only its end kept


def test_an_id_that_ends_again_moves_to_its_new_state(lua: Lua) -> None:
    finish_all(lua, ["a"])
    assert lua.fail("c1", lua.take("a", now=NOW + 1), now=NOW + 1) == Ack.OK
    assert lua.record("a")["state"] == "failed"
    assert ended(lua, "failed") == ["a"]  # the finished index may keep the id: readers skip it
    assert lua.jobs("finished") == ("0", []) and lua.jobs("failed")[1][0][0] == "failed"
    assert lua.purge("finished") == [1, 0]  # unindexed only: the failed record stays
    assert lua.record("a")["state"] == "failed" and lua.requeue(now=NOW + 2) == [1, NOW + 2, 1]


def test_the_trim_of_one_state_keeps_an_id_that_ended_again_in_another(lua: Lua) -> None:
    finish_all(lua, ["a"], keep=(1, 3_600_000))
    assert lua.fail("c1", lua.take("a", now=NOW + 1), now=NOW + 1) == Ack.OK
    finish_all(lua, ["b"], now=NOW + 2, keep=(1, 3_600_000))  # trims "a" from finished
    assert ended(lua, "finished") == ["b"] and ended(lua, "failed") == ["a"]
    assert lua.record("a")["state"] == "failed" and lua.record("a")["data"] == '"x"'


def test_a_retention_of_zero_keeps_nothing_and_drops_an_earlier_record(lua: Lua) -> None:
    finish_all(lua, ["a"])
    finish_all(lua, ["a", "b"], now=NOW + 1, keep=(0, 3_600_000))
    assert lua.record("a") is None and lua.record("b") is None
    assert ended(lua, "finished") == []
    assert lua.r.keys(f"{lua.B}:ended:*") == []


# ---------------------------------------------------------------- retention


def test_the_retention_keeps_the_newest_count(lua: Lua) -> None:
    for n in range(10):
        finish_all(lua, [f"j{n}"], now=NOW + n, keep=(3, 3_600_000))
    assert ended(lua, "finished") == ["j7", "j8", "j9"]
    assert sorted(lua.r.hkeys(f"{lua.B}:ends")) == ["j7", "j8", "j9"]
    assert lua.record("j6") is None and lua.record("j9")["state"] == "finished"


def test_the_retention_drops_records_older_than_its_age(lua: Lua) -> None:
    finish_all(lua, ["old"], now=NOW, keep=(100, 5_000))
    finish_all(lua, ["new"], now=NOW + 5_001, keep=(100, 5_000))
    assert ended(lua, "finished") == ["new"] and lua.record("old") is None


def test_the_trim_is_bounded_per_call_and_catches_up(lua: Lua) -> None:
    """A call that ends n jobs drops at most n + 2 old records: lowering the retention from
    50 to 0 does not make one call delete 50 records, later calls catch up."""
    finish_all(lua, [f"j{n}" for n in range(50)], keep=(50, 3_600_000))
    assert len(ended(lua, "finished")) == 50
    finish_all(lua, ["x"], now=NOW + 1, keep=(0, 3_600_000))
    assert len(ended(lua, "finished")) == 47  # 1 + 2 trimmed, x itself not kept
    for n in range(30):
        finish_all(lua, [f"y{n}"], now=NOW + 2, keep=(0, 3_600_000))
    assert ended(lua, "finished") == [] and lua.r.keys(f"{lua.B}:ended:*") == []


def test_a_cancel_trims_the_cancelled_records(lua: Lua) -> None:
    for n in range(4):
        lua.add(f"c{n}")
        assert lua.cancel(f"c{n}", now=NOW + n, keep=(2, 3_600_000)) == 1
    assert ended(lua, "cancelled") == ["c2", "c3"]


# ---------------------------------------------------------------- notifications


def test_an_end_is_published_on_the_jobs_channel_when_asked(lua: Lua, r: redis.Redis) -> None:
    channel = f"{lua.B}:done:a"
    job = lua.take("a")
    assert published(r, channel, lambda: lua.finish("c1", job, notify=True)) == ["finished"]
    job = lua.take("a", now=NOW + 1)
    assert published(r, channel, lambda: lua.fail("c1", job, now=NOW + 1, notify=True)) == [
        "failed"
    ]
    job = lua.take("a", now=NOW + 2)
    assert published(r, channel, lambda: lua.finish("c1", job, now=NOW + 2)) == []  # not asked
    lua.add("a", now=NOW + 3)
    assert published(r, channel, lambda: lua.cancel("a", now=NOW + 3)) == ["cancelled"]


def test_finish_refuses_a_result_that_is_not_json(lua: Lua, r: redis.Redis, prefix: str) -> None:
    job = lua.take("a")
    with pytest.raises(redis.ResponseError, match="INVALID job 1 result is not JSON"):
        lua.finish("c1", job, result="{nope")
    assert lua.get_job("a")["state"] == "active"  # nothing written
    assert lua.finish("c1", job, result="[1, 2]") == Ack.OK


# ---------------------------------------------------------------- counts


def test_counts_total_the_ends_and_estimate_the_last_minute_and_hour(lua: Lua) -> None:
    start = (NOW // MINUTE) * MINUTE  # the start of a minute
    finish_all(lua, ["a", "b", "c"], now=start + 10_000)
    for id in ("d", "e"):
        assert lua.fail("c1", lua.take(id, now=start + 20_000), now=start + 20_000) == Ack.OK
    counts = lua.counts_all(now=start + 30_000)
    assert [counts[k] for k in COUNTS[4:]] == [3, 2, 3, 2, 3, 2]
    # 30 s into the next minute: half the last minute's count is still in the window
    later = lua.counts_all(now=start + MINUTE + 30_000)
    assert (later["finished_last_minute"], later["failed_last_minute"]) == (2, 1)  # 1.5, 1.0
    assert (later["finished_last_hour"], later["failed_last_hour"]) == (3, 2)
    gone = lua.counts_all(now=start + 62 * MINUTE)
    assert (gone["finished"], gone["finished_last_minute"], gone["finished_last_hour"]) == (3, 0, 0)


def test_the_per_minute_counts_of_more_than_an_hour_ago_are_dropped(lua: Lua) -> None:
    start = (NOW // MINUTE) * MINUTE
    for m in range(0, 150, 10):  # a job every 10 minutes for 2.5 hours
        finish_all(lua, [f"j{m}"], now=start + m * MINUTE)
    buckets = [f for f in lua.r.hkeys(f"{lua.B}:stats") if ":" in f]
    assert len(buckets) <= 7 and f"finished:{start // MINUTE + 140}" in buckets
    assert lua.counts_all(now=start + 140 * MINUTE)["finished"] == 15


# ---------------------------------------------------------------- listing, requeue, purge


def page_ids(lua: Lua, state: str, limit: int, now: int = NOW) -> list[list[str]]:
    """The ids of each page of `state`, following the cursors to the end."""
    pages, cursor = [], "0"
    while True:
        cursor, jobs = lua.jobs(state, cursor, limit, now=now)
        pages.append([fields["id"] for _, fields in jobs])
        assert all(st == state for st, _ in jobs)
        if cursor == "0":
            return pages


def test_jobs_pages_through_each_state(lua: Lua) -> None:
    active = [lua.take(f"a{n}", client=f"c{n % 2}") for n in range(3)]
    lua.add("a0", '"again"')  # blocked
    for n, job in enumerate(active[1:]):
        assert lua.finish(f"c{(n + 1) % 2}", job, now=NOW + n) == Ack.OK
    lua.dispatch(*[(f"w{n:02}", '"x"', NOW - 100 + n) for n in range(25)])
    lua.dispatch(*[(f"d{n}", '"x"', NOW + 1_000 + n) for n in range(4)])
    ready = [f"w{n:02}" for n in range(25)]
    assert page_ids(lua, "waiting", 10) == [ready[:10], ready[10:20], ready[20:]]
    assert page_ids(lua, "delayed", 3) == [["d0", "d1", "d2"], ["d3"]]
    assert page_ids(lua, "finished", 1) == [["a2"], ["a1"]]  # newest first
    assert [i for p in page_ids(lua, "active", 1) for i in p] == ["a0"]
    assert [i for p in page_ids(lua, "blocked", 5) for i in p] == ["a0"]
    assert page_ids(lua, "failed", 5) == [[]]
    cursor, jobs = lua.jobs("waiting", limit=1, data=True)
    assert jobs[0][1]["data"] == '"x"' and "data" not in lua.jobs("waiting", limit=1)[1][0][1]


def test_pages_go_on_after_the_last_job_listed_while_jobs_leave_the_head(lua: Lua) -> None:
    """A page's cursor is the last job it listed (5.1.1), not an offset: a supervisor's
    dequeue of the jobs at the head of the waiting listing between two pages made the next
    page skip as many jobs that were still waiting (5.1.0 listed w3..w5 never), and the ends
    written between two pages of finished jobs (newest first) made it list the same ones
    again."""
    lua.dispatch(*[(f"w{n}", '"x"', NOW) for n in range(6)])
    cursor, first = lua.jobs("waiting", "0", 3, now=NOW + 1)
    assert [f["id"] for _, f in first] == ["w0", "w1", "w2"]
    taken = lua.dequeue("c1", limit=3, now=NOW + 2).jobs  # a supervisor takes the head
    assert [job.id for job in taken] == ["w0", "w1", "w2"]
    cursor, rest = lua.jobs("waiting", cursor, 3, now=NOW + 3)
    assert [f["id"] for _, f in rest] == ["w3", "w4", "w5"] and cursor == "0"
    for job in taken:
        assert lua.finish("c1", job, now=NOW + 10) == Ack.OK
    cursor, first = lua.jobs("finished", "0", 2, now=NOW + 20)
    assert [f["id"] for _, f in first] == ["w2", "w1"]  # (one ended_at: by id, newest first)
    for job in lua.dequeue("c1", limit=2, now=NOW + 21).jobs:
        assert lua.finish("c1", job, now=NOW + 30) == Ack.OK  # two newer ends
    cursor, rest = lua.jobs("finished", cursor, 2, now=NOW + 40)
    assert [f["id"] for _, f in rest] == ["w0"] and cursor == "0"
    # the job a cursor names left meanwhile: the page goes on after its place, not from the
    # first job of its run_at again (all these have one run_at)
    lua.dispatch(*[(f"d{n}", '"x"', NOW + 1_000) for n in range(4)])
    cursor, first = lua.jobs("delayed", "0", 2, now=NOW + 40)
    assert [f["id"] for _, f in first] == ["d0", "d1"]
    assert lua.cancel("d1", now=NOW + 41) == 1
    cursor, rest = lua.jobs("delayed", cursor, 5, now=NOW + 42)
    assert [f["id"] for _, f in rest] == ["d2", "d3"] and cursor == "0"
    # an offset, 5.1.0's cursor, is still taken
    assert [f["id"] for _, f in lua.jobs("delayed", "1", 5, now=NOW + 42)[1]] == ["d2", "d3"]


def test_pages_after_the_first_need_no_command_beyond_the_acl_line(
    lua: Lua, redis_url: str, prefix: str
) -> None:
    """The README's ACL line (tests/test_security.py) lets a user page through every state:
    the cursors of 5.1.1 are followed with the commands it grants (no ZRANK)."""
    from urllib.parse import urlsplit

    from test_security import acl_line

    user, at = f"pager-{prefix}", urlsplit(redis_url)
    url = f"redis://{user}:pager-pw-5e1c@{at.hostname}:{at.port}/0"
    lua.r.execute_command(*acl_line(user, "pager-pw-5e1c", prefix).split())
    try:
        now = int(time.time() * 1000)  # (the API reads on the server's clock)
        lua.dispatch(*[(f"j{n}", '"x"', now) for n in range(5)], now=now)
        lua.dispatch(*[(f"later{n}", '"x"', now + 10**9) for n in range(3)], now=now)
        for job in lua.dequeue("c1", limit=2, now=now).jobs:
            assert lua.finish("c1", job, now=now) == Ack.OK
        lua.dequeue("c2", limit=1, now=now)
        lua.dequeue("c3", limit=1, now=now)
        with Client(url, prefix=prefix) as client:
            q = client.queue("q")
            listed: dict[str, list[str]] = {}
            for state in ("waiting", "delayed", "active", "finished"):
                cursor, listed[state] = "0", []
                while True:
                    page, cursor = q.jobs(state, cursor=cursor, limit=1)
                    listed[state] += [job.id for job in page]
                    if cursor == "0":
                        break
        assert listed["waiting"] == ["j4"] and listed["delayed"] == ["later0", "later1", "later2"]
        assert sorted(listed["active"]) == ["j2", "j3"]
        assert sorted(listed["finished"]) == ["j0", "j1"]
    finally:
        lua.r.execute_command("ACL", "DELUSER", user)


def test_active_pages_hold_on_through_heartbeats(lua: Lua) -> None:
    """A page of active jobs names the client its next page goes on with (5.1.1): a
    heartbeat between two pages, which moves its client in B:expiry (ordered by expiry),
    neither lists that client's jobs again nor passes over the other's (5.1.0 kept a rank in
    B:expiry: the second page listed cA's jobs again and never cB's)."""
    lua.dispatch(*[(f"a{n}", '"x"', NOW) for n in range(3)])
    assert len(lua.dequeue("cA", limit=3).jobs) == 3
    lua.dispatch(*[(f"b{n}", '"x"', NOW) for n in range(3)])
    assert len(lua.dequeue("cB", limit=3, now=NOW + 1).jobs) == 3
    cursor, first = lua.jobs("active", "0", 3, now=NOW + 2)
    assert [f["id"] for _, f in first] == ["a0", "a1", "a2"] and cursor != "0"
    assert lua.bump("cA", now=NOW + 500) == 0  # cA's heartbeat: now after cB in B:expiry
    cursor, second = lua.jobs("active", cursor, 3, now=NOW + 600)
    assert [f["id"] for _, f in second] == ["b0", "b1", "b2"] and cursor == "0"
    # a client that left between two pages: the listing goes on with the next one
    lua.dispatch(*[(f"c{n}", '"x"', NOW) for n in range(2)])
    assert len(lua.dequeue("cC", limit=2, now=NOW + 700).jobs) == 2
    cursor, first = lua.jobs("active", "0", 3, now=NOW + 800)
    assert [f["id"] for _, f in first] == ["a0", "a1", "a2"]
    lua.r.delete(f"{lua.B}:lease:cB")  # cB's leases gone (as its sweep leaves them)
    lua.r.zrem(f"{lua.B}:expiry", "cB")
    cursor, rest = lua.jobs("active", cursor, 3, now=NOW + 900)
    assert [f["id"] for _, f in rest] == ["c0", "c1"] and cursor == "0"


def test_active_cursor_of_a_long_client_id(lua: Lua, q: Queue) -> None:
    """The cursor of an active page holds its client's id (up to 256 characters): the API
    takes back every cursor it gave."""
    holders = ["h" * 250, "i" * 250]
    for n, holder in enumerate(holders):
        q.dispatch("x", id=f"j{n}")
        assert len(lua.dequeue(holder, limit=1, now=int(time.time() * 1000)).jobs) == 1
    page, cursor = q.jobs("active", limit=1)
    assert [j.id for j in page] == ["j0"] and cursor == "i" * 250 + ".0"
    page, cursor = q.jobs("active", cursor=cursor, limit=1)
    assert [j.id for j in page] == ["j1"] and cursor == "0"


@pytest.mark.parametrize(
    "args, what",
    [
        (["running", "0", 10, 0], "state must be"),
        (["waiting", "x", 10, 0], "cursor"),
        (["active", "1.x", 10, 0], "cursor of active jobs"),
        (["waiting", "0", 0, 0], "limit must be 1..1000"),
        (["waiting", "0", 1001, 0], "limit"),
        (["waiting", "0", 10, 2], "with data"),
    ],
)
def test_jobs_refuses_bad_arguments(lua: Lua, args: list, what: str) -> None:
    with pytest.raises(redis.ResponseError, match=what):
        lua.call("queasy_jobs", [lua.B], NOW, *args)


def test_requeue_puts_failed_jobs_back_with_their_data_and_counts_zero(lua: Lua) -> None:
    for n, id in enumerate(["f1", "f2", "f3"]):
        job = lua.take(id, now=NOW + n)
        lua.retry("c1", job, NOW + n)  # retry_count 1
        assert lua.fail("c1", lua.dequeue("c1", now=NOW + n).jobs[0], now=NOW + n) == Ack.OK
    lua.take("f3", now=NOW + 10)  # an active job with the id: the requeued one waits behind it
    lua.add("f1", '"new"', now=NOW + 10)  # a waiting job with the id is kept as it is
    assert lua.requeue("f2", "nope", now=NOW + 10) == [1, NOW + 10, 2]  # "nope": no record
    assert lua.get_job("f2", now=NOW + 10) == {
        "state": "waiting",
        "id": "f2",
        "data": '"x"',
        "run_at": NOW + 10,
        "retry_count": 0,
        "stall_count": 0,
        "timeout_count": 0,
    }
    # without ids: those that failed by the cutoff (f1 and f3 here), a page at a time
    assert lua.requeue(now=NOW + 12, cutoff=NOW + 12, limit=1) == [1, NOW + 12, 1]
    assert lua.requeue(now=NOW + 12, cutoff=NOW + 12) == [1, NOW + 12, 1]
    assert ended(lua, "failed") == [] and lua.r.keys(f"{lua.B}:ended:*") == []
    assert lua.get_job("f1", now=NOW + 12)["data"] == '"new"'
    assert lua.counts(now=NOW + 12) == {"waiting": 2, "delayed": 0, "blocked": 1, "active": 1}


def test_requeue_without_ids_leaves_jobs_that_failed_after_the_cutoff(lua: Lua) -> None:
    assert lua.fail("c1", lua.take("early"), now=NOW) == Ack.OK
    assert lua.fail("c1", lua.take("late", now=NOW + 5), now=NOW + 5) == Ack.OK
    assert lua.requeue(now=NOW + 6, cutoff=NOW + 1) == [1, NOW + 1, 1]
    assert ended(lua, "failed") == ["late"]


@pytest.mark.parametrize(
    "state", ["waiting", "delayed", "blocked", "finished", "failed", "cancelled"]
)
def test_purge_removes_a_state_a_page_at_a_time_and_never_an_active_job(
    lua: Lua, state: str
) -> None:
    for n in range(3):
        lua.take(f"b{n}")
        lua.add(f"b{n}", '"blocked"')
        lua.take(f"e{n}", client="c2")
    finish_all(lua, ["f0", "f1", "f2"])
    for n in range(3):
        assert lua.fail("c1", lua.take(f"x{n}")) == Ack.OK
        lua.add(f"c{n}", run_at=NOW + 9)
        lua.cancel(f"c{n}")
    lua.dispatch(*[(f"w{n}", '"x"', NOW) for n in range(3)])
    lua.dispatch(*[(f"d{n}", '"x"', NOW + 9) for n in range(3)])
    before = lua.counts_all()
    assert lua.purge(state, limit=2) == [2, 1]
    assert lua.purge(state, limit=2) == [1, 0]
    assert lua.purge(state, limit=2) == [0, 0]
    after = lua.counts_all()
    if state in ("waiting", "delayed", "blocked"):
        assert after[state] == 0 and after["active"] == before["active"] == 6
    else:
        kept = [k for k in lua.r.keys(f"{lua.B}:ended:*") if lua.r.hget(k, "state") == state]
        assert ended(lua, state) == [] and kept == []
    with pytest.raises(redis.ResponseError, match="state must be"):
        lua.purge("active")
    assert lua.counts()["active"] == 6


# ---------------------------------------------------------------- the producer API


def test_the_api_tells_each_state_apart_and_unknown_is_none(q: Queue, lua: Lua) -> None:
    job = lua.take("act", now=int(time.time() * 1000))
    lua.add("act", '"blocked"')
    assert lua.finish("c1", lua.take("f"), pid="77", result='{"ok": true}') == Ack.OK
    assert lua.fail("c1", lua.take("x"), traceback=TRACE) == Ack.OK
    q.dispatch({"n": 1}, id="w")
    q.dispatch({"n": 2}, id="d", delay=3600)
    q.dispatch({"n": 3}, id="c", delay=3600)
    q.cancel("c")
    states = {i: q.get_job(i).state for i in ("w", "d", "c", "act", "f", "x")}  # type: ignore[union-attr]
    assert states == {
        "w": "waiting",
        "d": "delayed",
        "c": "cancelled",
        "act": "active",
        "f": "finished",
        "x": "failed",
    }
    assert q.get_job("never") is None
    done = q.get_job("f")
    assert isinstance(done, JobInfo) and done.result == {"ok": True} and done.worker_pid == 77
    assert (done.client, done.host, done.attempts) == ("c1", HOST, 1)
    assert done.ended_at == NOW / 1000 and done.started_at == (NOW - 5) / 1000
    failed = q.get_job("x")
    assert failed.last_error == {  # type: ignore[union-attr]
        "name": "KeyError",
        "kind": "permanent",
        "message": "no such key",
        "traceback": TRACE,
        "at": NOW / 1000,
    }
    waiting = q.get_job("w")
    assert waiting.enqueued_at is not None and abs(waiting.enqueued_at - time.time()) < 60  # type: ignore[union-attr]
    assert waiting.last_error is None and waiting.attempts == 0  # type: ignore[union-attr]
    assert q.get_job("act").started_at == job.run_at / 1000  # type: ignore[union-attr]


def test_the_api_lists_requeues_purges_and_counts(q: Queue, lua: Lua) -> None:
    q.dispatch_many([{"data": n, "id": f"j{n}"} for n in range(5)])
    jobs, cursor = q.jobs("waiting", limit=3, with_data=True)
    assert [j.id for j in jobs] == ["j0", "j1", "j2"] and [j.data for j in jobs] == [0, 1, 2]
    more, cursor = q.jobs("waiting", cursor=cursor, limit=3)
    assert [j.id for j in more] == ["j3", "j4"] and cursor == "0" and more[0].data is None
    for _ in range(3):
        now = int(time.time() * 1000)
        checkout = lua.dequeue("c1", limit=1, now=now)
        assert lua.fail("c1", checkout.jobs[0], now=now) == Ack.OK
    assert q.counts()["failed"] == 3
    assert [j.id for j in q.jobs("failed")[0]] == ["j2", "j1", "j0"]
    assert q.requeue_failed(["j0"]) == 1
    assert q.requeue_failed() == 2
    assert q.jobs("failed") == ([], "0")
    assert live(q.counts()) == {"waiting": 5, "delayed": 0, "blocked": 0, "active": 0}
    assert q.purge("all") == 5
    assert q.counts() == dict.fromkeys(COUNTS[:4], 0) | {
        "failed": 3,  # totals since a reset: the purge wrote no outcome
        "failed_last_minute": 3,
        "failed_last_hour": 3,
    } | dict.fromkeys(["finished", "finished_last_minute", "finished_last_hour"], 0)
    q.reset_totals()
    assert set(q.counts().values()) == {0}
    with pytest.raises(InvalidInput, match="never active"):
        q.purge("active")
    with pytest.raises(InvalidInput, match="state must be one of"):
        q.jobs("running")
    with pytest.raises(InvalidInput, match="limit must be an int 1..1000"):
        q.jobs("waiting", limit=0)
    with pytest.raises(InvalidInput, match="not a str"):
        q.requeue_failed("j0")  # type: ignore[arg-type]


def test_the_api_reads_the_events_and_the_queues(
    q: Queue, lua: Lua, redis_url: str, prefix: str
) -> None:
    q.dispatch({}, id="a")
    assert (
        lua.retry(
            "c1", lua.dequeue("c1", now=int(time.time() * 1000)).jobs[0], NOW, traceback=TRACE
        )
        == Ack.OK
    )
    q.cancel("a")
    first, second = q.events()
    assert (first["outcome"], first["traceback"], first["pid"], first["started_at"]) == (
        "retried",
        TRACE,
        42,
        NOW - 5,
    )
    assert second["outcome"] == "cancelled" and second["started_at"] is None
    assert first["enqueued_at"] is not None and second["enqueued_at"] == first["enqueued_at"]
    assert q.events(after=first["event_id"]) == [second]
    assert q.events(after=second["event_id"]) == []
    with Client(redis_url, workers=0, prefix=prefix) as other:
        other.queue("elsewhere").dispatch_many([{"data": 1}])
        assert other.queues() == ["elsewhere", "q"]


def test_a_queasy_run_config_takes_the_retention_and_results_keys() -> None:
    raw = tomllib.loads(
        '[queues.q]\nhandler = "x.y"\nstore_results = true\n'
        "keep_finished = { count = 10 }\nkeep_failed = { seconds = 60.0, count = 5 }\n"
    )
    handler, options = config.parse(raw, "test.toml").queues["q"]
    spec = ListenOptions.build("q", handler, options, check=False)
    assert spec.store_results is True
    assert (spec.keep_finished, spec.keep_failed) == ((10, 3600.0), (5, 60.0))
    with pytest.raises(ConfigError, match=r"queues.q: keep_failed has unknown key\(s\) \['age'\]"):
        config.parse(tomllib.loads('[queues.q]\nhandler = "x.y"\nkeep_failed = {age = 1}\n'), "t")


def test_the_stream_reader_follows_new_events(q: Queue, lua: Lua) -> None:
    """store.events.follow (what `queasy events --follow` reads with): waits for the next
    event, and gives those after a given event id."""
    got: list = []
    reader = threading.Thread(  # after "0" of an empty stream: whenever it starts, it waits
        target=lambda: got.extend(events.follow(q.client.redis, q.keys.events, "0", block=10.0))
    )
    reader.start()
    q.dispatch({}, id="a")
    q.cancel("a")
    reader.join(timeout=15)
    assert [e["outcome"] for e in got] == ["cancelled"] and got[0]["id"] == "a"
    assert events.follow(q.client.redis, q.keys.events, "0", block=0.1) == got
    assert events.follow(q.client.redis, q.keys.events, got[0]["event_id"], block=0.1) == []


def test_the_api_refuses_a_cursor_it_did_not_make_as_invalid_input(q: Queue) -> None:
    q.dispatch("x", id="a")
    with pytest.raises(InvalidInput, match="cursor"):
        q.jobs("active", cursor="not-a-cursor")


def test_events_after_the_largest_event_id_is_an_empty_page(q: Queue) -> None:
    """The largest stream id ('2**64-1' - '2**64-1') passes the after check, but the exclusive
    XRANGE start after it is refused by the server: events() raised a raw redis ResponseError
    ('invalid start ID for the interval') instead of answering the page after it: none.
    The async twin reads with the same range."""
    import asyncio

    from queasy_py.aio import AsyncClient

    last = f"{2**64 - 1}-{2**64 - 1}"
    q.dispatch({}, id="a")
    q.cancel("a")  # one event in the stream
    assert q.events(after=last) == [] and len(q.events()) == 1

    async def read() -> list:
        async with AsyncClient(q.client.url, prefix=q.client.prefix) as client:
            return await client.queue(q.name).events(after=last)

    assert asyncio.run(read()) == []


@pytest.mark.parametrize("flavor", ["sync", "async"])
def test_requeue_of_every_failed_job_skips_an_occurrence_that_fails_as_it_starts(
    lua: Lua, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, flavor: str
) -> None:
    """requeue_failed() without ids looked for a failed occurrence of the schedule (ZSCORE),
    found none, and took the library's walk, which requeues every failed record: an
    occurrence that failed between that look and the walk's first FCALL was requeued (the
    periodic job once more). Forced here: the occurrence (a real one, active) fails for real
    just before the first queasy_requeue is sent. It stays failed; x alone is requeued."""
    from queasy_py.aio import AsyncClient, AsyncQueue

    assert lua.fail("c1", lua.take("x")) == Ack.OK
    schedule(lua, None, NOW + 1, spec="every 1s")
    occurrence = lua.dequeue("c1", limit=1, now=NOW + 1).jobs[0]
    assert occurrence.id == SCHEDULE_ID

    def fail_the_occurrence() -> None:
        if occurrence is not None:
            assert lua.fail("c1", occurrence, now=NOW + 2) == Ack.OK
            failing.clear()

    failing = [occurrence]
    if flavor == "sync":
        call = Queue._call

        def failing_call(self: Queue, name: str, args: list) -> object:
            if name == "queasy_requeue" and failing:
                fail_the_occurrence()
            return call(self, name, args)

        monkeypatch.setattr(Queue, "_call", failing_call)
        with Client(redis_url, workers=0, prefix=prefix) as client:
            requeued = client.queue("q").requeue_failed()
    else:
        fcall = AsyncQueue._fcall

        async def failing_fcall(self: AsyncQueue, name: str, args: list) -> object:
            if name == "queasy_requeue" and failing:
                fail_the_occurrence()
            return await fcall(self, name, args)

        async def run() -> int:
            async with AsyncClient(redis_url, prefix=prefix) as client:
                return await client.queue("q").requeue_failed()

        monkeypatch.setattr(AsyncQueue, "_fcall", failing_fcall)
        requeued = asyncio.run(run())
    assert not failing, "the occurrence did not fail during the requeue"
    assert requeued == 1
    assert ended(lua, "failed") == [SCHEDULE_ID]
    assert lua.get_job(SCHEDULE_ID)["state"] == "failed"
