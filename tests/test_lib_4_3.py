"""The defects library 4.3.0 fixes, through raw FCALL and the public API against a real server:
purge's count of an id kept in two end indexes, the id of a schedule's occurrence reserved
while the queue has a schedule, and a trace written around the library capped on dequeue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from lua_calls import NOW, Lua

from queasy_py import Client, Queue
from queasy_py.store.library import Ack, ensure_loaded


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
