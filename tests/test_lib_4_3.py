"""The defects library 4.3.0 fixes, through raw FCALL and the public API against a real server:
purge's count of an id kept in two end indexes, the id of a schedule's occurrence reserved
while the queue has a schedule, and a trace written around the library capped on dequeue."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from lua_calls import NOW, SCHEDULE_ID, Lua, schedule

from queasy_py import Client, InvalidInput, Queue
from queasy_py.aio import AsyncClient
from queasy_py.store.library import Ack, Dispatched, ensure_loaded

RESERVED = f"id '{SCHEDULE_ID}' is reserved"


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


@pytest.fixture
def q(redis_url: str, prefix: str) -> Iterator[Queue]:
    with Client(redis_url, workers=0, prefix=prefix) as client:
        yield client.queue("q")


def finished_then_failed(lua: Lua, id: str) -> None:
    """Job `id` finishes, then a job of the same id fails: its id is in both end indexes."""
    assert lua.finish("c1", lua.take(id)) == Ack.OK
    assert lua.fail("c1", lua.take(id, now=NOW + 1), now=NOW + 1) == Ack.OK
    assert lua.r.zrange(f"{lua.B}:finished", 0, -1) == [id]
    assert lua.r.zrange(f"{lua.B}:failed", 0, -1) == [id]


# ---------------------------------------------------------------- purge counts what went


def test_purge_all_counts_an_id_in_two_end_indexes_once(lua: Lua, q: Queue) -> None:
    finished_then_failed(lua, "a")
    assert lua.finish("c1", lua.take("b")) == Ack.OK
    assert q.purge("all") == 2  # a's failed record and b's end: 2 went (3 before 4.3.0)
    assert lua.r.keys(f"{lua.B}:ended:*") == [] and lua.r.hlen(f"{lua.B}:ends") == 0


def test_purge_with_counted_replies_the_records_dropped_and_without_as_before(lua: Lua) -> None:
    finished_then_failed(lua, "a")
    lua.add("w")
    assert lua.call("queasy_purge", [lua.B], NOW, "finished", 100, "1") == [1, 0, 0]
    assert lua.call("queasy_purge", [lua.B], NOW, "failed", 100, "1") == [1, 0, 1]
    assert lua.call("queasy_purge", [lua.B], NOW, "waiting", 100, "1") == [1, 0, 1]
    finished_then_failed(lua, "c")
    assert lua.purge("finished") == [1, 0]  # a 4.2 client's call: the reply it knows
    with pytest.raises(redis.ResponseError, match="INVALID counted must be '1' or '0'"):
        lua.call("queasy_purge", [lua.B], NOW, "failed", 100, "yes")
    assert lua.record("c")["state"] == "failed"  # refused: nothing went


# ---------------------------------------------------------------- the schedule's id


def test_a_producer_cannot_dispatch_the_occurrence_id_into_a_scheduled_queue(lua: Lua) -> None:
    occurrence = NOW + 3_600_000
    assert schedule(lua, None, occurrence).code == 2
    before = lua.r.hget(f"{lua.B}:rec", SCHEDULE_ID)
    for call in (
        lambda: lua.dispatch(("x", '"1"', ""), (SCHEDULE_ID, '{"fire_at": 1}', "")),
        lambda: lua.dispatch_once(("y", '"1"', ""), (SCHEDULE_ID, "1", ""), window=1000),
    ):
        with pytest.raises(redis.ResponseError, match=f"INVALID job 2 {RESERVED}"):
            call()
    # nothing written for the whole call: x and y are not there, the occurrence unmoved
    assert lua.get_job("x") is None and lua.get_job("y") is None
    assert lua.r.hget(f"{lua.B}:rec", SCHEDULE_ID) == before
    assert lua.r.zscore(f"{lua.B}:waiting", SCHEDULE_ID) == occurrence
    # the library's own occurrence writes go on: the pending one moves
    assert schedule(lua, occurrence, occurrence + 1, retime_at=NOW + 60_000).code == 3


def test_the_occurrence_id_is_a_plain_id_in_a_queue_without_a_schedule(lua: Lua) -> None:
    assert lua.dispatch((SCHEDULE_ID, '"mine"', "")) == [Dispatched.CREATED]
    assert lua.get_job(SCHEDULE_ID)["data"] == '"mine"'


def test_the_api_refuses_the_occurrence_id_before_any_chunk_is_sent(
    lua: Lua, q: Queue, redis_url: str, prefix: str
) -> None:
    assert schedule(lua, None, NOW + 3_600_000).code == 2
    jobs = [{"data": n, "id": f"j{n}"} for n in range(2500)]
    jobs[2100]["id"] = SCHEDULE_ID  # in the fifth chunk of 500
    for send in (q.dispatch_many, q.dispatch_batch):
        with pytest.raises(InvalidInput, match=RESERVED):
            send(jobs)
        assert sum(lua.counts().values()) == 1  # the occurrence only: no chunk was written
    with pytest.raises(InvalidInput, match=RESERVED):
        q.dispatch({"fire_at": 1}, id=SCHEDULE_ID)

    async def from_asyncio() -> None:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            aq = client.queue("q")
            for send in (aq.dispatch_many, aq.dispatch_batch):
                with pytest.raises(InvalidInput, match=RESERVED):
                    await send(jobs)

    asyncio.run(from_asyncio())
    assert sum(lua.counts().values()) == 1


# ---------------------------------------------------------------- a trace around the library


def test_a_trace_written_around_the_library_is_dropped_on_dequeue(lua: Lua) -> None:
    traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    lua.add("ok", trace=traceparent)
    lua.add("long")
    nums, _, data = lua.r.hget(f"{lua.B}:rec", "long").split("\t", 2)
    lua.r.hset(f"{lua.B}:rec", "long", f"{nums}\t{'0' * 10_000}\t{data}")  # a raw HSET: no check
    jobs = {job.id: job for job in lua.dequeue(limit=2).jobs}
    assert jobs["ok"].trace == traceparent
    assert jobs["long"].trace == ""  # as a push of it is read: longer than MAX_TRACE, none


# ---------------------------------------------------------------- a dead letter's dispatch


def letter(lua: Lua, id: str, data: str = '{"n": 1}', failed_at: object = NOW) -> int:
    return lua.call("queasy_dispatch_letter", [lua.B], NOW + 10, "", id, data, failed_at)


def test_a_letter_is_dispatched_when_nothing_or_its_own_failure_is_kept(lua: Lua) -> None:
    assert letter(lua, "gone") == Dispatched.CREATED  # no end kept (purged, keep_failed 0)
    assert lua.fail("c1", lua.take("x")) == Ack.OK  # its run at NOW failed, record kept
    assert letter(lua, "x", failed_at=NOW) == Dispatched.CREATED
    assert lua.fail("c1", lua.take("y")) == Ack.OK
    assert letter(lua, "y", failed_at="") == Dispatched.CREATED  # a letter without its run_at
    assert sorted(lua.r.zrange(f"{lua.B}:waiting", 0, -1)) == ["gone", "x", "y"]
    assert lua.r.hget(f"{lua.B}:rec", "x").split("\t", 2)[2] == '{"n": 1}'


def test_a_letter_of_a_job_that_is_live_or_ran_again_is_skipped_and_writes_nothing(
    lua: Lua,
) -> None:
    lua.take("active")
    assert lua.finish("c1", lua.take("finished")) == Ack.OK
    assert lua.fail("c1", lua.take("later", now=NOW + 5), now=NOW + 5) == Ack.OK
    assert lua.add("waiting", data='"theirs"') == Dispatched.CREATED
    before = {k: lua.r.type(k) for k in lua.r.keys(f"{lua.B}*")}
    waiting = lua.r.hget(f"{lua.B}:rec", "waiting")
    for id in ("waiting", "active", "finished"):
        assert letter(lua, id) == Dispatched.SKIPPED, id
    assert letter(lua, "later", failed_at=NOW) == Dispatched.SKIPPED  # a later run failed
    assert {k: lua.r.type(k) for k in lua.r.keys(f"{lua.B}*")} == before
    assert lua.r.hget(f"{lua.B}:rec", "waiting") == waiting
    assert not lua.r.exists(f"{lua.B}:blocked")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("bad id", '"d"', NOW), "id"),
        (("x", "{not json", NOW), "data is not JSON"),
        (("x", '"d"', "-5"), "run_at of the failure"),
        (("x", '"d"', "1.5"), "run_at of the failure"),
        ((SCHEDULE_ID, '"d"', NOW), RESERVED),
        (("x", '"d"'), "takes 5 arguments"),
    ],
)
def test_a_letter_the_library_refuses_writes_nothing(
    lua: Lua, args: tuple[object, ...], says: str
) -> None:
    schedule(lua, None, NOW + 60_000)
    before = sorted(lua.r.keys(f"{lua.B}*"))
    with pytest.raises(redis.ResponseError, match=says):
        lua.call("queasy_dispatch_letter", [lua.B], NOW, "", *args)
    assert sorted(lua.r.keys(f"{lua.B}*")) == before
