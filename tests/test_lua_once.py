"""queasy_dispatch_once alone, through raw FCALL: the dispatch of a batch that may be sent
again (a retried Spark task, a re-run job) never runs an id a second time within its window.

Time is explicit (lua_calls.NOW), so the window is crossed by passing a later `now`.

Library 4.1.0 keeps the window of a job ready now as a field of a bucket hash per window size
and end time (B:window:<size>:<k>, listed in B:windows), and only a later window (a delayed
job's) as a key of its own, B:once:<id>, as 4.0.0 kept every window.
"""

from __future__ import annotations

import pytest
import redis
from lua_calls import NOW, Lua, snapshot

from queasy_py.store.library import Ack, Dispatched, ensure_loaded

WINDOW = 60_000  # ms
SIZE = 65_536  # ms: WINDOW rounded up to a power of two, the size of its buckets


def bucket(lua: Lua, end: int, size: int = SIZE) -> str:
    """The key of the bucket that holds a window ending at `end` (lua/queasy.lua B:window)."""
    return f"{lua.B}:window:{size}:{end // size}"


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
    # the window ends WINDOW after the job's run_at (now for a job ready now): a ready job's
    # in its bucket, which expires when the last window it can hold ends; a delayed one's
    # in a key of its own
    end = NOW + WINDOW
    assert r.hgetall(bucket(lua, end)) == {"a": str(end)}
    bucket_end = (end // SIZE + 1) * SIZE
    assert r.zrange(lua.B + ":windows", 0, -1, withscores=True) == [
        (f"{SIZE}:{end // SIZE}", bucket_end)
    ]
    assert bucket_end - NOW - 1_000 < r.pttl(bucket(lua, end)) <= bucket_end - NOW
    assert r.get(lua.B + ":once:a") is None
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


def finish(lua: Lua, id: str, now: int = NOW) -> None:
    job = lua.dequeue("c1", limit=1, now=now).jobs[0]
    assert job.id == id and lua.finish("c1", job, now=now) == Ack.OK


def test_ready_jobs_write_no_key_per_id(lua: Lua, r: redis.Redis) -> None:
    """The point of 4.1.0's buckets: a batch of jobs ready now adds one hash field per id
    (one HSET per call), not a key with its own expiry per id."""
    codes = lua.dispatch_once(*[(f"u-{i}", "1", "") for i in range(300)], window=WINDOW)
    assert codes == [Dispatched.CREATED] * 300
    assert not list(r.scan_iter(match=lua.B + ":once:*"))
    assert r.hlen(bucket(lua, NOW + WINDOW)) == 300


def test_a_window_is_found_in_the_previous_bucket(lua: Lua) -> None:
    """A window ending in one bucket is still open when a later call writes into the next."""
    first_end = (NOW // SIZE + 1) * SIZE - 1  # the last ms of its bucket
    start = first_end - WINDOW
    assert once(lua, "a", now=start) == Dispatched.CREATED
    finish(lua, "a", now=start)
    later = first_end - 1  # this call's windows end in the next bucket
    assert (later + WINDOW) // SIZE == first_end // SIZE + 1
    assert once(lua, "b", now=later) == Dispatched.CREATED  # the next bucket, listed
    assert once(lua, "a", now=later) == Dispatched.SKIPPED
    assert once(lua, "a", now=first_end) == Dispatched.CREATED


def test_windows_of_other_sizes_are_honoured(lua: Lua) -> None:
    """A call with a shorter window still sees the longer window a former call gave an id
    (each window size has its buckets; B:windows lists them all)."""
    assert once(lua, "a") == Dispatched.CREATED
    finish(lua, "a")
    short = lua.dispatch_once(("a", '"x"', ""), window=1_000, now=NOW + 30_000)
    assert short == [Dispatched.SKIPPED]
    assert lua.dispatch_once(("b", '"x"', ""), window=1_000, now=NOW + 30_000) == [1]
    finish(lua, "b", now=NOW + 30_000)
    # and the longer window's call sees the shorter one's
    assert once(lua, "b", now=NOW + 30_999) == Dispatched.SKIPPED
    assert once(lua, "b", now=NOW + 31_000) == Dispatched.CREATED
    assert once(lua, "a", now=NOW + WINDOW) == Dispatched.CREATED


def test_ended_buckets_leave_the_index(lua: Lua, r: redis.Redis) -> None:
    assert once(lua, "a") == Dispatched.CREATED
    end = (NOW + WINDOW) // SIZE * SIZE + SIZE  # when the bucket of a's window ends
    assert r.zcard(lua.B + ":windows") == 1
    assert once(lua, "b", now=end) == Dispatched.CREATED
    # the first bucket is dropped from B:windows; b's is the one listed
    assert r.zrange(lua.B + ":windows", 0, -1) == [f"{SIZE}:{(end + WINDOW) // SIZE}"]


def test_an_id_sent_twice_in_one_batch_is_created_then_updated(lua: Lua) -> None:
    codes = lua.dispatch_once(("a", '"1"', ""), ("a", '"2"', ""), window=WINDOW)
    assert codes == [Dispatched.CREATED, Dispatched.UPDATED]
    assert lua.get_job("a")["data"] == '"2"'
    finish(lua, "a")
    assert once(lua, "a", now=NOW + WINDOW - 1) == Dispatched.SKIPPED


@pytest.mark.parametrize("id", ["a:b", "{q}x", "ü-ñ-✓", "a*?[]", "once:a", "x" * 256])
def test_ids_with_odd_characters_keep_their_window(lua: Lua, id: str) -> None:
    assert once(lua, id) == Dispatched.CREATED
    finish(lua, id)
    assert once(lua, id, now=NOW + 10) == Dispatched.SKIPPED
    assert once(lua, "a", now=NOW + 10) == Dispatched.CREATED  # another id is not blocked
    assert once(lua, id, now=NOW + WINDOW) == Dispatched.CREATED


def test_a_garbled_bucket_field_does_not_block_the_id(lua: Lua, r: redis.Redis) -> None:
    assert once(lua, "b") == Dispatched.CREATED  # the bucket, listed
    r.hset(bucket(lua, NOW + WINDOW), "a", "not a number")
    assert once(lua, "a") == Dispatched.CREATED


def test_a_delayed_window_outlasts_a_ready_dispatch_of_the_id(lua: Lua) -> None:
    """An id's window is open while any window written for it is: a delayed job's later
    window (B:once:<id>) is not shortened by an update that makes it ready now."""
    at = NOW + 3_600_000
    assert once(lua, "a", run_at=at) == Dispatched.CREATED
    assert once(lua, "a", now=NOW + 10) == Dispatched.UPDATED  # ready now: a bucket's window
    finish(lua, "a", now=NOW + 10)
    assert once(lua, "a", now=NOW + WINDOW + 10) == Dispatched.SKIPPED
    assert once(lua, "a", now=at + WINDOW) == Dispatched.CREATED


def test_a_closed_window_key_of_its_own_is_dropped(lua: Lua, r: redis.Redis) -> None:
    """A B:once:<id> that no longer holds an open window (garbled, or ended but not yet
    expired on the server's clock) is deleted when the id is dispatched again."""
    r.set(lua.B + ":once:a", "not a number")
    r.set(lua.B + ":once:b", str(NOW - 1))
    assert lua.dispatch_once(("a", "1", ""), ("b", "1", ""), window=WINDOW) == [1, 1]
    assert r.get(lua.B + ":once:a") is None and r.get(lua.B + ":once:b") is None
