"""tests/records.py, the tests' one reader and writer of a living job's stored state: on the
4.x layout through the library loaded here, and on the 5.0 layout (lua/queasy.lua's key
table of library 5.0) as its strings are written, so the module reads both the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import records
import redis
from lua_calls import NOW, Lua, snapshot

from queasy_py.store.embedded import EmbeddedServer

#: the last 4.x library (tests/fixtures): the layout of the 4.x records this module still reads
V44 = Path(__file__).parent / "fixtures" / "queasy-4.4.0.lua"

ERR = {"name": "ValueError", "kind": "retry", "message": "m", "traceback": "T", "at": "7"}


@pytest.fixture
def lua44(own_server: EmbeddedServer, prefix: str) -> Iterator[Lua]:
    """A queue on a server of this module's own with library 4.4.0 loaded (4.x records)."""
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.flushall()
    conn.function_load(V44.read_text(), replace=True)
    try:
        yield Lua(conn, prefix)
    finally:
        conn.close()


def v5(lua: Lua) -> None:
    """Queue B in the 5.0 layout, as the spec writes it: w waiting (retried once, with its last
    error), a active (leased before, with a trace) and x blocked behind it."""
    r, B = lua.r, lua.B
    r.set(B + ":layout", "5")
    r.zadd(B + ":waiting", {"w": NOW})
    r.hset(B + ":rec", "w", f"{NOW} {NOW} 1 0 0 1\t\t" + '"w\tdata"')
    r.hset(B + ":rec", "a", f"{NOW} - 0 0 0 2\t00-ab-01\t1")
    r.hset(B + ":err", "w", json.dumps(ERR))
    r.hset(B + ":blocked", "x", f"1 0 clamp - {NOW}\t{NOW} {NOW} 0 0 0 0\t\t2")


def test_a_4x_record_is_its_hash_wherever_it_lives(lua44: Lua) -> None:
    lua = lua44
    lua.add("w", '"w"', NOW + 1000)  # delayed
    job = lua.take("a")
    assert lua.retry("c1", job, run_at=NOW) == 0  # its last error in its record
    assert lua.dequeue("c1", limit=1).ids == ["a"]
    assert lua.add("a", '"again"') == 3  # blocked behind it
    r, B = lua.r, lua.B
    assert records.record(r, B, "a") == r.hgetall(B + ":active:a")
    assert records.record(r, B, "a")["error_name"] == "ValueError"
    assert records.record(r, B, "w") == r.hgetall(B + ":job:w")
    assert records.blocked_record(r, B, "a") == r.hgetall(B + ":job:a")
    assert records.blocked_record(r, B, "w") is None
    assert [records.is_active(r, B, id) for id in ("a", "w")] == [True, False]
    assert [records.has_record(r, B, id) for id in ("a", "w", "none")] == [1, 1, 0]
    assert records.record(r, B, "none") is None
    assert not records.is_v5(r, B)


def test_a_50_record_reads_as_4x_hash(lua: Lua) -> None:
    v5(lua)
    r, B = lua.r, lua.B
    assert records.is_v5(r, B)
    assert records.record(r, B, "w") == {
        "id": "w", "data": '"w\tdata"', "run_at": str(NOW), "enqueued_at": str(NOW),
        "retry_count": "1", "attempts": "1", "error_name": "ValueError", "error_kind": "retry",
        "error_message": "m", "traceback": "T", "error_at": "7",
    }  # fmt: skip
    assert records.record(r, B, "a") == {
        "id": "a", "data": "1", "run_at": str(NOW), "attempts": "2", "trace": "00-ab-01",
    }  # fmt: skip
    assert records.blocked_record(r, B, "x") == {
        "id": "x", "data": "2", "run_at": str(NOW), "enqueued_at": str(NOW), "u_data": "1",
        "u_reset": "0", "u_run_at": "clamp", "u_lo": "", "u_hi": str(NOW),
    }  # fmt: skip
    assert records.record(r, B, "x") is None and records.blocked_record(r, B, "w") is None
    assert [records.is_active(r, B, id) for id in ("w", "a", "x")] == [False, True, False]
    assert [records.has_record(r, B, id) for id in ("w", "a", "x", "y")] == [1, 1, 1, 0]
    view = records.living(snapshot(r, B), B)
    assert set(view.records) == {"w", "x"} and set(view.actives) == {"a"}
    assert view.blocked == {"x"}
    assert view.records["w"] == records.record(r, B, "w")
    assert view.records["x"] == records.blocked_record(r, B, "x")


def test_the_dump_view_of_4x_is_its_keys(lua: Lua) -> None:
    lua.take("a")
    lua.add("a", '"blocked"')
    lua.add("w")
    view = records.living(snapshot(lua.r, lua.B), lua.B)
    assert set(view.records) == {"a", "w"} and set(view.actives) == {"a"}
    assert view.blocked == {"a"} and "u_run_at" in view.records["a"]


@pytest.mark.parametrize("layout", ["4", "5"])
def test_garble_put_and_drop_write_around_the_library(
    request: pytest.FixtureRequest, layout: str
) -> None:
    lua: Lua = request.getfixturevalue("lua" if layout == "5" else "lua44")
    r, B = lua.r, lua.B
    if layout == "5":
        v5(lua)
    else:
        lua.add("w", '"w\tdata"')
    url = request.getfixturevalue("redis_url" if layout == "5" else "own_server")
    with redis.Redis.from_url(url if layout == "5" else url.url) as raw:  # bytes, as garbled
        records.garble(raw, B, "w", "run_at", "1e+12")
        records.garble(raw, B, "w", "stall_count", "x y")
        records.garble(raw, B, "w", "data", b"\xff")
        records.garble(raw, B, "w", "trace", "t\n")
        records.garble(raw, B, "w", "enqueued_at", None)
        records.garble(raw, B, "w", "error_name", "E")
        if layout == "5":
            assert raw.hget(B + ":rec", "w") == b"1e+12 - 1 x y 0 1\tt\n\t\xff"
            assert json.loads(r.hget(B + ":err", "w")) == ERR | {"name": "E"}
        else:
            assert raw.hgetall(B + ":job:w") == {
                b"id": b"w", b"data": b"\xff", b"run_at": b"1e+12", b"stall_count": b"x y",
                b"trace": b"t\n", b"error_name": b"E",
            }  # fmt: skip
    with pytest.raises(LookupError, match="'none' has no record"):
        records.garble(r, B, "none", "data", "1")
    records.drop(r, B, "w")
    assert not records.has_record(r, B, "w")
    fields = {"id": "p", "data": "3", "run_at": str(NOW), "enqueued_at": "5", "attempts": "2"}
    with r.pipeline(transaction=True) as pipe:
        records.put_record(r, B, "p", fields | {"error_at": "9"}, into=pipe)
        pipe.execute()
    assert records.record(r, B, "p") == fields | {"error_at": "9"}
    with pytest.raises(ValueError, match="no composed update"):
        records.put_record(r, B, "p", fields | {"u_data": "1"})
