"""What the Lua library refuses, through raw FCALL as any other producer could send it.

A refused call is an error reply 'INVALID <what>' and writes nothing (every entry point checks
all its arguments before its first write); the public API turns it into InvalidInput.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import records
import redis
from lua_calls import EXPIRY, KEEP, NOW, Lua, live, snapshot

from queasy_py import Client
from queasy_py.aio import AsyncClient
from queasy_py.errors import InvalidInput
from queasy_py.store.library import Ack, Dispatched, ensure_loaded

MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last time the library accepts
LATER = NOW + 5_000


@pytest.fixture
def lua(r: redis.Redis, redis_url: str, prefix: str) -> Lua:
    with redis.Redis.from_url(redis_url) as conn:
        ensure_loaded(conn)
    return Lua(r, prefix)


@pytest.fixture
def before(lua: Lua, r: redis.Redis, prefix: str) -> Iterator[dict]:
    """A queue holding a waiting, a delayed and an active job, and its keys at the start; the
    test asserts that a refused call left them as they were."""
    lua.add("w")
    lua.add("d", run_at=LATER)
    lua.take("act", client="c1")
    yield snapshot(r, prefix)


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(redis.ResponseError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert message.startswith("INVALID "), message
    return message


# ---------------------------------------------------------------- times


BAD_TIMES = [
    str(MAX_MS + 1),
    "100000000000000000",  # 1e17 ms
    "1e17",
    "1e+20",
    "-1",
    "1.5",
    "17e2",
    " 5",
    "5 ",
    "0x10",
    "nan",
    "inf",
    "soon",
]


@pytest.mark.parametrize("run_at", BAD_TIMES)
def test_dispatch_refuses_a_run_at_that_is_not_integer_ms_up_to_year_9999(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, run_at: str
) -> None:
    message = refused(lua.dispatch, ("new", '"x"', NOW), ("w", '"y"', run_at))
    assert "job 2 run_at" in message
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("now", ["1e12", "-5", "1.5", str(MAX_MS + 1)])
def test_every_function_refuses_a_bad_now(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, now: str
) -> None:
    refused(lua.dispatch, ("new", '"x"', ""), now=now)
    refused(lua.dequeue, "c2", now=now)
    refused(lua.bump, "c2", now=now)
    refused(lua.cancel, "w", now=now)
    refused(lua.get_job, "w", now=now)
    refused(lua.counts, now=now)
    assert snapshot(r, prefix) == before


def test_the_largest_time_is_written_as_an_integer_everywhere(lua: Lua, r: redis.Redis) -> None:
    """A Lua number reaches Redis as '%.14g' text: 253402300799999 became '2.534023008e+14'."""
    wake = r.pubsub(ignore_subscribe_messages=True)
    wake.ssubscribe(lua.B + ":wake")
    try:
        assert lua.add("far", run_at=MAX_MS) == Dispatched.CREATED
        assert records.record(r, lua.B, "far")["run_at"] == str(MAX_MS)
        assert lua.get_job("far")["run_at"] == MAX_MS
        assert r.zscore(lua.B + ":waiting", "far") == MAX_MS
        message = None
        for _ in range(50):
            message = wake.get_message(timeout=0.1)
            if message is not None:
                break
        assert message is not None and message["data"] == str(MAX_MS)
    finally:
        wake.close()
    checkout = lua.dequeue("c1", now=MAX_MS, expiry=1)
    assert checkout.ids == ["far"]
    job = checkout.jobs[0]
    # library 4.0.0: the lease, with its time, is in the client's lease hash (4.1.0 to 5.0.0:
    # with the record's numbers: run_at, enqueued_at, the counts, attempts; 5.1.0: not)
    assert r.hget(lua.B + ":lease:c1", "far") == f"{job.token} {MAX_MS}"
    assert lua.record("far", now=MAX_MS)["leased_at"] == str(MAX_MS)
    assert lua.retry("c1", job, run_at=MAX_MS, now=MAX_MS) == Ack.OK
    assert records.record(r, lua.B, "far")["run_at"] == str(MAX_MS)
    (event,) = lua.events()
    assert (event["run_at"], event["ended_at"]) == (str(MAX_MS), str(MAX_MS))


@pytest.mark.parametrize("run_at", ["1e17", "1.5", str(MAX_MS + 1), "+", "+-5", "+1.5", "+1e9"])
def test_retry_refuses_a_bad_run_at_before_any_write(
    lua: Lua, r: redis.Redis, prefix: str, run_at: str
) -> None:
    first = lua.take("a", client="c1")
    second = lua.take("b", client="c1")
    before = snapshot(r, prefix)
    groups = [first.id, first.token, NOW, "retry", "42", NOW - 5, "E", "m", "tb"]
    groups += [second.id, second.token, run_at, "retry", "42", NOW - 5, "E", "m", "tb"]
    assert "retry run_at" in refused(lua.call, "queasy_retry", [lua.B], NOW, "c1", 100, *groups)
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("field", ["pid", "started_at"])
def test_acks_refuse_a_pid_or_started_at_that_is_not_an_integer(
    lua: Lua, r: redis.Redis, prefix: str, field: str
) -> None:
    job = lua.take("a", client="c1")
    before = snapshot(r, prefix)
    pid, started = ("4.2", NOW) if field == "pid" else ("42", "1e12")
    head = [NOW, "c1", 100, *KEEP, "h", 0]
    group = [job.id, job.token, pid, started, ""]
    message = refused(lua.call, "queasy_finish", [lua.B], *head, *group)
    assert ("worker pid" if field == "pid" else "started_at") in message
    assert snapshot(r, prefix) == before
    assert lua.finish("c1", job) == Ack.OK


def test_public_api_turns_a_refused_time_into_invalid_input(redis_url: str, prefix: str) -> None:
    with Client(redis_url, prefix=prefix) as client:
        q = client.queue("q")
        with pytest.raises(InvalidInput, match="run_at"):
            q.dispatch({}, run_at=1e17)  # epoch seconds: 1e20 ms
        assert live(q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}


# ---------------------------------------------------------------- data


NOT_JSON = ["", "{", "{'a': 1}", "[1,]", "nan", "NaN", "Infinity", "-inf", "0x10", "1 2", "x"]


@pytest.mark.parametrize("data", NOT_JSON)
def test_dispatch_refuses_data_that_is_not_json(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, data: str
) -> None:
    message = refused(lua.dispatch, ("new", '"x"', NOW), ("other", data, NOW))
    assert "job 2 data is not JSON" in message
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("data", ['"x"', "0", "-1.5e3", "null", '{"a": [1, true, null, "\\n"]}'])
def test_dispatch_takes_any_json_value(lua: Lua, data: str) -> None:
    assert lua.add("a", data) == Dispatched.CREATED
    assert lua.get_job("a")["data"] == data


def test_async_public_api_turns_refused_data_into_invalid_input(
    redis_url: str, prefix: str
) -> None:
    async def main() -> None:
        async with AsyncClient(redis_url, prefix=prefix) as client:
            q = client.queue("q")
            with pytest.raises(InvalidInput, match="run_at"):
                await q.dispatch({}, run_at=1e17)
            assert live(await q.counts()) == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 0}

    asyncio.run(main())


# ---------------------------------------------------------------- ids and strings in messages


BAD_IDS = [
    "",
    "a\nb",
    "a b",
    "a\tb",
    "a\rb",
    "a\x00b",
    "a\x7fb",
    "a\x85b",  # NEL
    "a\u00a0b",  # no-break space
    "a\u2028b",  # line separator
    "a\u3000b",  # ideographic space
    "x" * 257,
    "é" * 257,
]


@pytest.mark.parametrize("bad", BAD_IDS, ids=[repr(b)[:20] for b in BAD_IDS])
def test_dispatch_refuses_an_id_against_the_id_rules(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, bad: str
) -> None:
    message = refused(lua.dispatch, ("new", '"x"', NOW), (bad, '"x"', NOW))
    assert "job 2 id" in message
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("good", ["x" * 256, "é" * 256, "日本" * 128, "a-b_c.d:e/f@g"])
def test_dispatch_takes_an_id_within_the_id_rules(lua: Lua, good: str) -> None:
    assert lua.add(good) == Dispatched.CREATED
    assert lua.get_job(good)["id"] == good


def test_client_ids_nonces_marks_and_fail_ids_follow_the_id_rules(
    lua: Lua, r: redis.Redis, prefix: str, before: dict
) -> None:
    refused(lua.dequeue, "c\n2")
    refused(lua.call, "queasy_dequeue", [lua.B], NOW, "c2", "n\n1", 1, EXPIRY, 10, 0)
    refused(lua.bump, "c 2")
    refused(lua.unpark, "c1", "mark\nwith a newline")
    refused(lua.unpark, "c1\n", "mark")
    job = lua.dequeue("c1", limit=1).jobs[0]  # "w"
    snap = snapshot(r, prefix)
    refused(lua.fail, "c1", job, fail_id="f\n1")
    assert snapshot(r, prefix) == snap
    assert lua.fail("c1", job, fail_id="f1") == Ack.OK


@pytest.mark.parametrize(
    "flags",
    [("2", "replace", "1"), ("1", "sometimes", "1"), ("1", "replace", "yes"), ("", "keep", "0")],
)
def test_dispatch_refuses_unknown_flags(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, flags: tuple
) -> None:
    refused(lua.call, "queasy_dispatch", [lua.B], NOW, *flags, "new", '"x"', NOW)
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("args", [(5, 10, "-1"), ("1.5", 10, 10), (5, "0", 10), (5, 10, "x")])
def test_dequeue_refuses_a_bad_limit_expiry_or_maxlen(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, args: tuple
) -> None:
    limit, expiry, maxlen = args
    refused(lua.call, "queasy_dequeue", [lua.B], NOW, "c2", "n1", limit, expiry, maxlen, 0)
    assert snapshot(r, prefix) == before


# ---------------------------------------------------------------- nothing half-written


def test_a_bad_job_late_in_a_batch_writes_none_of_it(
    lua: Lua, r: redis.Redis, prefix: str, before: dict
) -> None:
    jobs = [(f"j{n}", '"x"', NOW) for n in range(5)] + [("bad", "{not json", NOW)]
    refused(lua.dispatch, *jobs)
    assert snapshot(r, prefix) == before


def test_a_partial_triple_is_refused(lua: Lua, r: redis.Redis, prefix: str, before: dict) -> None:
    refused(lua.call, "queasy_dispatch", [lua.B], NOW, 1, "replace", 1, "new", '"x"', NOW, "b")
    head = [NOW, "c1", 100, *KEEP, "h", 0]
    message = refused(lua.call, "queasy_finish", [lua.B], *head, "act", "tok", "42")
    assert "groups of 5" in message
    assert snapshot(r, prefix) == before


def test_a_stray_id_in_waiting_is_dropped_and_the_others_are_leased(
    lua: Lua, r: redis.Redis
) -> None:
    lua.dispatch(("a", '"x"', NOW - 2), ("b", '"x"', NOW))
    r.zadd(lua.B + ":waiting", {"ghost": NOW - 3})  # an id without a record
    checkout = lua.dequeue("c1", limit=3)
    assert checkout.ids == ["a", "b"]
    assert r.zrange(lua.B + ":waiting", 0, -1) == []
    assert not records.has_record(r, lua.B, "ghost")
    assert lua.counts() == {"waiting": 0, "delayed": 0, "blocked": 0, "active": 2}
    assert [lua.finish("c1", job) for job in checkout.jobs] == [Ack.OK, Ack.OK]


def test_a_waiting_entry_of_an_active_job_never_overwrites_its_lease(
    lua: Lua, r: redis.Redis
) -> None:
    active = lua.take("a", client="c1")
    lua.add("a", '"blocked"')  # a blocked record in job:a
    r.zadd(lua.B + ":waiting", {"a": NOW})  # and, wrongly, an entry in waiting
    lua.add("b")
    assert lua.dequeue("c2", limit=5).ids == ["b"]
    assert r.hget(lua.B + ":lease:c1", "a") == f"{active.token} {NOW}"
    assert not r.hexists(lua.B + ":lease:c2", "a")
    assert lua.finish("c1", active) == Ack.OK  # the blocked record is promoted as usual
    assert lua.get_job("a")["data"] == '"blocked"'
    assert lua.dequeue("c2", limit=5).ids == ["a"]


def test_a_relative_retry_time_counts_from_the_servers_clock(lua: Lua, r: redis.Redis) -> None:
    """'+ms' is added to the server's TIME (now ''), not to any client's clock; capped at the
    largest time."""
    job = lua.take("rel", client="c1")
    late = lua.take("late", client="c1", now=MAX_MS - 10)
    server_ms = int(r.time()[0]) * 1000
    args = [job.id, job.token, "+5000", "retry", "42", "", "ValueError", "bad value", ""]
    assert lua.call("queasy_retry", [lua.B], "", "c1", 100, *args) == [Ack.OK]
    run_at = int(records.record(r, lua.B, "rel")["run_at"])
    assert server_ms + 5000 <= run_at <= server_ms + 5000 + 2000
    assert r.zscore(lua.B + ":waiting", "rel") == run_at
    assert lua.retry("c1", late, run_at="+999999", now=MAX_MS - 10) == Ack.OK
    assert records.record(r, lua.B, "late")["run_at"] == str(MAX_MS)


#: ids another producer could send through a raw FCALL that are not UTF-8: 5.1.0 took them
#: (its id rules counted characters by their continuation bytes), and no supervisor could
#: read them: each was dropped as malformed when dequeued, handed back a reconcile later, and
#: dequeued again, for ever
NOT_UTF8 = [
    (b"\xff", 1),  # never in UTF-8
    (b"ab\xc3", 3),  # a sequence cut short
    (b"a\xc0\xafb", 2),  # an overlong '/'
    (b"\xed\xa0\x80", 1),  # a surrogate
    (b"\xf4\x90\x80\x80", 1),  # past U+10FFFF
    (b"caf\xc3\xa9\x80", 6),  # a stray continuation byte after a good 'é'
]


@pytest.mark.parametrize("bad, at", NOT_UTF8, ids=[repr(b) for b, _ in NOT_UTF8])
def test_dispatch_refuses_an_id_that_is_not_utf8(
    lua: Lua, r: redis.Redis, prefix: str, before: dict, bad: bytes, at: int
) -> None:
    message = refused(lua.dispatch, ("new", '"x"', NOW), (bad, '"x"', NOW))
    assert f"job 2 id is not UTF-8: byte {at} is 0x{bad[at - 1]:02x}" in message
    assert snapshot(r, prefix) == before


@pytest.mark.parametrize("good", ["é", "日本", "\U0001f600", "a\u00e9\u65e5\U0010fffd"])
def test_dispatch_takes_a_well_formed_utf8_id(lua: Lua, good: str) -> None:
    assert lua.add(good) == Dispatched.CREATED
    assert lua.get_job(good)["id"] == good
