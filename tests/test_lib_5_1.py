"""Library 5.1.0 (issue 14, server CPU per job): leases in the short form "<token>
<leased_at>" (an ack reads the job's numbers from the record it reads anyway, not from the
lease), and queasy_dequeue's optional reply 'rec' (ARGV[8]: id, token and record string per
job, 3 values where the reply of 5.0.0 has 8).

5.0.0 (tests/fixtures/queasy-5.0.0.lua) is loaded beside it under other names (library
`queasy50`, functions `q50_*`) on a server of this module's own: a 5.0.0 process calls
dequeue without ARGV[8] and must get 5.0.0's reply, and the leases 5.0.0 wrote (4.1.0's
form, with the record's numbers) must still ack; every event, end and kept record of an ack
is byte for byte 5.0.0's, for usual records and records garbled around the library.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from layout5_twin import state

from queasy_py.store.keys import QueueKeys
from queasy_py.store.library import source

FIXTURE = Path(__file__).parent / "fixtures" / "queasy-5.0.0.lua"
NOW = 1_700_000_000_000
EXPIRY = 60_000
MAXLEN = 1000
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def conn(own_server: Any) -> Iterator[redis.Redis]:
    """5.1.0 (queasy_*) and 5.0.0 (q50_*) on one server."""
    r = redis.Redis.from_url(own_server.url, decode_responses=True)
    old = FIXTURE.read_text()
    assert "local VERSION = '5.0.0'" in old
    old = old.replace("#!lua name=queasy\n", "#!lua name=queasy50\n", 1)
    old = old.replace("register_function('queasy_", "register_function('q50_")
    old = old.replace("function_name = 'queasy_", "function_name = 'q50_")
    r.function_load(source(), replace=True)
    r.function_load(old, replace=True)
    assert r.fcall("queasy_library", 0) == "queasy_py 5.1.1"
    assert r.fcall("q50_library", 0) == "queasy_py 5.0.0"
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def r(conn: redis.Redis) -> Iterator[redis.Redis]:
    yield conn
    for key in conn.scan_iter(match="t51*", count=1000):
        conn.unlink(key)


def base(name: str) -> str:
    return QueueKeys("t51-" + name, "q", "q").base


def put(r: redis.Redis, B: str, records: dict[str, str], run_at: int = NOW) -> None:
    """Records written raw (as the library or anyone around it may have), all waiting."""
    r.set(B + ":layout", "5")
    r.hset(B + ":rec", mapping=records)
    r.zadd(B + ":waiting", {id: run_at + n for n, id in enumerate(records)})


def dequeue(r: redis.Redis, lib: str, B: str, *extra: Any, limit: int = 20) -> Any:
    return r.fcall(lib + "dequeue", 1, B, NOW + 100, "c1", "n", limit, EXPIRY, MAXLEN, *extra)


# ---------------------------------------------------------------- the reply 'rec'

#: records as the library writes them: handed out as stored
USUAL = {
    "a": f'{NOW} {NOW} 0 0 0 0\t\t"x"',  # dispatched
    "b": f"{NOW} {NOW - 9} 2 1 3 4\t{TRACE}\t" + '"d a\tt a"',  # requeued, a trace, a tab
    "c": f"{NOW} - 0 0 0 0\t\t1",  # upgraded from 3.x without enqueued_at
    "d": f"{NOW} - 1 0 2 3\t\t[]",
}


def test_the_reply_rec_hands_out_each_record_as_stored(r: redis.Redis) -> None:
    B = base("rec")
    put(r, B, USUAL)
    reply = dequeue(r, "queasy_", B, 0, "rec")
    assert reply[:2] == [0, ""] and len(reply) == 2 + 3 * len(USUAL), reply
    jobs = [reply[k : k + 3] for k in range(2, len(reply), 3)]
    assert [job[:2] for job in jobs] == [[id, f"n.{n + 1}"] for n, id in enumerate(USUAL)]
    assert {id: rec for id, _, rec in jobs} == USUAL
    assert r.hgetall(B + ":rec") == USUAL  # left in place, as the reply 8 wide leaves them


@pytest.mark.parametrize(
    ("stored", "handed"),
    [
        # numbers garbled around the library: read as 0 (enqueued_at when it is digits)
        (f"x {NOW} 1e+300 -1 z 0\t\t7", f"0 {NOW} 0 0 0 0\t\t7"),
        ("1 2 3\t\t8", "0 0 0 0 0 0\t\t8"),  # too few: all 0, enqueued_at unknown 0
        (f"{NOW} {NOW} 0 0 0 0 0\t\t9", "0 0 0 0 0 0\t\t9"),  # too many
        (f"{NOW} 5 1 0 0 0x\t{TRACE}\t10", f"{NOW} 5 1 0 0 0\t{TRACE}\t10"),  # attempts
        # a trace longer than MAX_TRACE (written around the library): none, as 8 wide
        (f"{NOW} {NOW} 1 0 0 2\t{'a' * 257}\t11", f"{NOW} {NOW} 1 0 0 2\t\t11"),
        (f"{NOW} - 0 0 0 0\t{'a' * 257}\t12", f"{NOW} 0 0 0 0 0\t\t12"),
        (f"{NOW} {NOW} 1 0 0 2\t{'a' * 256}\t13", f"{NOW} {NOW} 1 0 0 2\t{'a' * 256}\t13"),
    ],
)
def test_the_reply_rec_normalizes_a_garbled_record_and_a_too_long_trace(
    r: redis.Redis, stored: str, handed: str
) -> None:
    """Python always gets "<6 integers>\\t<trace>\\t<data>" from a record the library did
    not write; the numbers are those the reply 8 wide gives (the same read: rec_lease)."""
    B, W = base("g-rec"), base("g-wide")
    put(r, B, {"g": stored})
    put(r, W, {"g": stored})
    rec = dequeue(r, "queasy_", B, 0, "rec")
    wide = dequeue(r, "queasy_", W, 0)
    assert rec[2:] == ["g", "n.1", handed], rec
    nums, trace, data = handed.split("\t", 2)
    words = nums.split(" ")
    assert wide[2:] == ["g", "n.1", data, words[0], *words[2:5], trace], wide
    assert r.hget(B + ":rec", "g") == stored  # the record stays as it is


@pytest.mark.parametrize("form", ["wide", "REC", "rec ", "1", "0"])
def test_an_unknown_reply_form_is_refused_naming_it_and_nothing_is_written(
    r: redis.Redis, form: str
) -> None:
    B = base("bad")
    put(r, B, {"a": USUAL["a"]})
    before = state(r, B)
    with pytest.raises(
        redis.ResponseError, match=f"INVALID reply must be 'rec' or '', got '{form}'"
    ):
        dequeue(r, "queasy_", B, 0, form)
    assert state(r, B) == before


# ---------------------------------------------------------------- the lease's stored form


def test_a_lease_is_stored_as_token_and_leased_at(r: redis.Redis) -> None:
    """5.1.0 writes "<token> <leased_at>" from dequeue (either reply) and from a push; 5.0.0
    wrote the record's numbers between them."""
    B, old_b = base("lease"), base("lease-old")
    put(r, B, USUAL)
    put(r, old_b, USUAL)
    dequeue(r, "queasy_", B, 0, "rec", limit=2)
    dequeue(r, "queasy_", B, 0, limit=2)
    at = NOW + 100
    assert r.hgetall(B + ":lease:c1") == {
        "a": f"n.1 {at}", "b": f"n.2 {at}", "c": f"n.1 {at}", "d": f"n.2 {at}",
    }  # fmt: skip
    dequeue(r, "q50_", old_b, limit=2)
    assert r.hgetall(old_b + ":lease:c1") == {
        "a": f"n.1 {NOW} {NOW} 0 0 0 1 {at}", "b": f"n.2 {NOW} {NOW - 9} 2 1 3 5 {at}",
    }  # fmt: skip


def test_a_pushed_job_s_lease_is_stored_as_token_and_leased_at(
    r: redis.Redis, own_server: Any
) -> None:
    B = base("push")
    r.set(B + ":layout", "5")
    dequeue(r, "queasy_", B, 1, "rec", limit=2)  # nothing ready: c1 parks 2 slots
    listener = redis.Redis.from_url(own_server.url, decode_responses=True)
    sub = listener.pubsub(ignore_subscribe_messages=True)
    sub.ssubscribe(B + ":push:c1")
    try:
        sub.get_message(timeout=1.0)
        assert r.fcall("queasy_dispatch", 1, B, NOW + 200, 1, "replace", 1, "", "p", '"x"', "")
        message = sub.get_message(timeout=5.0)
        assert message is not None, "pushed"
        assert message["data"] == f'p\np1\n{NOW + 200}\n0\n0\n0\n\n"x"'  # (as 5.0.0's)
    finally:
        sub.close()
        listener.close()
    assert r.hgetall(B + ":lease:c1") == {"p": f"p1 {NOW + 200}"}


# ---------------------------------------------------------------- a 5.0.0 process on 5.1.0


def test_a_dequeue_without_argv_8_replies_as_5_0_0(r: redis.Redis) -> None:
    """A 5.0.0 process calls dequeue with 7 ARGV (or 6): its reply is 5.0.0's, 8 wide."""
    records = USUAL | {"g": f"x {NOW} 1e+300 -1 z 0\t\t7", "t": f"{NOW} 1 0 0 0 0\t{'a' * 300}\t9"}
    for n, extra in enumerate([(), (0,), (0, "")]):
        B, old_b = base(f"wide{n}"), base(f"wide{n}-old")
        put(r, B, records)
        put(r, old_b, records)
        new, old = dequeue(r, "queasy_", B, *extra), dequeue(r, "q50_", old_b, *extra)
        assert new == old and len(new) == 2 + 8 * len(records), (extra, new, old)


#: records as the library writes them and as others may have written them around it
ACKED = USUAL | {
    "e": f"{NOW} x 0 0 0 0\t\t1",  # enqueued_at garbled: the ack reads the record (4.0.0)
    "f": f"000{NOW} {NOW} 0 0 0 0\t\t2",  # leading zeros: as 5.0.0's lease held them
    "g": f"{NOW} 0{NOW} 01 0 0 7\t\t3",
    "h": f"{NOW} {NOW} 999999999999999 0 0 0\t\t4",  # 15 digits: as they are
    "i": f"{NOW} {NOW} 0 0 0 999999999999999\t\t5",  # attempts + 1 has 16 digits
    "j": f"x {NOW} 1e+300 -1 z 0\t\t6",  # garbled numbers: 0
    "k": "1 2 3\t\t7",
    "l": f"{NOW} {NOW} 0 0 0 0 0\t\t8",
    "m": f"{NOW} 1234567890123456 0 0 0 0\t\t9",  # enqueued_at of 16 digits
    "n": f"{NOW}  0 0 0 0\t\t10",  # enqueued_at ''
    "o": f"{NOW} {NOW} 0 0 0 0\t{'a' * 300}\t11",
    "p": f"{NOW}\t{NOW} 0 0 0 0\t\t12",  # a tab among the numbers
}


def acks(r: redis.Redis, lib: str, B: str, kind: str, leases: list[tuple[str, str]]) -> Any:
    now = NOW + 500
    if kind == "retry":
        flat = [x for id, token in leases for x in (id, token, now + 10, "retry", 42, NOW + 200,
                                                     "E", "m", "tb")]  # fmt: skip
        return r.fcall(lib + "retry", 1, B, now, "c1", MAXLEN, *flat)
    head = [now, "c1", MAXLEN, 100, 3_600_000, "host one", 0]
    if kind == "fail":
        flat = [x for id, token in leases for x in (id, token, "", "", 42, NOW + 200, "E", "k",
                                                     "m", "tb")]  # fmt: skip
        return r.fcall(lib + "fail", 1, B, *head, *flat)
    result = '{"r": 1}' if kind == "result" else ""
    flat = [x for id, token in leases for x in (id, token, 42, NOW + 200, result)]
    return r.fcall(lib + "finish", 1, B, *head, *flat)


@pytest.mark.parametrize("kind", ["finish", "result", "fail", "retry"])
def test_an_ack_writes_what_5_0_0_writes_whoever_leased(r: redis.Redis, kind: str) -> None:
    """The same records leased and acked three ways: by 5.0.0 alone (its leases hold the
    numbers), by 5.1.0 alone (its leases do not: the ack reads the record), and leased by
    5.0.0 then acked by 5.1.0 (a lease of 4.1.0's form: lease_of). Every reply, event, end,
    kept record and living record is the same, byte for byte."""
    states, replies = [], []
    for n, (dq, ack) in enumerate([("q50_", "q50_"), ("queasy_", "queasy_"), ("q50_", "queasy_")]):
        B = base(f"ack{n}")
        put(r, B, ACKED)
        row = dequeue(r, dq, B)
        leases = [(row[k], row[k + 1]) for k in range(2, len(row), 8)]
        assert sorted(id for id, _ in leases) == sorted(ACKED), row
        replies.append(acks(r, ack, B, kind, leases))
        assert r.hlen(B + ":lease:c1") == 0
        states.append(state(r, B))
    assert replies[0] == replies[1] == replies[2] == [0] * len(ACKED)
    for name in sorted(set(states[0]) | set(states[1]) | set(states[2])):
        assert states[0].get(name) == states[1].get(name), ("5.1.0", name)
        assert states[0].get(name) == states[2].get(name), ("leased by 5.0.0", name)
