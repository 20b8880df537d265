"""Library 4.0.0 over the stored state of 3.0.0: nothing is lost (issue 14's layout change).

3.x kept an active job's lease in its record (client, token, leased_at, attempts counting the
lease) and its lease token alone in B:lease:<client>, and wrote each outcome event as 16
fields. 4.0.0 keeps the lease, "<token> <leased_at>", in B:lease:<client> only, the record as
it was while waiting, and an event as one line. These tests build the state with the real
3.0.0 library (tests/fixtures/queasy-3.0.0.lua, the file as released), load 4.0.0 over it
as a supervisor's handshake does, and carry every job on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import bundled_version, ensure_loaded
from tests.lua_calls import NOW, Lua

OLD = Path(__file__).parent / "fixtures" / "queasy-3.0.0.lua"


@pytest.fixture
def r(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.flushall()
    conn.function_load(OLD.read_text(), replace=True)
    assert conn.fcall("queasy_library", 0) == "queasy_py 3.0.0"
    try:
        yield conn
    finally:
        conn.close()


def upgrade(r: redis.Redis) -> None:
    ensure_loaded(r)  # what every client's handshake does: the older library is replaced
    assert bundled_version().startswith("4.")
    assert r.fcall("queasy_library", 0) == "queasy_py " + bundled_version()


def test_leases_taken_by_3_are_acked_read_and_swept_under_4(r: redis.Redis) -> None:
    lua = Lua(r, "up")
    lua.dispatch(*[(id, f'"{id}"', "") for id in "abcde"])
    a, b, c = lua.dequeue("c1", limit=3).jobs
    lua.add("a", '"blocked a"')  # blocked behind the active a
    (d,) = lua.dequeue("dead", limit=1, expiry=1_000).jobs
    assert lua.finish("c1", d, token="wrong") == 1  # (stale: nothing changes)
    assert r.hget(lua.B + ":active:b", "token") == b.token  # the layout of 3.x
    upgrade(r)

    # read: a lease of 3.x shows as before
    rec = lua.record("b")
    assert rec is not None and rec["state"] == "active"
    assert (rec["client"], rec["leased_at"], rec["attempts"]) == ("c1", str(NOW), "1")
    assert dict(zip(*[iter(lua.call("queasy_leases", [lua.B], NOW, "c1"))] * 2, strict=True)) == {
        "a": a.token, "b": b.token, "c": c.token,
    }  # fmt: skip
    # acked: finish promotes the blocked a; the end counts the lease of 3.x once
    assert lua.finish("c1", a, now=NOW + 10) == 0
    assert lua.record("a")["state"] == "waiting"
    assert r.hget(lua.B + ":ends", "a").split(" ")[4] == "1"
    # retried: back to waiting with the lease fields of 3.x gone, attempts 1
    assert lua.retry("c1", b, run_at=NOW + 20, now=NOW + 10) == 0
    assert not {"client", "token", "leased_at"} & set(r.hgetall(lua.B + ":job:b"))
    assert r.hget(lua.B + ":job:b", "attempts") == "1"
    # failed: its record is kept whole, with the lease's time and count
    assert lua.fail("c1", c, now=NOW + 10) == 0
    failed = lua.record("c")
    assert (failed["state"], failed["attempts"], failed["leased_at"]) == ("failed", "1", str(NOW))
    # swept: the dead client's job of 3.x goes back to waiting, stalled once
    checkout = lua.dequeue("c2", limit=10, now=NOW + 5_000)
    assert sorted(checkout.ids) == ["a", "b", "d", "e"]
    assert {job.id: job.stall_count for job in checkout.jobs}["d"] == 1
    # leased again under 4.0.0: attempts count both leases
    assert lua.record("b", now=NOW + 5_000)["attempts"] == "2"
    assert lua.record("d", now=NOW + 5_000)["attempts"] == "2"
    assert lua.record("e", now=NOW + 5_000)["attempts"] == "1"
    outcomes = [(e["id"], e["outcome"]) for e in lua.events()]
    assert outcomes == [("a", "finished"), ("b", "retried"), ("c", "failed"), ("d", "stalled")]


def test_events_of_3_stay_readable_after_the_upgrade(r: redis.Redis) -> None:
    lua = Lua(r, "up")
    lua.dispatch(("x", "1", ""), ("y", "2", ""))
    x, y = lua.dequeue("c1", limit=2).jobs
    assert lua.finish("c1", x, now=NOW + 1) == 0
    assert len(r.xrange(lua.B + ":events")[0][1]) == 16  # 3.x: 16 fields
    upgrade(r)
    assert lua.finish("c1", y, now=NOW + 2) == 0
    old, new = lua.events()
    assert set(old) == set(new) and (old["id"], new["id"]) == ("x", "y")
    assert (old["outcome"], old["client"], new["outcome"], new["client"]) == (
        "finished", "c1", "finished", "c1",
    )  # fmt: skip
