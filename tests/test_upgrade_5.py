"""Library 5.0.0 over the stored state of 4.4.0: every job carries on as 4.4.0 would have
carried it (layout5.md, "Upgrade").

4.4.0 kept each living record in a hash of its own (B:job:<id> while waiting, delayed or
blocked, renamed B:active:<id> while leased), the blocked ids in a set, a job's last error in
its record. 5.0.0 keeps every living record as one field of B:rec, the blocked ones in the
hash B:blocked, the last errors in B:err, and marks a queue in that layout with B:layout. The
state is built here with the real 4.4.0 library (tests/fixtures/queasy-4.4.0.lua, main's file
before 5.0), then 5.0.0 is loaded over it and the queue converted (queasy_upgrade, or the
first write calls): the readers must answer exactly as 4.4.0 answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import bundled_version, source
from tests.lua_calls import EXPIRY, NOW, Leased, Lua, schedule, schedule_info

FIXTURES = Path(__file__).parent / "fixtures"
OLD = "4.4.0"
BUDGET = 500  # lua/queasy.lua UPGRADE_BUDGET
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATES = ("waiting", "delayed", "blocked", "active", "finished", "failed", "cancelled")


def load(r: redis.Redis, version: str | None) -> None:
    """Load library `version` (a fixture) or, for None, the bundled one (5.0), replacing it."""
    text = source() if version is None else (FIXTURES / f"queasy-{version}.lua").read_text()
    r.function_load(text, replace=True)
    assert r.fcall("queasy_library", 0) == f"queasy_py {version or bundled_version()}"


@pytest.fixture
def r(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.flushall()
    load(conn, OLD)
    try:
        yield conn
    finally:
        conn.close()


def upgrade(lua: Lua, now: int = NOW) -> int:
    """queasy_upgrade until it says 0 left; returns how many calls it took."""
    for calls in range(1, 1000):
        if lua.call("queasy_upgrade", [lua.B], now) == 0:
            return calls
    raise AssertionError("queasy_upgrade never ended")


def build(lua: Lua) -> dict[str, Any]:
    """4.x state of every kind, made by 4.4.0's own functions; returns the leases taken."""
    r = lua.r
    a1 = lua.take("a1")  # active, a lease of 4.1.0
    b1 = lua.take("b1", client="c2")  # active, with a blocked job composed of two dispatches
    assert lua.dispatch(("b1", '"b1 again"', NOW + 5_000), update_data=False) == [3]
    assert lua.dispatch(
        ("b1", '"b1 third"', NOW + 2_000), run_at_mode="if_earlier", reset=True
    ) == [4]
    b2 = lua.take("b2")  # a blocked job with if_later bounds
    assert lua.dispatch(("b2", '"b2 again"', NOW + 7_000), run_at_mode="if_later") == [3]
    old = lua.take("old", client="c2")  # a lease of 4.0.0's form, written raw
    r.hset(lua.B + ":lease:c2", "old", f"{old.token} {NOW}")
    x1 = lua.take("x1")  # a retried job with its last error (waiting again, delayed)
    assert lua.retry("c1", x1, NOW + 30_000) == 0
    x2 = lua.take("x2")  # a retried job leased again: active, its last error kept
    assert lua.retry("c1", x2, NOW - 100) == 0
    (x2,) = lua.dequeue("c1", limit=1, now=NOW + 1).jobs
    assert x2.id == "x2"
    f1 = lua.take("f1")  # ends kept whole: a failure, a result
    assert lua.fail("c1", f1, with_fail_queue=False) == 0
    e1 = lua.take("e1")
    assert lua.finish("c1", e1, result='{"ok": true}') == 0
    n1 = lua.take("n1")  # an end not kept whole
    assert lua.finish("c1", n1) == 0
    lua.dispatch(("k1", '"cancel me"', NOW + 99_000))
    assert lua.cancel("k1") == 1
    assert schedule(lua, None, NOW + 3_000).code == 2  # the schedule's occurrence (delayed)
    lua.dispatch(("w1", '{"a": 1}', ""), ("w2", '"two"', NOW - 10))  # waiting
    lua.dispatch(("d1", '"later"', NOW + 60_000))  # delayed
    lua.dispatch(("tr", '"traced"', ""), trace=TRACE)  # with a trace
    lua.dispatch(("noenq", '"no enqueued_at"', ""))  # a record of 3.x/4.0.0's age
    r.hdel(lua.B + ":job:noenq", "enqueued_at")
    return {"a1": a1, "b1": b1, "b2": b2, "old": old, "x2": x2}


IDS = ("w1", "w2", "d1", "tr", "a1", "b1", "b2", "old", "x1", "x2", "f1", "e1", "n1", "k1")
IDS += ("schedule", "noenq", "nothing")


def readers(lua: Lua, now: int = NOW, ids: tuple[str, ...] = IDS) -> dict[str, Any]:
    """What every reader replies about the queue, with data (raw replies, in their order)."""
    out: dict[str, Any] = {}
    for id in ids:
        out["get_job " + id] = lua.call("queasy_get_job", [lua.B], now, id)
    for state in STATES:
        for with_data in ("0", "1"):
            out[f"jobs {state} {with_data}"] = pages(lua, now, state, with_data)
    out["counts"] = lua.call("queasy_counts", [lua.B], now)
    for client in ("c1", "c2", "c3"):
        out["leases " + client] = sorted(lua.call("queasy_leases", [lua.B], now, client))
    out["schedule_info"] = schedule_info(lua, now)
    return out


def pages(lua: Lua, now: int, state: str, with_data: str) -> list[list[Any]]:
    """Every page of queasy_jobs of `state` (100 jobs a page), following the cursors: each
    as [whether a page follows, its rows] (a cursor's form is its library's: 5.1.1 names
    the last job or client listed, 4.4.0 an offset)."""
    out, cursor = [], "0"
    while True:
        reply = lua.call("queasy_jobs", [lua.B], now, state, cursor, 100, with_data)
        cursor = reply[0]
        out.append([cursor != "0", *reply[1:]])
        if cursor == "0":
            return out


def as_dicts(replies: dict[str, Any]) -> dict[str, Any]:
    """`replies` with each job's fields as a dict (their order aside)."""

    def job(row: Any) -> Any:
        if isinstance(row, list) and len(row) == 2 and isinstance(row[1], list):
            return (row[0], dict(zip(row[1][0::2], row[1][1::2], strict=True)))
        return row

    out = {}
    for name, reply in replies.items():
        if name.startswith("get_job"):
            out[name] = job(reply)
        elif name.startswith("jobs"):
            out[name] = [[p[0], sorted((job(row) for row in p[1:]), key=repr)] for p in reply]
        else:
            out[name] = reply
    return out


def keys_of(r: redis.Redis, B: str) -> set[str]:
    return set(r.scan_iter(match=B.replace("{", "[{]").replace("}", "[}]") + ":*"))


def test_every_job_of_4_4_0_reads_the_same_after_the_upgrade(r: redis.Redis) -> None:
    lua = Lua(r, "up5")
    build(lua)
    before = readers(lua)
    assert before["get_job b1"][0] == "active" and before["get_job x1"][0] == "delayed"
    load(r, None)
    assert upgrade(lua) == 1
    after = readers(lua)
    assert as_dicts(after) == as_dicts(before)
    assert after == before  # the fields in 4.4.0's order too


def test_the_upgraded_keys_are_the_5_0_layout(r: redis.Redis) -> None:
    lua = Lua(r, "up5")
    leased = build(lua)
    old_keys = keys_of(r, lua.B)
    assert any(":job:" in key for key in old_keys) and any(":active:" in key for key in old_keys)
    load(r, None)
    upgrade(lua)
    B = lua.B
    keys = keys_of(r, B)
    assert not [key for key in keys if key.startswith((B + ":job:", B + ":active:"))]
    assert B + ":upgrade" not in keys
    assert r.get(B + ":layout") == "5"
    rec = r.hgetall(B + ":rec")
    living = {"w1", "w2", "d1", "tr", "a1", "b1", "b2", "old", "x1", "x2", "schedule", "noenq"}
    assert set(rec) == living
    assert rec["w1"] == f'{NOW} {NOW} 0 0 0 0\t\t{{"a": 1}}'
    assert rec["tr"] == f'{NOW} {NOW} 0 0 0 0\t{TRACE}\t"traced"'
    assert rec["noenq"] == f'{NOW} - 0 0 0 0\t\t"no enqueued_at"'
    # x1 was leased once and retried: its attempts count that lease; x2 is leased again
    assert rec["x1"] == f'{NOW + 30_000} {NOW} 1 0 0 1\t\t"x"'
    assert rec["x2"] == f'{NOW - 100} {NOW} 1 0 0 1\t\t"x"'
    assert r.type(B + ":blocked") == "hash"
    blocked = r.hgetall(B + ":blocked")
    # b1: data kept (the first dispatch did not update it, the second did: the union is
    # '1'), counts reset, run_at: replace then if_earlier composes to a constant
    assert blocked == {
        "b1": f'1 1 replace - -\t{NOW + 2_000} {NOW} 0 0 0 0\t\t"b1 third"',
        "b2": f'1 1 clamp {NOW + 7_000} -\t{NOW + 7_000} {NOW} 0 0 0 0\t\t"b2 again"',
    }
    errors = {id: json.loads(v) for id, v in r.hgetall(B + ":err").items()}
    assert set(errors) == {"x1", "x2"}
    assert errors["x1"] == {
        "name": "ValueError",
        "kind": "retriable",
        "message": "bad value",
        "traceback": "Traceback ...\nValueError: bad value\n",
        "at": str(NOW),
    }
    # the lease of 4.0.0 is in 4.1.0's form now; those of 4.1.0 are as they were
    old = leased["old"]
    assert r.hget(B + ":lease:c2", "old") == f"{old.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    a1 = leased["a1"]
    assert r.hget(B + ":lease:c1", "a1") == f"{a1.token} {NOW} {NOW} 0 0 0 1 {NOW}"
    # ends kept whole are as 4.4.0 wrote them
    assert r.hget(B + ":ended:f1", "error_name") == "KeyError"
    assert r.hget(B + ":ended:e1", "result") == '{"ok": true}'


def test_a_lease_of_3_x_form_is_rewritten_with_the_numbers_of_its_record(
    r: redis.Redis,
) -> None:
    """A record leased by library 3.x holds client, token and leased_at, and counts its
    lease in attempts; its lease is the token alone (tests/test_upgrade.py)."""
    lua = Lua(r, "up5")
    job = lua.take("l3")
    akey = lua.B + ":active:l3"
    r.hset(akey, mapping={"client": "c1", "token": job.token, "leased_at": NOW - 7, "attempts": 1})
    r.hset(lua.B + ":lease:c1", "l3", job.token)
    before = lua.call("queasy_get_job", [lua.B], NOW, "l3")
    load(r, None)
    upgrade(lua)
    assert r.hget(lua.B + ":lease:c1", "l3") == f"{job.token} {NOW} {NOW} 0 0 0 1 {NOW - 7}"
    assert r.hget(lua.B + ":rec", "l3") == f'{NOW} {NOW} 0 0 0 0\t\t"x"'
    after = lua.call("queasy_get_job", [lua.B], NOW, "l3")
    assert as_dicts({"get_job": after}) == as_dicts({"get_job": before})


def test_a_queue_larger_than_the_budget_converts_over_several_calls(r: redis.Redis) -> None:
    lua = Lua(r, "big")
    n = 3 * BUDGET + 200  # 1,300 waiting, 400 active: 4 steps (500, 500, 300 + 100, 300)
    for start in range(0, n, 1000):
        lua.dispatch(*[(f"j{i}", f'"{i}"', NOW + i) for i in range(start, min(n, start + 1000))])
    assert len(lua.dequeue("c1", limit=400, now=NOW + n).jobs) == 400  # active ones too
    before = readers(lua, NOW + n)
    snapshot_of_c2 = r.zscore(lua.B + ":expiry", "c2")
    load(r, None)
    B = lua.B

    # a read refuses while there is 4.x data to convert (it cannot write)
    with pytest.raises(redis.exceptions.TryAgainError, match="upgrading"):
        lua.call("queasy_get_job", [B], NOW, "j1")
    assert r.hlen(B + ":rec") == 0
    # a write call converts a step and is refused with nothing else done
    with pytest.raises(redis.exceptions.TryAgainError, match="500 records converted, more to go"):
        lua.dispatch(("new", '"new"', ""))
    assert r.hlen(B + ":rec") == BUDGET
    assert r.zscore(B + ":waiting", "new") is None
    assert not r.exists(B + ":job:new") and not r.hexists(B + ":rec", "new")
    assert not r.exists(B + ":layout")
    # so does one whose first read is guarded_exists (dequeue, finish)
    with pytest.raises(redis.exceptions.TryAgainError, match="500 records converted, more to go"):
        lua.dequeue("c2", limit=10, now=NOW + n)
    assert r.hlen(B + ":rec") == 2 * BUDGET
    assert r.zscore(B + ":expiry", "c2") == snapshot_of_c2 is None  # (no keep_alive ran)
    left = lua.call("queasy_upgrade", [B], NOW)  # the last 300 waiting, 200 of the leases
    assert left == 400  # (at most: c1's leases, those converted included)
    with pytest.raises(redis.exceptions.TryAgainError, match="upgrading"):
        lua.call("queasy_counts", [B], NOW)
    assert upgrade(lua) == 1
    assert r.get(B + ":layout") == "5"
    assert r.hlen(B + ":rec") == n
    assert not [k for k in keys_of(r, B) if k.startswith((B + ":job:", B + ":active:"))]
    assert readers(lua, NOW + n) == before
    assert lua.call("queasy_upgrade", [B], NOW) == 0  # marked: nothing to do


def test_many_leases_convert_over_several_calls(r: redis.Redis) -> None:
    lua = Lua(r, "leases")
    n = BUDGET + 100
    lua.dispatch(*[(f"j{i}", f'"{i}"', "") for i in range(n)])
    for client in ("c1", "c2"):
        lua.dequeue(client, limit=n // 2, now=NOW)
    before = readers(lua)
    load(r, None)
    calls = upgrade(lua)
    assert calls == 2
    assert readers(lua) == before


def test_a_fresh_queue_is_marked_by_its_first_write_call(r: redis.Redis) -> None:
    load(r, None)
    lua = Lua(r, "fresh")
    assert lua.call("queasy_get_job", [lua.B], NOW, "j") is None  # a read marks nothing
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}
    assert not r.exists(lua.B + ":layout")
    lua.bump("c1")
    assert r.get(lua.B + ":layout") == "5"


def test_a_refused_first_call_on_a_fresh_queue_writes_no_mark(r: redis.Redis) -> None:
    """INVALID or stale: nothing written, the mark of a fresh queue included (queasy_fail's
    fail queue too); the first call that writes a job marks its queue."""
    load(r, None)
    lua = Lua(r, "fresh")
    with pytest.raises(redis.ResponseError, match="^INVALID"):
        lua.dispatch(("bad id", '"x"', ""))
    with pytest.raises(redis.ResponseError, match="^INVALID"):
        lua.call("queasy_fail", [lua.B, lua.F], NOW, "c\n1", 10, 1, 1, "h", 0)
    assert keys_of(r, lua.B) == set() and keys_of(r, lua.F) == set()
    lua.call("queasy_fail", [lua.B, lua.F], NOW, "c1", 10, 1, 1, "h", 0)  # (no job: stale)
    assert keys_of(r, lua.B) == set() and keys_of(r, lua.F) == set()
    lua.add("j")
    assert r.get(lua.B + ":layout") == "5" and not r.exists(lua.F + ":layout")


def test_a_queue_with_ends_only_reads_without_an_upgrade(r: redis.Redis) -> None:
    lua = Lua(r, "ends")
    job = lua.take("e")
    assert lua.finish("c1", job, result='"r"') == 0
    lua.leave("c1")  # no client left: no B:expiry
    before = readers(lua)
    load(r, None)
    assert readers(lua) == before


def test_the_fail_queue_of_queasy_fail_is_upgraded_too(r: redis.Redis) -> None:
    lua = Lua(r, "fq")
    r.set(lua.B + ":layout", "5")  # B itself is upgraded
    lua.r.hset(lua.F + ":job:x", mapping={"id": "x", "data": '"x"', "run_at": NOW})
    lua.r.zadd(lua.F + ":waiting", {"x": NOW})
    load(r, None)
    lua.call("queasy_fail", [lua.B, lua.F], NOW, "c1", 10, 1, 1, "h", 0)  # (no job)
    assert r.get(lua.F + ":layout") == "5"
    assert r.hget(lua.F + ":rec", "x") == f'{NOW} - 0 0 0 0\t\t"x"'


def test_a_client_of_library_4_meeting_5_0_refuses(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queasy_py.errors import VersionMismatch
    from queasy_py.store import library

    load(r, None)
    monkeypatch.setattr(library, "bundled_version", lambda: OLD)
    with pytest.raises(VersionMismatch, match="newer major"):
        library.ensure_loaded(r)
    assert r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"


# ---------------------------------------------------------------- end to end (5.0 writes)


def write_path_is_5_0(r: redis.Redis) -> bool:
    """Whether the bundled library's write path keeps its records in B:rec (the branches
    l5-a1 and l5-a2 merged): a job dispatched, leased and finished on a scratch queue."""
    load(r, None)
    lua = Lua(r, "probe")
    lua.add("p")
    in_rec = r.hexists(lua.B + ":rec", "p")
    (job,) = lua.dequeue("c1", limit=1).jobs
    finished = lua.finish("c1", job) == 0 and not r.hexists(lua.B + ":rec", "p")
    r.flushall()
    return bool(in_rec and finished)


def carry_on(lua: Lua, leased: dict[str, Leased]) -> dict[str, Any]:
    """Carry every job of build() on (finish, fail, retry, the blocked ones promoted, the
    waiting ones leased, a dead client swept); what each call replied, and the queue after."""
    out: dict[str, Any] = {}
    later = NOW + 10_000
    out["finish a1"] = lua.finish("c1", leased["a1"], now=later)
    out["finish old"] = lua.finish("c2", leased["old"], now=later)
    out["retry b1"] = lua.retry("c2", leased["b1"], later + 1, now=later)
    out["fail x2"] = lua.fail("c1", leased["x2"], now=later)
    out["finish b2"] = lua.finish("c1", leased["b2"], now=later)
    out["readers after acks"] = readers(lua, later)
    took = lua.dequeue("c3", limit=100, now=NOW + 100_000)
    out["dequeue"] = [(j.id, j.data, j.run_at, j.retry_count) for j in took.jobs]
    out["readers after dequeue"] = readers(lua, NOW + 100_000)
    # c3 dies: its jobs go back to waiting, stalled
    out["swept"] = lua.dequeue("c4", limit=0, now=NOW + 100_000 + EXPIRY + 1).status
    out["readers after sweep"] = readers(lua, NOW + 100_000 + EXPIRY + 1)
    out["events"] = lua.events()
    out["ends"] = lua.r.hgetall(lua.B + ":ends")
    out["ended"] = {
        key.rsplit(":", 1)[1]: lua.r.hgetall(key)
        for key in lua.r.scan_iter(match=lua.B.replace("{", "[{]").replace("}", "[}]") + ":ended:*")
    }
    return out


def test_every_upgraded_job_carries_on_as_4_4_0_would(r: redis.Redis) -> None:
    if not write_path_is_5_0(r):
        pytest.skip("the 5.0 write path (branches l5-a1, l5-a2) is not in this library yet")
    load(r, OLD)
    expected_lua = Lua(r, "e2e")
    expected = carry_on(expected_lua, build(expected_lua))  # all of it by 4.4.0
    r.flushall()
    load(r, OLD)
    lua = Lua(r, "e2e")
    leased = build(lua)
    load(r, None)  # then 5.0, converting as the first write call goes
    got = carry_on(lua, leased)
    assert r.get(lua.B + ":layout") == "5"
    for name in expected:
        assert got[name] == expected[name], name


# ---------------------------------------------------------------- queasy_py's calls


def big_4x_queue(r: redis.Redis, queue: str, n: int = 2 * BUDGET + 200) -> Lua:
    """A queue of `n` waiting jobs written by 4.4.0 (then 5.0 loaded over it by a client)."""
    lua = Lua(r, "qp", queue)  # (B: "qp:{<queue>}:<queue>")
    for start in range(0, n, 1000):
        lua.dispatch(*[(f"j{i}", f'"{i}"', "") for i in range(start, min(n, start + 1000))])
    return lua


def test_a_client_reads_a_queue_of_4_x_after_converting_it(
    r: redis.Redis, own_server: EmbeddedServer
) -> None:
    from queasy_py import Client

    lua = big_4x_queue(r, "reads")
    before = lua.counts()
    client = Client(own_server.url, prefix="qp")  # its handshake loads 5.0 over 4.4.0
    try:
        queue = client.queue("reads")
        assert queue.counts()["waiting"] == before["waiting"] == 2 * BUDGET + 200
        assert r.fcall("queasy_library", 0) == f"queasy_py {bundled_version()}"
        assert r.get(lua.B + ":layout") == "5"
        job = queue.get_job("j7")
        assert job is not None and job.data == "7"
    finally:
        client.close()


def test_a_producer_write_on_a_queue_of_4_x_is_sent_again_once_converted(
    r: redis.Redis, own_server: EmbeddedServer
) -> None:
    from queasy_py import Client

    one = big_4x_queue(r, "one")
    many = big_4x_queue(r, "many")
    client = Client(own_server.url, prefix="qp")
    try:
        client.queue("one").dispatch({"x": 1}, id="new")  # refused (a step), then sent again
        assert r.get(one.B + ":layout") == "5"
        ids = client.queue("many").dispatch_many(
            [{"data": i, "id": f"n{i}"} for i in range(2500)]  # three pipelined calls
        )
        assert len(ids) == 2500 and r.get(many.B + ":layout") == "5"
        assert r.zcard(many.B + ":waiting") == 2 * BUDGET + 200 + 2500
    finally:
        client.close()


def test_the_async_client_reads_a_queue_of_4_x_after_converting_it(
    r: redis.Redis, own_server: EmbeddedServer
) -> None:
    import asyncio

    from queasy_py.aio import AsyncClient

    lua = big_4x_queue(r, "async")

    async def main() -> dict[str, int]:
        async with AsyncClient(own_server.url, prefix="qp") as client:
            return await client.queue("async").counts()

    assert asyncio.run(main())["waiting"] == 2 * BUDGET + 200
    assert r.get(lua.B + ":layout") == "5"


def test_a_cluster_client_reads_and_writes_a_queue_of_4_x_after_converting_it(
    cluster: Any,
) -> None:
    """On a Redis Cluster redis-py follows the TRYAGAIN itself (as a moving slot's) until its
    TTL runs out, and drops its text: the client's calls convert the queue first."""
    from queasy_py import Client

    old = (FIXTURES / f"queasy-{OLD}.lua").read_text()
    for port in cluster.primary_ports():
        cluster.node(port).function_load(old, replace=True)
    lua: dict[str, Lua] = {}
    for name in ("reads", "writes"):
        port = cluster.owner(Lua(redis.Redis(), "qp", name).B)  # (a base key only)
        node = redis.Redis(port=port, password=cluster.password, decode_responses=True)
        lua[name] = big_4x_queue(node, name)
    client = Client(cluster.url, workers=0, prefix="qp")  # loads 5.0 on every primary
    try:
        assert client.queue("reads").counts()["waiting"] == 2 * BUDGET + 200
        client.queue("writes").dispatch({"x": 1}, id="new")
        for name in ("reads", "writes"):
            assert lua[name].r.get(lua[name].B + ":layout") == "5"
    finally:
        client.close()
        for one in lua.values():
            one.r.close()


def test_the_scheduling_loops_reads_convert_a_queue_of_4_x(
    r: redis.Redis, own_server: EmbeddedServer
) -> None:
    """The loop's own client (a plain redis.Redis: store/connection.loop_client) reads the
    leases to hand back (runtime/handback.py) and the schedules at start (runtime/
    schedules.py) through read_converting: a queue not converted yet is converted first."""
    from queasy_py.store.connection import loop_client
    from queasy_py.store.upgrading import read_converting

    lua = big_4x_queue(r, "loop")
    taken = lua.dequeue("c1", limit=3).jobs
    load(r, None)
    loop = loop_client(own_server.url)
    try:
        with pytest.raises(redis.exceptions.TryAgainError, match="upgrading"):
            loop.fcall_ro("queasy_leases", 1, lua.B, "", "c1")
        pairs = read_converting(loop, "queasy_leases", lua.B, "", "c1")
        assert sorted(pairs[1::2]) == sorted(job.token.encode() for job in taken)
        assert read_converting(loop, "queasy_schedule_info", lua.B, "") is None
    finally:
        loop.close()
    assert r.get(lua.B + ":layout") == "5"


def test_an_async_cluster_client_reads_a_queue_of_4_x_after_converting_it(cluster: Any) -> None:
    """store/aiocluster.py's calls meet 'TRYAGAIN upgrading' as the sync cluster client's."""
    import asyncio

    from queasy_py.aio import AsyncClient

    old = (FIXTURES / f"queasy-{OLD}.lua").read_text()
    for port in cluster.primary_ports():
        cluster.node(port).function_load(old, replace=True)
    port = cluster.owner(Lua(redis.Redis(), "qp", "aread").B)  # (a base key only)
    node = redis.Redis(port=port, password=cluster.password, decode_responses=True)
    lua = big_4x_queue(node, "aread")

    async def main() -> dict[str, int]:
        async with AsyncClient(cluster.url, prefix="qp") as client:
            return await client.queue("aread").counts()

    try:
        assert asyncio.run(main())["waiting"] == 2 * BUDGET + 200
        assert node.get(lua.B + ":layout") == "5"
    finally:
        node.close()


def test_a_blocked_set_of_thousands_converts_whole(r: redis.Redis) -> None:
    """The set B:blocked is read whole and becomes the hash: one unpack() of its values (two
    per job) failed the call past Lua's 8,000 after the set was DELeted, every blocked job
    lost (their B:job:<id> left behind, read by nothing)."""
    lua = Lua(r, "blocked")
    n = 4_200
    ids = [f"j{i}" for i in range(n)]
    for start in range(0, n, 1000):
        lua.dispatch(*[(id, '"first"', "") for id in ids[start : start + 1000]])
    for client in ("c1", "c2", "c3", "c4", "c5"):
        lua.dequeue(client, limit=1000)
    for start in range(0, n, 1000):
        assert set(lua.dispatch(*[(id, '"again"', "") for id in ids[start : start + 1000]])) == {3}
    before = lua.counts()
    assert before["blocked"] == before["active"] == n
    load(r, None)
    upgrade(lua)
    assert lua.counts() == before
    assert r.hlen(lua.B + ":blocked") == n
    assert not [k for k in keys_of(r, lua.B) if k.startswith(lua.B + ":job:")]
    assert r.hget(lua.B + ":blocked", "j4199") == f'1 1 replace - -\t{NOW} {NOW} 0 0 0 0\t\t"again"'


def test_a_stray_waiting_id_of_an_active_job_is_not_leased_again(r: redis.Redis) -> None:
    """An id in B:waiting without its B:job:<id> (a stray: written around 4.x) whose job is
    active: 4.4.0's dequeue drops the stray id, the job runs once. The upgrade made the
    active record that id's, still in B:waiting: 5.0 read it as waiting and leased it to
    another client while the first one ran it (a second run at once)."""
    lua = Lua(r, "stray")
    job = lua.take("a")
    r.zadd(lua.B + ":waiting", {"a": NOW})
    load(r, None)
    upgrade(lua)
    assert lua.call("queasy_get_job", [lua.B], NOW, "a")[0] == "active"
    assert lua.dequeue("c2", limit=10, now=NOW + 1).jobs == []
    assert lua.counts(NOW + 1) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 1}
    assert lua.finish("c1", job, now=NOW + 2) == 0
    assert lua.counts(NOW + 2) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


def test_a_4_x_key_of_another_type_does_not_stop_the_upgrade(r: redis.Redis) -> None:
    """A 4.x record key that is not a hash (written around the library: a waiting job's
    B:job:<id>, an active job's B:active:<id>, a client's lease hash) failed every step of the
    upgrade with WRONGTYPE, so the queue refused every write for good (4.4.0 failed only
    where it read that key). It is read as no record: the upgrade ends, the other jobs carry
    on, the stray ids are dropped as 4.4.0's dequeue dropped an id without its record, and
    the foreign keys are left as they were."""
    lua = Lua(r, "types")
    lua.dispatch(("w1", '"w1"', NOW), ("w2", '"w2"', NOW))
    a1 = lua.take("a1", client="c1")
    lua.take("a2", client="c2")
    r.delete(lua.B + ":job:w1")
    r.set(lua.B + ":job:w1", "not a hash")
    r.delete(lua.B + ":active:a1")
    r.rpush(lua.B + ":active:a1", "not a hash")
    r.delete(lua.B + ":lease:c2")
    r.set(lua.B + ":lease:c2", "not a hash")
    load(r, None)
    upgrade(lua)
    assert r.get(lua.B + ":layout") == "5"
    assert lua.add("new", now=NOW + 1) == 1  # writes go on
    assert sorted(lua.dequeue("c3", limit=10, now=NOW + 2).ids) == ["new", "w2"]
    assert lua.call("queasy_get_job", [lua.B], NOW + 2, "w1") is None
    assert lua.finish("c1", a1, now=NOW + 3) == 1  # its record unreadable: stale
    assert r.get(lua.B + ":job:w1") == "not a hash"
    assert r.lrange(lua.B + ":active:a1", 0, -1) == ["not a hash"]
    assert r.get(lua.B + ":lease:c2") == "not a hash"
