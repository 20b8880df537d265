"""Library 4.1.0 over the dedup windows of 4.0.0: an id 4.0.0 dispatched with a window is not
dispatched again by 4.1.0 before that window ends.

4.0.0 kept every window of queasy_dispatch_once as a key of its own, B:once:<id> (the end, in
ms, expiring then); 4.1.0 keeps a ready job's window in a bucket hash and reads B:once:<id>
too, so the keys 4.0.0 wrote are honoured until they expire. The state is built with the real
4.0.0 library (tests/fixtures/queasy-4.0.0.lua, the file as released), then 4.1.0 is loaded
over it as a client's handshake does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import Ack, Dispatched, bundled_version, ensure_loaded
from tests.lua_calls import NOW, Lua

OLD = Path(__file__).parent / "fixtures" / "queasy-4.0.0.lua"
WINDOW = 60_000  # ms


@pytest.fixture
def r(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.flushall()
    conn.function_load(OLD.read_text(), replace=True)
    assert conn.fcall("queasy_library", 0) == "queasy_py 4.0.0"
    try:
        yield conn
    finally:
        conn.close()


def test_windows_written_by_4_0_are_honoured_by_4_1(r: redis.Redis) -> None:
    lua = Lua(r, "up")
    at = NOW + 5_000
    codes = lua.dispatch_once(("a", '"1"', ""), ("d", '"1"', at), window=WINDOW)
    assert codes == [Dispatched.CREATED, Dispatched.CREATED]
    job = lua.dequeue("c1", limit=1).jobs[0]
    assert lua.finish("c1", job) == Ack.OK
    assert r.get(lua.B + ":once:a") == str(NOW + WINDOW)  # 4.0.0's layout

    ensure_loaded(r)  # the handshake: 4.0.0 is replaced
    # 4.2+ keep 4.1.0's windows (5.0.0 too: its layout changes the records only)
    known = ("4.1.0", "4.2.0", "4.2.1", "4.3.0", "4.3.1", "4.4.0", "5.0.0", "5.1.0")
    assert bundled_version() in known
    assert r.fcall("queasy_library", 0) == "queasy_py " + bundled_version()

    # a ran under 4.0.0: skipped while its 4.0.0 window is open, among ids new to 4.1.0
    codes = lua.dispatch_once(("n", '"1"', ""), ("a", '"2"', ""), window=WINDOW, now=NOW + 10)
    assert codes == [Dispatched.CREATED, Dispatched.SKIPPED]
    # d, still delayed, is updated as before; it runs, and its window (from its run_at) holds
    assert lua.dispatch_once(("d", '"2"', at), window=WINDOW, now=NOW + 20) == [2]
    jobs = lua.dequeue("c1", limit=2, now=at).jobs
    assert sorted(job.id for job in jobs) == ["d", "n"]
    assert [lua.finish("c1", job, now=at) for job in jobs] == [Ack.OK, Ack.OK]
    assert lua.dispatch_once(("d", '"3"', ""), window=WINDOW, now=at + WINDOW - 1) == [5]
    # the 4.0.0 window of a ends: a is dispatched again, its window now in a bucket
    assert lua.dispatch_once(("a", '"3"', ""), window=WINDOW, now=NOW + WINDOW) == [1]
    assert r.get(lua.B + ":once:a") is None
    assert lua.dispatch_once(("a", '"4"', ""), window=WINDOW, now=NOW + WINDOW + 1) == [2]
