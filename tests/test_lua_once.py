"""queasy_dispatch_once alone, through raw FCALL: the dispatch of a batch that may be sent
again (a retried Spark task, a re-run job) never runs an id a second time within its window.

Time is explicit (lua_calls.NOW), so the window is crossed by passing a later `now`.
"""

from __future__ import annotations

import pytest
import redis
from lua_calls import NOW, Lua, snapshot

from queasy_py.store.library import Ack, Dispatched, ensure_loaded

WINDOW = 60_000  # ms


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


def once(lua: Lua, id: str, data: str = '"x"', now: int = NOW, run_at: object = "") -> int:
    return lua.dispatch_once((id, data, run_at), window=WINDOW, now=now)[0]


def test_new_ids_are_created_and_marked_until_the_window_ends(lua: Lua, r: redis.Redis) -> None:
    codes = lua.dispatch_once(("a", '"1"', ""), ("b", '"2"', NOW + 5_000), window=WINDOW)
    assert codes == [Dispatched.CREATED, Dispatched.CREATED]
    assert lua.counts() == {"waiting": 1, "delayed": 1, "blocked": 0, "active": 0}
    # the window ends WINDOW after the job's run_at (now for a job ready now)
    assert r.get(lua.B + ":once:a") == str(NOW + WINDOW)
    assert r.get(lua.B + ":once:b") == str(NOW + 5_000 + WINDOW)
    assert 0 < r.pttl(lua.B + ":once:b") <= 5_000 + WINDOW


def test_a_waiting_job_sent_again_is_updated_not_doubled(lua: Lua) -> None:
    assert once(lua, "a", '"old"') == Dispatched.CREATED
    assert once(lua, "a", '"new"', now=NOW + 10) == Dispatched.UPDATED
    assert lua.counts(now=NOW + 10)["waiting"] == 1
    assert lua.get_job("a", NOW + 10)["data"] == '"new"'


def test_an_active_id_is_skipped_without_a_blocked_copy(lua: Lua, r: redis.Redis, prefix: str):
    assert once(lua, "a") == Dispatched.CREATED
    lua.dequeue("c1", limit=1)
    before = snapshot(r, prefix)
    assert once(lua, "a", '"again"', now=NOW + 10) == Dispatched.SKIPPED
    assert snapshot(r, prefix) == before, "a skipped job writes nothing"
    # the plain dispatch of the same id would create a blocked job: a second run
    assert lua.add("a", run_at=NOW) == Dispatched.BLOCKED


@pytest.mark.parametrize("end", ["finish", "fail", "cancel"])
def test_an_ended_id_is_skipped_within_its_window_and_created_after(lua: Lua, end: str) -> None:
    assert once(lua, "a") == Dispatched.CREATED
    if end == "cancel":
        assert lua.cancel("a") == 1
    else:
        job = lua.dequeue("c1", limit=1).jobs[0]
        ended = lua.finish("c1", job) if end == "finish" else lua.fail("c1", job)
        assert ended == Ack.OK
    assert once(lua, "a", now=NOW + WINDOW - 1) == Dispatched.SKIPPED
    assert lua.counts(now=NOW + WINDOW) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert once(lua, "a", now=NOW + WINDOW) == Dispatched.CREATED


def test_the_window_of_a_delayed_job_counts_from_its_run_at(lua: Lua) -> None:
    at = NOW + 3_600_000
    assert once(lua, "a", run_at=at) == Dispatched.CREATED
    job = lua.dequeue("c1", limit=1, now=at).jobs[0]
    assert lua.finish("c1", job, now=at + 100) == Ack.OK
    assert once(lua, "a", now=at + WINDOW - 1, run_at=at) == Dispatched.SKIPPED
    assert once(lua, "a", now=at + WINDOW, run_at=at) == Dispatched.CREATED


def test_a_retried_job_sent_again_is_updated(lua: Lua) -> None:
    """Retried: waiting again with its record, so it is updated (it has not run for good)."""
    assert once(lua, "a", '"v1"') == Dispatched.CREATED
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.retry("c1", job, NOW + 1_000) == Ack.OK
    assert once(lua, "a", '"v2"', now=NOW + 10, run_at=NOW + 1_000) == Dispatched.UPDATED
    assert lua.get_job("a", NOW + 10)["data"] == '"v2"'


def test_a_garbled_mark_does_not_block_the_id(lua: Lua, r: redis.Redis) -> None:
    r.set(lua.B + ":once:a", "not a number")
    assert once(lua, "a") == Dispatched.CREATED


@pytest.mark.parametrize("window", ["0", "-1", "1.5", "1e3", "", "1000000000000"])
def test_a_bad_window_is_refused_and_nothing_written(
    lua: Lua, r: redis.Redis, prefix: str, window: str
) -> None:
    before = snapshot(r, prefix)
    with pytest.raises(redis.ResponseError, match="INVALID window ms"):
        lua.dispatch_once(("a", '"x"', ""), window=window)
    assert snapshot(r, prefix) == before


def test_a_bad_job_refuses_the_whole_batch(lua: Lua, r: redis.Redis, prefix: str) -> None:
    before = snapshot(r, prefix)
    with pytest.raises(redis.ResponseError, match="INVALID job 2 data is not JSON"):
        lua.dispatch_once(("a", '"x"', ""), ("b", "{", ""), window=WINDOW)
    assert snapshot(r, prefix) == before
