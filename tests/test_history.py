"""queasy_py.history (and store/events.py): the outcome-event streams found, their ends, and
ranges read, against the real server (no Spark)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from lua_calls import NOW, Lua

from queasy_py import Client, InvalidInput
from queasy_py.history import EventStream, History


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    with Client(redis_url, workers=0, prefix=prefix) as c:
        yield c


def ended(lua: Lua, n: int, fail: bool = False) -> None:
    """n jobs dispatched, taken and finished (or failed into the fail queue)."""
    for i in range(n):
        job = lua.take(f"j{i}", now=NOW + i)
        if fail:
            lua.fail("c1", job, fail_id=f"f{i}", now=NOW + i)
        else:
            lua.finish("c1", job, now=NOW + i)


def test_streams_are_found_by_scan_with_their_fail_queues(client: Client, r: redis.Redis):
    history = History(client)
    assert history.streams() == []
    emails, other = Lua(r, client.prefix, "emails"), Lua(r, client.prefix, "a:b.c")
    ended(emails, 2, fail=True)
    ended(other, 1)
    fail_events = Lua(r, client.prefix, "emails")
    fail_events.B = emails.F  # a fail job runs too: the fail queue's stream exists
    job = fail_events.dequeue("c2", limit=1, now=NOW + 10).jobs[0]
    fail_events.finish("c2", job, now=NOW + 11)
    found = history.streams()
    assert [(s.queue, s.tag, s.ref) for s in found] == [
        ("a:b.c", "a:b.c", "a:b.c"),
        ("emails", "emails", "emails"),
        ("emails-fail", "emails", "{emails}emails-fail"),
    ]
    assert [s.queue for s in history.streams(fail_queues=False)] == ["a:b.c", "emails"]
    # by name: each queue and its fail queue, whether or not they have events
    named = history.streams(["emails", "new"])
    assert [s.key for s in named] == [
        client.queue("emails").keys.events,
        client.queue("emails").fail_queue.keys.events,
        client.queue("new").keys.events,
        client.queue("new").fail_queue.keys.events,
    ]
    with pytest.raises(InvalidInput):
        history.streams([])
    with pytest.raises(InvalidInput):
        history.streams(["bad name"])


def test_another_prefix_is_not_found(client: Client, r: redis.Redis, redis_url: str) -> None:
    ended(Lua(r, client.prefix + "x", "q"), 1)  # keys of prefix 'qt-...x'
    try:
        assert History(client).streams() == []
    finally:
        for key in r.scan_iter(match=client.prefix + "x:*"):
            r.delete(key)


def test_the_end_counts_every_entry_ever_added_and_a_trim(client: Client, r: redis.Redis):
    lua = Lua(r, client.prefix, "q")
    history = History(client)
    stream = history.stream("q")
    assert history.end(stream) == history.end(EventStream("q", "q", stream.key))
    empty = history.end(stream)
    assert (empty.last_id, empty.added, empty.length, empty.first_ordinal) == ("0-0", 0, 0, 1)
    ended(lua, 5)
    ids = [entry_id for entry_id, _ in r.xrange(stream.key)]
    end = history.end(stream)
    assert (end.last_id, end.added, end.length, end.first_ordinal) == (ids[-1], 5, 5, 1)
    r.xtrim(stream.key, maxlen=2, approximate=False)
    end = history.end(stream)
    assert (end.added, end.length, end.first_ordinal) == (5, 2, 4)
    # head: the ids after one, and the end, read at one instant
    at, after = history.head(stream, "0-0", 10)
    assert at == end and after == ids[3:]
    assert history.head(stream, ids[3], 10)[1] == ids[4:]


def test_read_gives_a_range_in_chunks_with_fields_decoded(client: Client, r: redis.Redis):
    lua = Lua(r, client.prefix, "q")
    ended(lua, 5)
    history = History(client)
    stream = history.stream("q")
    ids = [entry_id for entry_id, _ in r.xrange(stream.key)]
    chunks = list(history.read(stream, after=ids[0], until=ids[3], chunk=2))
    assert [[entry_id for entry_id, _ in chunk] for chunk in chunks] == [ids[1:3], ids[3:4]]
    fields = chunks[0][0][1]
    assert fields["outcome"] == "finished" and fields["id"] == "j1" and fields["queue"] == "q"
    assert list(history.read(stream, after=ids[-1])) == []
    assert sum(len(c) for c in history.read(stream, chunk=5)) == 5


def test_read_after_the_largest_entry_id_is_empty_even_with_an_entry_there(
    client: Client, r: redis.Redis
) -> None:
    """Nothing can follow the largest stream id: XRANGE refuses a range that starts after it
    (a raw ResponseError before). A raw XADD may write that very id (a producer with raw
    Redis access): a read that reaches it ends there."""
    lua = Lua(r, client.prefix, "q")
    ended(lua, 2)
    history = History(client)
    stream = history.stream("q")
    last = "18446744073709551615-18446744073709551615"
    assert list(history.read(stream, after=last)) == []
    r.xadd(stream.key, {"event": "finished x 1 - - 1 1 0 0 0 c"}, id=last)
    assert [len(chunk) for chunk in history.read(stream, chunk=3)] == [3]
    assert [len(chunk) for chunk in history.read(stream, chunk=1)] == [1, 1, 1]
    assert list(history.read(stream, after=last)) == []


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda h, s: h.recent(s, float("inf")), "since"),
        (lambda h, s: h.recent(s, 1e300), "since"),
        (lambda h, s: list(h.read(s, after="garbage")), "after"),
        (lambda h, s: list(h.read(s, until="1-2-3")), "until"),
        (lambda h, s: list(h.read(s, chunk=0)), "chunk"),
        (lambda h, s: list(h.read(s, chunk=True)), "chunk"),
        (lambda h, s: h.head(s, "x", 10), "after"),
        (lambda h, s: h.head(s, "0-0", -1), "count"),
    ],
    ids=[
        "since_inf",
        "since_huge",
        "read_after",
        "read_until",
        "chunk_0",
        "chunk_bool",
        "head_after",
        "head_count",
    ],
)
def test_bad_arguments_are_invalid_input_naming_them(client: Client, r: redis.Redis, call, named):
    """Each was an OverflowError, redis-py's DataError or ResponseError ('Invalid stream ID
    specified as stream command argument'), naming nothing."""
    ended(Lua(r, client.prefix, "q"), 1)
    history = History(client)
    with pytest.raises(InvalidInput, match=named):
        call(history, history.stream("q"))
