"""The readers of library 5.0.0 (queasy_get_job, queasy_jobs, queasy_counts, queasy_leases,
queasy_schedule_info) over records written in the 5.0 layout by hand (B:rec, the hash
B:blocked, B:err, leases), against what library 4.4.0 replies for the same jobs made by
its own calls on a second server (tests/fixtures/queasy-4.4.0.lua): the same replies, in the
same order (layout5.md: every reply stays 4.4.0's)."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from queasy_py.store.embedded import EmbeddedServer
from queasy_py.store.library import ensure_loaded
from tests.lua_calls import NOW, Lua
from tests.test_upgrade_5 import OLD, TRACE, load, readers

LATER = NOW + 60_000
IDS = ("a", "b", "w", "d", "none")


@pytest.fixture
def old(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A second server, with library 4.4.0."""
    conn = redis.Redis.from_url(own_server.url, decode_responses=True)
    conn.flushall()
    load(conn, OLD)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def lua(r: redis.Redis, prefix: str) -> Lua:
    ensure_loaded(r)
    lua = Lua(r, prefix)
    r.set(lua.B + ":layout", "5")
    return lua


def test_records_written_in_the_5_0_layout_read_as_4_4_0_reads_its_own(
    old: redis.Redis, lua: Lua
) -> None:
    four = Lua(old, "four")
    a = four.take("a")  # a retried job, leased again: its last error, attempts 2
    assert four.retry("c1", a, NOW - 1, message="first", traceback="tb") == 0
    (a,) = four.dequeue("c1", limit=1, now=NOW + 1).jobs
    b = four.take("b", client="c2", now=NOW + 2)  # active, with a blocked job
    assert four.dispatch(("b", '"new b"', LATER), now=NOW + 3) == [3]
    four.dispatch(("w", '{"k": [1, 2]}', ""), trace=TRACE)  # waiting, with a trace
    four.dispatch(("d", '"later"', LATER))  # delayed
    expected = readers(four, ids=IDS)

    r, B = lua.r, lua.B
    err = {"name": "ValueError", "kind": "retriable", "message": "first", "traceback": "tb"}
    r.hset(
        B + ":rec",
        mapping={
            "a": f'{NOW - 1} {NOW} 1 0 0 1\t\t"x"',
            "b": f'{NOW + 2} {NOW} 0 0 0 0\t\t"x"',
            "w": f'{NOW} {NOW} 0 0 0 0\t{TRACE}\t{{"k": [1, 2]}}',
            "d": f'{LATER} {NOW} 0 0 0 0\t\t"later"',
        },
    )
    r.hset(B + ":err", "a", json.dumps({**err, "at": str(NOW)}))
    r.hset(B + ":blocked", "b", f'1 1 replace - -\t{LATER} {NOW + 3} 0 0 0 0\t\t"new b"')
    r.zadd(B + ":waiting", {"w": NOW, "d": LATER})
    r.hset(B + ":lease:c1", "a", f"{a.token} {NOW - 1} {NOW} 1 0 0 2 {NOW + 1}")
    r.hset(B + ":lease:c2", "b", f"{b.token} {NOW + 2} {NOW} 0 0 0 1 {NOW + 2}")
    r.zadd(B + ":expiry", {"c1": NOW + 10_000, "c2": NOW + 10_000})
    got = readers(lua, ids=IDS)
    assert got == expected


def test_a_value_garbled_around_the_library_reads_as_no_job(lua: Lua) -> None:
    """A B:rec value that is not a record, a B:err value that is not JSON: no reader fails."""
    r, B = lua.r, lua.B
    r.hset(B + ":rec", mapping={"g": "garbage", "e": f'{NOW} {NOW} x 0 0 0\t\t"x"'})
    r.hset(B + ":err", mapping={"e": "not json", "g": "{}"})
    r.zadd(B + ":waiting", {"g": NOW, "e": NOW})
    r.hset(B + ":blocked", "g", "no tab here")
    assert lua.record("g") is None
    rec = lua.record("e")
    assert rec is not None and rec["retry_count"] == "0" and "error_name" not in rec
    assert [fields["id"] for _, fields in lua.jobs("waiting")[1]] == ["e"]
    assert lua.jobs("blocked")[1] == []
    assert lua.counts()["waiting"] == 2  # (B:waiting counts them, as 4.4.0's did)


def test_blocked_jobs_page_through_the_hash(lua: Lua) -> None:
    """B:blocked is a hash now: a page is an HSCAN of it (more than 128 fields: a hash table,
    whose cursor is not an offset)."""
    r, B = lua.r, lua.B
    ids = {f"b{i}" for i in range(300)}
    r.hset(
        B + ":blocked", mapping={id: f'1 1 clamp - -\t{NOW} {NOW} 0 0 0 0\t\t"{id}"' for id in ids}
    )
    seen: list[str] = []
    cursor = "0"
    for _ in range(100):
        cursor, page = lua.jobs("blocked", cursor=cursor, limit=50, data=True)
        seen += [fields["id"] for state, fields in page if state == "blocked"]
        assert all(fields["data"] == f'"{fields["id"]}"' for _, fields in page)
        if cursor == "0":
            break
    assert set(seen) == ids
    assert lua.counts()["blocked"] == 300


MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ [^\]]*\] (.*)$")
MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


def monitored(redis_url: str, r: redis.Redis, action: Callable[[], Any]) -> list[list[str]]:
    """Every command the server ran (client and Lua) while `action` ran."""
    commands = []
    with redis.Redis.from_url(redis_url, decode_responses=True) as conn, conn.monitor() as mon:
        action()
        r.echo("l5-end")
        while True:
            line = mon.connection.read_response()
            args = [
                codecs.decode(arg, "unicode_escape")
                for arg in MONITOR_ARG.findall(MONITOR_LINE.match(line).group(1))
            ]
            if args == ["ECHO", "l5-end"]:
                return commands
            commands.append(args)


def test_an_upgraded_queue_costs_one_read_per_call(lua: Lua, redis_url: str) -> None:
    """The layout's check is the migration guard's EXISTS: one command, no other read of
    B:layout or B:upgrade (dequeue and finish: their first read, guarded_exists)."""
    B = lua.B
    calls: dict[str, Callable[[], Any]] = {
        "queasy_dispatch": lambda: lua.add("x"),
        "queasy_dequeue": lambda: lua.dequeue("c1", limit=1),
        "queasy_bump": lambda: lua.bump("c1"),
        "queasy_get_job": lambda: lua.record("x"),
        "queasy_counts": lambda: lua.counts(),
    }
    for name, action in calls.items():
        commands = monitored(redis_url, lua.r, action)
        start = next(
            i
            for i, c in enumerate(commands)
            if c[0].upper() == "FCALL" or c[0].upper() == "FCALL_RO"
        )
        assert commands[start][1] == name
        first = commands[start + 1]
        assert first[0] == "EXISTS" and first[-3:] == [
            B + ":layout",
            B + ":guard:1",
            B + ":guard:2",
        ]
        rest = [
            c
            for c in commands[start + 2 :]
            if any(k.endswith((":layout", ":upgrade")) for k in c[1:])
        ]
        assert rest == [], name


def test_a_dequeue_on_a_fresh_queue_marks_it_and_reads_go_on(r: redis.Redis, prefix: str) -> None:
    """A dequeue that finds nothing registers its client (B:expiry): the queue is no longer
    fresh, so it must be marked 5.0 then, or every read of it would be refused with 'TRYAGAIN
    upgrading' until some other write call (seen first in test_lua_walk's random walk)."""
    ensure_loaded(r)
    lua = Lua(r, prefix)  # (not marked, unlike the fixture's)
    assert lua.dequeue("c1", limit=5).ids == []
    assert lua.r.get(lua.B + ":layout") == "5"
    assert lua.counts()["waiting"] == 0  # FCALL_RO: not refused
    assert lua.get_job("none") is None
